#pragma once

// SliceSync: keeps this node's pool in the API server current, on its own thread, so that no
// kubelet RPC ever waits on the API server. Nothing is written until the kubelet has said
// whether it registered the driver (SetRole): the scheduler must not allocate HCAs on a node
// whose kubelet cannot prepare them. While registered, it publishes the slices `desired` returns:
//   - at once;
//   - after Trigger() (the device list changed: hotplug, an HCA's health, which becomes a device
//     taint; or the kubelet registered the driver again: a kubelet wipes the node's slices when
//     it starts);
//   - every `resync` (someone deleted or edited our slices);
//   - after a failure, again after a back-off (1 s, doubling, capped at `resync`).
// When the kubelet refused the driver, it withdraws them (publishes none) instead. Each Publish
// gets `publish_timeout`; an exception from `desired` or the publisher is that publish's failure.
// Thread-safe.

#include <cstdint>
#include <functional>
#include <string>
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

  // What the sync does with the node's pool.
  enum class Role {
    kWaiting,   // no verdict from the kubelet yet: write nothing (the initial role)
    kPublish,   // registered: keep the pool current
    kWithdraw,  // refused: delete the node's slices of the driver
  };
  // Sets the role and publishes accordingly at once (a change of role counts as a trigger).
  void SetRole(Role role);

  // What the sync has achieved, for /metrics and /healthz.
  struct Status {
    Role role = Role::kWaiting;
    bool in_sync = false;  // the last publish of the current role succeeded
    std::uint64_t successes = 0;
    std::uint64_t failures = 0;
    std::string last_error;  // of the last failure; "" once a publish succeeded again
  };
  Status status() const;

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
  Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdp::dra
