#pragma once

// At most one run of an asynchronous operation in flight, its result shared: a caller is answered
// by the first run that starts after it asked, so that what it then reads is at least as new as
// its question; callers that ask while a run is in flight share the next run. The pod-resources
// refresh uses it, so that N container requests in one GetPreferredAllocation, the periodic
// refresh and concurrent kubelet calls make one List at a time against the kubelet's node-wide
// rate limit, never one each. Thread-safe.

#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rdp::serving {

class SingleFlight {
 public:
  using Then = std::function<void()>;
  // start(finished) begins one run and calls finished() once when it is over, on any thread (on
  // its own, before returning, when it can). A start that throws counts as a run that finished.
  using Start = std::function<void(Then finished)>;

  explicit SingleFlight(Start start);
  // Waits for the run in flight and any queued behind it (WaitIdle).
  ~SingleFlight();
  SingleFlight(const SingleFlight&) = delete;
  SingleFlight& operator=(const SingleFlight&) = delete;

  // `then` runs once a run that started after this call has finished (on the thread that
  // finished it, or on this one).
  void Request(Then then) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until no run is in flight and no `then` is running.
  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Finished() ABSL_LOCKS_EXCLUDED(mu_);

  const Start start_;
  absl::Mutex mu_;
  // A run is in flight or its callbacks are running. A CondVar, not Mutex::Await: TSan cannot
  // follow an Await condition evaluated inside Debian's uninstrumented abseil.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar idle_;  // signalled when running_ becomes false
  std::vector<Then> current_ ABSL_GUARDED_BY(mu_);  // answered by the run in flight
  std::vector<Then> next_ ABSL_GUARDED_BY(mu_);     // asked while it was in flight
};

}  // namespace rdp::serving
