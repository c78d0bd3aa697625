// SingleFlight (serving/single_flight.h): one run at a time, callers answered by a run that
// started after they asked, and an owner that may be destroyed once WaitIdle returns.

#include "serving/single_flight.h"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace rdp::serving {
namespace {

// Runs are finished by hand: each start parks its `finished` here.
class ManualRuns {
 public:
  SingleFlight::Start Starter() {
    return [this](SingleFlight::Then finished) {
      absl::MutexLock lock(&mu_);
      pending_.push_back(std::move(finished));
      ++starts_;
    };
  }
  int starts() {
    absl::MutexLock lock(&mu_);
    return starts_;
  }
  // Finishes the oldest pending run; false when none is pending.
  bool FinishOne() {
    SingleFlight::Then finished;
    {
      absl::MutexLock lock(&mu_);
      if (pending_.empty()) return false;
      finished = std::move(pending_.front());
      pending_.erase(pending_.begin());
    }
    finished();
    return true;
  }

 private:
  absl::Mutex mu_;
  std::vector<SingleFlight::Then> pending_ ABSL_GUARDED_BY(mu_);
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(SingleFlightTest, CallersDuringARunShareTheNextOne) {
  ManualRuns runs;
  SingleFlight flight(runs.Starter());
  int a = 0, b = 0, c = 0;
  flight.Request([&] { ++a; });
  EXPECT_EQ(runs.starts(), 1);
  flight.Request([&] { ++b; });  // asked during run 1: answered by run 2
  flight.Request([&] { ++c; });  // shares run 2
  EXPECT_EQ(runs.starts(), 1);
  ASSERT_TRUE(runs.FinishOne());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b + c, 0);
  EXPECT_EQ(runs.starts(), 2);
  ASSERT_TRUE(runs.FinishOne());
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 1);
  EXPECT_EQ(runs.starts(), 2);
  EXPECT_FALSE(runs.FinishOne());
}

TEST(SingleFlightTest, AStartThatThrowsCountsAsFinished) {
  int answered = 0;
  SingleFlight flight([](SingleFlight::Then) { throw std::runtime_error("no list"); });
  flight.Request([&] { ++answered; });
  flight.Request([&] { ++answered; });
  EXPECT_EQ(answered, 2);
  flight.WaitIdle();
}

TEST(SingleFlightTest, ARequestFromACallbackStartsARunAfterIt) {
  ManualRuns runs;
  SingleFlight flight(runs.Starter());
  int second = 0;
  flight.Request([&] { flight.Request([&] { ++second; }); });
  ASSERT_TRUE(runs.FinishOne());
  EXPECT_EQ(runs.starts(), 2);
  EXPECT_EQ(second, 0);
  ASSERT_TRUE(runs.FinishOne());
  EXPECT_EQ(second, 1);
}

// Regression: Finished() marked the flight idle before running the callbacks, so the
// owner's destructor (NodeState's, through WaitIdle) could return while a callback, run on the
// thread that finished the List, still read the owner. A callback that is still running must
// keep WaitIdle from returning. The callback is held until the destroying thread either
// returned (the defect) or has had a second to do so; with the fix it cannot return before the
// callback ends, whatever the timing.
TEST(SingleFlightTest, DestructionWaitsForARunningCallback) {
  absl::Notification in_callback, destroyed;
  std::atomic<bool> destroyed_while_in_callback{false};
  SingleFlight::Then finish;
  auto flight = std::make_unique<SingleFlight>([&](SingleFlight::Then f) { finish = f; });
  flight->Request([&] {
    in_callback.Notify();
    destroyed.WaitForNotificationWithTimeout(absl::Seconds(1));
    destroyed_while_in_callback = destroyed.HasBeenNotified();
  });
  std::thread finisher([&] { finish(); });
  in_callback.WaitForNotification();
  std::thread destroyer([&] {
    flight.reset();
    destroyed.Notify();
  });
  finisher.join();
  destroyer.join();
  EXPECT_FALSE(destroyed_while_in_callback.load());
}

}  // namespace
}  // namespace rdp::serving
