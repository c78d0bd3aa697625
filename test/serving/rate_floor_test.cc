// RateFloor (serving/rate_floor.h) on a fake clock and a fake timer: a burst goes at once, then
// one pass per 1/rate, a pass that waits goes on the timer (never on the caller's thread),
// Stop lets every waiting pass go; and as SingleFlight's gate, the callers that ask while a run
// waits at the floor share that run. No sleeps, no timing asserted.

#include "serving/rate_floor.h"

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "serving/single_flight.h"

namespace rdp::serving {
namespace {

// A clock that moves only when a timer set on it fires (FireNext).
class FakeTimers {
 public:
  RateFloor::Options Options(double per_second, int burst) {
    RateFloor::Options o;
    o.per_second = per_second;
    o.burst = burst;
    o.now = [this] {
      absl::MutexLock lock(&mu_);
      return now_;
    };
    o.after = [this](absl::Duration delay, std::function<void()> fn) {
      absl::MutexLock lock(&mu_);
      timers_.push_back({now_ + delay, std::move(fn)});
    };
    return o;
  }
  // Moves the clock to the earliest timer and runs it; false when none is set.
  bool FireNext() {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      if (timers_.empty()) return false;
      auto first = timers_.begin();
      for (auto t = timers_.begin(); t != timers_.end(); ++t) {
        if (t->first < first->first) first = t;
      }
      now_ = std::max(now_, first->first);
      fn = std::move(first->second);
      timers_.erase(first);
    }
    fn();
    return true;
  }
  void SetBack(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ -= d;
  }
  int pending() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(timers_.size());
  }
  absl::Time now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'000'000);
  std::vector<std::pair<absl::Time, std::function<void()>>> timers_ ABSL_GUARDED_BY(mu_);
};

TEST(RateFloorTest, ABurstGoesAtOnceThenOnePerInterval) {
  FakeTimers timers;
  auto floor = RateFloor::Make(timers.Options(20, 5));
  const absl::Time start = timers.now();
  int went = 0;
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(floor->Pass([&] { ++went; }));
  EXPECT_EQ(went, 5);
  EXPECT_EQ(timers.pending(), 0);
  EXPECT_TRUE(floor->Pass([&] { ++went; }));  // no token: on the timer
  EXPECT_TRUE(floor->Pass([&] { ++went; }));  // behind it, on the same timer
  EXPECT_EQ(went, 5);
  EXPECT_EQ(timers.pending(), 1);
  ASSERT_TRUE(timers.FireNext());
  EXPECT_EQ(went, 6);
  EXPECT_EQ(timers.now() - start, absl::Milliseconds(50));
  ASSERT_TRUE(timers.FireNext());
  EXPECT_EQ(went, 7);
  EXPECT_EQ(timers.now() - start, absl::Milliseconds(100));
  EXPECT_FALSE(timers.FireNext());
}

// Over any run of passes, at most burst + rate x elapsed went.
TEST(RateFloorTest, SustainedPassesStayUnderTheRate) {
  FakeTimers timers;
  auto floor = RateFloor::Make(timers.Options(20, 5));
  const absl::Time start = timers.now();
  int went = 0;
  for (int i = 0; i < 200; ++i) {
    floor->Pass([&] { ++went; });
    while (timers.FireNext()) {
    }
    const double bound = 5 + 20 * absl::ToDoubleSeconds(timers.now() - start);
    ASSERT_LE(went, bound + 1e-6) << "pass " << i;
  }
  EXPECT_EQ(went, 200);
  EXPECT_EQ(timers.now() - start, absl::Milliseconds(50) * 195);
}

TEST(RateFloorTest, StopLetsTheWaitingGoAndEveryLaterOne) {
  FakeTimers timers;
  auto floor = RateFloor::Make(timers.Options(20, 1));
  int went = 0;
  EXPECT_FALSE(floor->Pass([&] { ++went; }));
  EXPECT_TRUE(floor->Pass([&] { ++went; }));
  floor->Stop();
  EXPECT_EQ(went, 2);
  EXPECT_FALSE(floor->Pass([&] { ++went; }));
  EXPECT_EQ(went, 3);
  ASSERT_TRUE(timers.FireNext());  // the old timer finds nothing waiting
  EXPECT_EQ(went, 3);
}

// The wall clock set back an hour: the floor counts from the new time on, and the pass that
// waits goes one interval later, not an hour later.
TEST(RateFloorTest, AClockSetBackDoesNotHoldPasses) {
  FakeTimers timers;
  auto floor = RateFloor::Make(timers.Options(20, 1));
  int went = 0;
  EXPECT_FALSE(floor->Pass([&] { ++went; }));
  timers.SetBack(absl::Hours(1));
  EXPECT_TRUE(floor->Pass([&] { ++went; }));
  ASSERT_TRUE(timers.FireNext());
  EXPECT_EQ(went, 2);
  EXPECT_EQ(timers.pending(), 0);
}

// A timer that fires after the floor is gone does nothing.
TEST(RateFloorTest, ATimerAfterTheFloorIsGoneDoesNothing) {
  FakeTimers timers;
  int went = 0;
  {
    auto floor = RateFloor::Make(timers.Options(20, 1));
    floor->Pass([&] { ++went; });
    floor->Pass([&] { ++went; });
  }
  ASSERT_TRUE(timers.FireNext());
  EXPECT_EQ(went, 1);
}

// As SingleFlight's gate: a run waiting at the floor has not started, so the callers that ask
// meanwhile join it (one run for all of them), and each is answered by a run that started after
// it asked.
TEST(RateFloorTest, CallersShareTheRunThatWaitsAtTheFloor) {
  FakeTimers timers;
  auto floor = RateFloor::Make(timers.Options(20, 1));
  int starts = 0;
  std::vector<int> answered_by;  // for each caller, the run that answered it
  SingleFlight flight(
      [&](SingleFlight::Then finished) {
        ++starts;
        finished();
      },
      [&](SingleFlight::Then go) { floor->Pass(std::move(go)); });
  flight.Request([&] { answered_by.push_back(starts); });  // the token: run 1 at once
  EXPECT_EQ(starts, 1);
  std::vector<int> asked_after;
  for (int i = 0; i < 4; ++i) {
    asked_after.push_back(starts);
    flight.Request([&] { answered_by.push_back(starts); });
  }
  EXPECT_EQ(starts, 1) << "a run started without a token";
  ASSERT_TRUE(timers.FireNext());
  EXPECT_EQ(starts, 2) << "the callers that waited did not share one run";
  ASSERT_EQ(answered_by.size(), 5u);
  for (int i = 0; i < 4; ++i) EXPECT_GT(answered_by[1 + i], asked_after[i]);
  flight.WaitIdle();
}

}  // namespace
}  // namespace rdp::serving
