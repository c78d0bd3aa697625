#pragma once

// At most one run of an asynchronous operation in flight, its result shared: a caller is answered
// by the first run that starts after it asked, so that what it then reads is at least as new as
// its question; callers that ask while a run is in flight share the next run. The pod-resources
// refresh uses it, so that N container requests in one GetPreferredAllocation, the periodic
// refresh and concurrent kubelet calls make one List at a time against the kubelet's node-wide
// rate limit, never one each. An optional gate holds each run back until it lets it start (the
// pod-resources rate floor, serving/rate_floor.h): callers that ask while a run waits at the gate
// join that run, since it has not started yet. Thread-safe.

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
  // gate(go) is called before each run; the run starts when go() is called, once, on any thread
  // (on this one, before gate returns, when it can). A gate that throws lets the run start.
  using Gate = std::function<void(Then go)>;

  // Null gate: every run starts at once.
  explicit SingleFlight(Start start, Gate gate = nullptr);
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
  void AtGate() ABSL_LOCKS_EXCLUDED(mu_);  // the next run waits for the gate
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Finished() ABSL_LOCKS_EXCLUDED(mu_);

  const Start start_;
  const Gate gate_;
  absl::Mutex mu_;
  // A run is in flight or its callbacks are running. A CondVar, not Mutex::Await: TSan cannot
  // follow an Await condition evaluated inside Debian's uninstrumented abseil.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // the run of current_ has passed the gate
  absl::CondVar idle_;  // signalled when running_ becomes false
  // Answered by the run at the gate or in flight: asked before it started.
  std::vector<Then> current_ ABSL_GUARDED_BY(mu_);
  std::vector<Then> next_ ABSL_GUARDED_BY(mu_);  // asked after it started
};

}  // namespace rdp::serving
