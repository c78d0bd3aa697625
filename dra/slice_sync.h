#pragma once

// SliceSync: keeps this node's pool in the API server current, on its own thread, so that no
// kubelet RPC ever waits on the API server. It publishes the slices `desired` returns:
//   - at Start;
//   - after Trigger() (the device list changed: hotplug, an HCA's health, which becomes a device
//     taint; or the kubelet registered the driver again: a kubelet wipes the node's slices when
//     it starts);
//   - every `resync` (someone deleted or edited our slices);
//   - after a failure, again after a back-off (1 s, doubling, capped at `resync`).
// Each Publish gets `publish_timeout`. Thread-safe.

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dra/model.h"
#include "nlohmann/json.hpp"

namespace rdp::dra {

class SliceSync {
 public:
  struct Options {
    absl::Duration resync = absl::Seconds(30);
    absl::Duration publish_timeout = absl::Seconds(10);
    absl::Duration first_backoff = absl::Seconds(1);
  };
  // `publisher` must outlive this object; `desired` is called on the sync thread.
  SliceSync(SlicePublisher& publisher, std::function<std::vector<nlohmann::json>()> desired,
            Options options);
  ~SliceSync();  // Stop()
  SliceSync(const SliceSync&) = delete;
  SliceSync& operator=(const SliceSync&) = delete;

  void Start();
  // Asks for a publish as soon as the thread is free; calls made while one runs coalesce into one
  // more. Never blocks on the API server.
  void Trigger();
  // Ends the thread after the publish in flight (bounded by publish_timeout).
  void Stop();

  // Publishes that succeeded / failed so far (tests and logs).
  std::uint64_t successes() const;
  std::uint64_t failures() const;

 private:
  void Run();

  SlicePublisher& publisher_;
  const std::function<std::vector<nlohmann::json>()> desired_;
  const Options options_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // Trigger, Stop
  bool pending_ ABSL_GUARDED_BY(mu_) = true;  // the first publish
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::uint64_t successes_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rdp::dra
