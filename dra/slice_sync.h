#pragma once

// SliceSync: keeps this node's pool in the API server current, on its own thread, so that no
// kubelet RPC ever waits on the API server. Nothing is written until the kubelet has said
// whether it registered the driver (SetRole): the scheduler must not allocate HCAs on a node
// whose kubelet cannot prepare them. While registered, it publishes the slices `desired` returns:
//   - at once;
//   - after Trigger() (the device list changed: hotplug, an HCA's health, which becomes a device
//     taint; or the kubelet registered the driver again: a kubelet wipes the node's slices when
//     it starts);
//   - when the publisher's watch (SlicePublisher::Watch) says someone edited or deleted our
//     slices; while no watch is up (it failed, or the publisher cannot watch), every `resync`
//     (the first one a `resync` after the watch failed: the watch, when back, goes on from its
//     last event, and a lost history (410 Gone) publishes at once);
//   - after a failure, again after a back-off: drawn from [b/2, b], b = 1 s doubling up to
//     `max_backoff`, so that nodes an API server outage failed together do not retry together.
// The watch runs on a thread of its own from the first successful publish on, and is started
// again after the same jittered back-off when it fails; once it is up again after failing, the
// sync logs "in sync with the API server again".
// When the kubelet refused the driver, it withdraws them (publishes none) instead. Each Publish
// gets `publish_timeout`; an exception from `desired` or the publisher is that publish's failure.
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <random>
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
    absl::Duration max_backoff = absl::Seconds(30);
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
    std::uint64_t successes = 0;  // publishes (withdrawals included) that succeeded so far
    std::uint64_t failures = 0;   // and that failed
    std::string last_error;  // of the last failure; "" once a publish succeeded again
    bool watching = false;   // the publisher's watch is up
    std::uint64_t watch_failures = 0;
  };
  Status status() const;

  void Start();
  // Asks for a publish as soon as the thread is free; calls made while one runs coalesce into one
  // more. Never blocks on the API server.
  void Trigger();
  // Ends the thread after the publish in flight (bounded by publish_timeout).
  void Stop();

 private:
  void Run();
  void WatchLoop();
  // `b` scaled by a factor drawn from [0.5, 1].
  absl::Duration Jittered(absl::Duration b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SlicePublisher& publisher_;
  const std::function<std::vector<nlohmann::json>()> desired_;
  const Options options_;
  std::thread thread_;
  std::thread watch_thread_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // Trigger, Stop
  bool pending_ ABSL_GUARDED_BY(mu_) = true;  // the first publish
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
  // When to publish without a trigger while no watch is up (after a failure: the back-off).
  absl::Time resync_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::atomic<bool> stop_watch_{false};
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){std::random_device()()};
};

}  // namespace rdp::dra
