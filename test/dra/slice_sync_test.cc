#include "dra/slice_sync.h"

#include <atomic>
#include <deque>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace rdp::dra {
namespace {

// Records every Publish; answers from a script (then OK).
class FakePublisher : public SlicePublisher {
 public:
  absl::Status Publish(const std::vector<nlohmann::json>& slices, absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back(slices);
    called_.SignalAll();
    deadlines_ok_ = deadlines_ok_ && deadline > absl::Now();
    if (script_.empty()) return absl::OkStatus();
    absl::Status s = script_.front();
    script_.pop_front();
    return s;
  }
  // A watch: up (on_open) until cancelled or told to end with a status; reports a change when
  // told. Unimplemented unless EnableWatch was called, as a publisher that cannot watch.
  absl::Status Watch(const std::function<bool()>& cancelled, const std::function<void()>& on_open,
                     const std::function<void()>& changed) override {
    {
      absl::MutexLock lock(&mu_);
      if (!watch_) return absl::UnimplementedError("no watch");
      ++watches_;
      watch_end_ = absl::OkStatus();
      watch_ended_ = false;
    }
    on_open();
    absl::MutexLock lock(&mu_);
    ++opened_;
    called_.SignalAll();
    while (!cancelled() && !watch_ended_) {
      if (change_) {
        change_ = false;
        mu_.Unlock();
        changed();
        mu_.Lock();
      }
      called_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
    }
    return watch_ended_ ? watch_end_ : absl::CancelledError("cancelled");
  }
  void EnableWatch() {
    absl::MutexLock lock(&mu_);
    watch_ = true;
  }
  void ReportChange() {
    absl::MutexLock lock(&mu_);
    change_ = true;
    called_.SignalAll();
  }
  void EndWatch(absl::Status s) {
    absl::MutexLock lock(&mu_);
    watch_end_ = s;
    watch_ended_ = true;
    called_.SignalAll();
  }
  // Waits (bounded) until the watch was opened n times; how often it was.
  int WaitOpened(int n) {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (opened_ < n && absl::Now() < deadline) called_.WaitWithDeadline(&mu_, deadline);
    return opened_;
  }

  void Script(std::deque<absl::Status> s) {
    absl::MutexLock lock(&mu_);
    script_ = std::move(s);
  }
  // Waits (bounded) until at least n calls were made; the calls so far.
  std::vector<std::vector<nlohmann::json>> WaitCalls(std::size_t n) {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (calls_.size() < n && absl::Now() < deadline) called_.WaitWithDeadline(&mu_, deadline);
    return calls_;
  }
  bool deadlines_ok() {
    absl::MutexLock lock(&mu_);
    return deadlines_ok_;
  }

 private:
  absl::Mutex mu_;
  absl::CondVar called_;
  std::vector<std::vector<nlohmann::json>> calls_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> script_ ABSL_GUARDED_BY(mu_);
  bool deadlines_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool watch_ ABSL_GUARDED_BY(mu_) = false;
  bool change_ ABSL_GUARDED_BY(mu_) = false;
  bool watch_ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status watch_end_ ABSL_GUARDED_BY(mu_);
  int watches_ ABSL_GUARDED_BY(mu_) = 0;
  int opened_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(DRASliceSyncTest, PublishesAtStartAndAfterEachTrigger) {
  FakePublisher publisher;
  absl::Mutex mu;
  int version = 0;
  SliceSync sync(publisher, [&] {
    absl::MutexLock lock(&mu);
    return std::vector<nlohmann::json>{{{"version", version}}};
  }, {absl::Hours(1), absl::Seconds(5), absl::Seconds(1)});
  sync.Start();
  sync.SetRole(SliceSync::Role::kPublish);
  auto calls = publisher.WaitCalls(1);
  ASSERT_GE(calls.size(), 1u);
  EXPECT_EQ(calls[0][0]["version"], 0);
  {
    absl::MutexLock lock(&mu);
    version = 1;
  }
  sync.Trigger();
  calls = publisher.WaitCalls(2);
  ASSERT_EQ(calls.size(), 2u);  // resync is an hour away: nothing else publishes
  EXPECT_EQ(calls[1][0]["version"], 1);
  EXPECT_TRUE(publisher.deadlines_ok());
  sync.Stop();
  EXPECT_EQ(sync.status().successes, 2u);
  EXPECT_EQ(sync.status().failures, 0u);
}

TEST(DRASliceSyncTest, RetriesAfterAFailureWithoutATrigger) {
  FakePublisher publisher;
  publisher.Script({absl::UnavailableError("api server down"), absl::UnavailableError("still")});
  SliceSync sync(publisher, [] { return std::vector<nlohmann::json>{}; },
                 {absl::Hours(1), absl::Seconds(5), absl::Milliseconds(1)});
  sync.Start();
  sync.SetRole(SliceSync::Role::kPublish);
  publisher.WaitCalls(3);
  sync.Stop();
  EXPECT_EQ(sync.status().failures, 2u);
  EXPECT_EQ(sync.status().successes, 1u);
}

TEST(DRASliceSyncTest, ResyncsPeriodically) {
  FakePublisher publisher;
  SliceSync sync(publisher, [] { return std::vector<nlohmann::json>{}; },
                 {absl::Milliseconds(1), absl::Seconds(5), absl::Seconds(1)});
  sync.SetRole(SliceSync::Role::kPublish);
  sync.Start();
  EXPECT_GE(publisher.WaitCalls(3).size(), 3u);
  sync.Stop();
}

TEST(DRASliceSyncTest, StopWithoutStartAndTwice) {
  FakePublisher publisher;
  SliceSync sync(publisher, [] { return std::vector<nlohmann::json>{}; }, {});
  sync.Stop();
  sync.Stop();
  EXPECT_EQ(sync.status().successes, 0u);
}


// Nothing is written before the kubelet's verdict; registered: the pool; refused: none (the
// node's slices deleted); registered again: the pool again. The role is what /healthz reads.
TEST(DRASliceSyncTest, PublishesOnlyWhileRegisteredAndWithdrawsWhenRefused) {
  FakePublisher publisher;
  SliceSync sync(publisher, [] { return std::vector<nlohmann::json>{{{"name", "s"}}}; },
                 {absl::Hours(1), absl::Seconds(5), absl::Seconds(1)});
  sync.Start();
  sync.Trigger();  // a hotplug before any verdict: still nothing
  EXPECT_EQ(sync.status().role, SliceSync::Role::kWaiting);
  EXPECT_FALSE(sync.status().in_sync);
  sync.SetRole(SliceSync::Role::kPublish);
  auto calls = publisher.WaitCalls(1);
  ASSERT_EQ(calls.size(), 1u);  // the first call is the publish: nothing before it
  EXPECT_EQ(calls[0].size(), 1u);
  sync.SetRole(SliceSync::Role::kWithdraw);
  calls = publisher.WaitCalls(2);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(calls[1].empty());
  sync.SetRole(SliceSync::Role::kPublish);
  calls = publisher.WaitCalls(3);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[2].size(), 1u);
  sync.Stop();
}

// A publisher (or `desired`) that throws fails that publish; the thread, and the process, go on.
TEST(DRASliceSyncTest, AThrowIsAFailureNotTheEndOfTheProcess) {
  FakePublisher publisher;
  std::atomic<int> calls{0};
  SliceSync sync(publisher, [&calls]() -> std::vector<nlohmann::json> {
    if (calls.fetch_add(1) == 0) {
      // What a name read from sysfs that is not UTF-8 makes nlohmann's dump() do.
      nlohmann::json bad = std::string("mlx5_\xff");
      (void)bad.dump();
    }
    return {};
  }, {absl::Hours(1), absl::Seconds(5), absl::Milliseconds(1)});
  sync.Start();
  sync.SetRole(SliceSync::Role::kPublish);
  publisher.WaitCalls(1);  // the second try, after the first threw
  sync.Stop();
  EXPECT_EQ(sync.status().failures, 1u);
  EXPECT_EQ(sync.status().successes, 1u);
  EXPECT_TRUE(sync.status().in_sync);
}

// The watch starts after the first publish; a change it reports publishes again; a watch that
// fails is started again after a back-off, without a publish (it goes on from its last event);
// one whose history is lost (Aborted: 410 Gone) publishes, then watches again.
TEST(DRASliceSyncTest, TheWatchSaysWhenToPublish) {
  FakePublisher publisher;
  publisher.EnableWatch();
  SliceSync sync(publisher, [] { return std::vector<nlohmann::json>{}; },
                 {absl::Hours(1), absl::Seconds(5), absl::Milliseconds(1), absl::Milliseconds(2)});
  sync.Start();
  sync.SetRole(SliceSync::Role::kPublish);
  ASSERT_EQ(publisher.WaitOpened(1), 1);
  EXPECT_EQ(publisher.WaitCalls(1).size(), 1u);
  EXPECT_TRUE(sync.status().watching);
  publisher.ReportChange();
  EXPECT_EQ(publisher.WaitCalls(2).size(), 2u);
  publisher.EndWatch(absl::UnavailableError("connection reset"));
  EXPECT_EQ(publisher.WaitOpened(2), 2);
  EXPECT_EQ(sync.status().watch_failures, 1u);
  EXPECT_EQ(sync.status().successes, 2u) << "the resync is an hour away: no publish for a reset";
  publisher.EndWatch(absl::AbortedError("410 Gone: too old resource version"));
  EXPECT_EQ(publisher.WaitCalls(3).size(), 3u);
  EXPECT_EQ(publisher.WaitOpened(3), 3);
  sync.Stop();
}

}  // namespace
}  // namespace rdp::dra
