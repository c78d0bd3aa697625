// FatalLatch (serving/fatal_latch.h): the first error of a background thread ends Wait with it;
// a stop signal ends it with OK.

#include "serving/fatal_latch.h"

#include <unistd.h>

#include <thread>

#include "gtest/gtest.h"
#include "serving/event_fd.h"

namespace rdp::serving {
namespace {

TEST(FatalLatchTest, TheFirstErrorWakesWait) {
  FatalLatch latch;
  ASSERT_TRUE(latch.ok());
  const int stop = NewEventFd();
  ASSERT_GE(stop, 0);
  std::thread raiser([&] {
    EXPECT_TRUE(latch.Raise(absl::InternalError("the health thread failed")));
    EXPECT_FALSE(latch.Raise(absl::InternalError("a second failure")));
  });
  const absl::Status got = latch.Wait(stop);
  raiser.join();
  EXPECT_EQ(got, absl::InternalError("the health thread failed"));
  ::close(stop);
}

TEST(FatalLatchTest, AStopEndsWaitWithOk) {
  FatalLatch latch;
  const int stop = NewEventFd();
  ASSERT_GE(stop, 0);
  SignalEventFd(stop);
  EXPECT_TRUE(latch.Wait(stop).ok());
  ::close(stop);
}

}  // namespace
}  // namespace rdp::serving
