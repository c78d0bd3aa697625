#pragma once

// A floor under the rate of an operation whose budget is shared with others: a token bucket
// (`per_second` sustained, `burst` at once). A pass that finds no token waits for one on a timer,
// never on the caller's thread: nothing blocks and nothing sleeps. The pod-resources List uses it
// as SingleFlight's gate, so that a local client looping on GetPreferredAllocation cannot take
// the kubelet's node-wide pod-resources budget (100/s, burst 10) from the other agents of the
// node; the callers that ask meanwhile share the List that waits. Thread-safe.

#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rdp::serving {

// Runs `fn` once, on another thread, when `delay` has passed. Tests give a fake clock's.
using After = std::function<void(absl::Duration delay, std::function<void()> fn)>;
// A grpc::Alarm on gRPC's timer threads.
After AlarmAfter();

class RateFloor : public std::enable_shared_from_this<RateFloor> {
 public:
  struct Options {
    double per_second = 20;  // sustained; <= 0: no floor (every pass goes at once)
    int burst = 5;           // passes at once after a quiet time (at least 1)
    std::function<absl::Time()> now = [] { return absl::Now(); };
    After after;  // null: AlarmAfter()
  };
  // Shared: each timer holds the floor weakly, so that one firing after the owner has gone
  // does nothing.
  static std::shared_ptr<RateFloor> Make(Options options);

  // `go` runs once, after taking a token: on this thread before Pass returns when one is there
  // (returns false), else on the timer's thread when one is (returns true: delayed). Passes that
  // wait go in the order they came.
  bool Pass(std::function<void()> go) ABSL_LOCKS_EXCLUDED(mu_);
  // Shutdown: every pass waiting goes at once, and every later one does too.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit RateFloor(Options options);
  // Takes a token at `now`; when none is there, returns how long until one is.
  absl::Duration Take(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On the timer: lets the waiting passes that get a token go; sets the timer again for the rest.
  void Release() ABSL_LOCKS_EXCLUDED(mu_);
  void SetTimer(absl::Duration delay);

  const Options options_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // tokens_ as of then
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // In the order they came; while not empty, one timer is set (or the floor is stopped).
  std::deque<std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdp::serving
