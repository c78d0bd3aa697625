// Prepare under load: concurrent calls read the API server in parallel, and a call's deadline
// covers its own reads, not the time it spends behind other calls. No test here sleeps: API
// latency is counted on a fake clock that moves only when the readers let it.

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "dra/cdi.h"
#include "test/dra/dra_node.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::Dev;
using testing::kDriver;
using testing::kHca0;
using testing::kHca1;
using testing::kUid1;
using testing::kUid2;
using testing::SpecEnv;

constexpr absl::Duration kWait = absl::Seconds(10);  // a real-time bound on every wait

// An API server over `objects` that answers each read 400 ms after it came, on a fake clock
// (Now) that moves only here, one round at a time: when every caller still at work (SetCallers,
// Left) waits in a read, 400 ms pass and all of those reads are answered together, since they
// were in flight at once. A read that waits kWait of real time without that happening means the
// callers are not all reading (some wait for something else): from then on (serialised) each
// read is answered on its own, 400 ms passing for each, as reads made one at a time would see.
// A read answered after its deadline fails as the API client's would.
class SlowApi : public ClaimReader {
 public:
  static constexpr absl::Duration kLatency = absl::Milliseconds(400);

  explicit SlowApi(ClaimReader& objects) : objects_(objects) {}

  absl::StatusOr<ClaimAllocation> Read(const ClaimRef& ref, const std::string& driver,
                                       absl::Time deadline) override {
    if (absl::Status s = Answered(deadline); !s.ok()) return s;
    return objects_.Read(ref, driver, deadline);
  }
  absl::StatusOr<PodClaims> ReadPod(const PodRef& pod, absl::Time deadline) override {
    if (absl::Status s = Answered(deadline); !s.ok()) return s;
    return objects_.ReadPod(pod, deadline);
  }

  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void SetCallers(int n) {
    absl::MutexLock lock(&mu_);
    callers_ = n;
  }
  // A caller is done: the others may all be reading now.
  void Left() {
    absl::MutexLock lock(&mu_);
    --callers_;
    MaybeAnswerAll();
  }
  // Rounds of reads answered together, and whether the server fell back to one read at a time.
  int rounds() const {
    absl::MutexLock lock(&mu_);
    return rounds_;
  }
  bool serialised() const {
    absl::MutexLock lock(&mu_);
    return serialised_;
  }

 private:
  // Waits until the read is answered: OK, or DeadlineExceeded when that is after `deadline`.
  absl::Status Answered(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const int round = rounds_;
    ++waiting_;
    MaybeAnswerAll();
    const absl::Time give_up = absl::Now() + kWait;
    while (!serialised_ && rounds_ == round) {
      if (answered_.WaitWithDeadline(&mu_, give_up)) break;
    }
    if (rounds_ == round) {  // not answered with the others: on its own
      serialised_ = true;
      --waiting_;
      now_ += kLatency;
    }
    if (now_ > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "answered ", absl::FormatDuration(now_ - deadline), " after the deadline"));
    }
    return absl::OkStatus();
  }
  void MaybeAnswerAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (waiting_ == 0 || waiting_ < callers_) return;
    now_ += kLatency;
    ++rounds_;
    waiting_ = 0;
    answered_.SignalAll();
  }

  ClaimReader& objects_;
  mutable absl::Mutex mu_;
  absl::CondVar answered_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1700000000);
  int callers_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int rounds_ ABSL_GUARDED_BY(mu_) = 0;
  bool serialised_ ABSL_GUARDED_BY(mu_) = false;
};

// Forwards to `objects`, but each read of the pod named by Hold waits (inside the read) until
// Pass lets that one read through, or Release opens the gate for good.
class GatedReader : public ClaimReader {
 public:
  explicit GatedReader(ClaimReader& objects) : objects_(objects) {}

  absl::StatusOr<ClaimAllocation> Read(const ClaimRef& ref, const std::string& driver,
                                       absl::Time deadline) override {
    return objects_.Read(ref, driver, deadline);
  }
  absl::StatusOr<PodClaims> ReadPod(const PodRef& pod, absl::Time deadline) override {
    {
      absl::MutexLock lock(&mu_);
      if (pod.uid == held_) {
        ++held_reads_;
        ++waiting_;
        changed_.SignalAll();
        const absl::Time give_up = absl::Now() + kWait;
        while (!released_ && passes_ == 0 && !changed_.WaitWithDeadline(&mu_, give_up)) {
        }
        if (!released_ && passes_ > 0) --passes_;
        --waiting_;
        changed_.SignalAll();
      }
    }
    return objects_.ReadPod(pod, deadline);
  }
  void Hold(const std::string& pod_uid) {
    absl::MutexLock lock(&mu_);
    held_ = pod_uid;
  }
  // Whether a read waits in the gate (not one already let through), within kWait.
  bool WaitHeld() {
    absl::MutexLock lock(&mu_);
    const absl::Time give_up = absl::Now() + kWait;
    while (!(waiting_ > 0 && passes_ == 0) && !changed_.WaitWithDeadline(&mu_, give_up)) {
    }
    return waiting_ > 0 && passes_ == 0;
  }
  void Pass() {
    absl::MutexLock lock(&mu_);
    ++passes_;
    changed_.SignalAll();
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
    changed_.SignalAll();
  }
  // Reads of the held pod so far.
  int held_reads() {
    absl::MutexLock lock(&mu_);
    return held_reads_;
  }

 private:
  ClaimReader& objects_;
  absl::Mutex mu_;
  absl::CondVar changed_;  // a read came to the gate or left it, Pass, Release
  std::string held_ ABSL_GUARDED_BY(mu_);
  int held_reads_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int passes_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// 20 pods' claims prepared at once (20 calls, as the kubelet makes them) against an API server
// that answers every read in 400 ms, with the default 10 s for a call's reads: every claim is
// prepared, with its pod read (the common variables set). Each call reads its claim and its pod;
// the reads of all calls are in flight together (two rounds, 800 ms). When the reads of one call
// waited for another's (one lock held over them) and the deadline ran from the call's start,
// the calls behind the 13th failed: 20 x 800 ms is 16 s.
TEST(DRAPrepareLoadTest, TwentyClaimsAtOnceAgainstASlowApiServerAllSucceed) {
  constexpr int kClaims = 20;
  DraNode n;
  SlowApi api(n.reader());
  n.SetReader(&api);
  n.Configure([&api](DriverConfig& c) {
    c.api_timeout = DriverConfig().api_timeout;  // the default: 10 s
    c.now = [&api] { return api.Now(); };
  });
  n.NewDriver();
  std::vector<ClaimRef> claims;
  for (int i = 0; i < kClaims; ++i) {
    const ClaimRef ref{"ns", absl::StrFormat("0c1a1e00-0000-4000-8000-0000000001%02d", i),
                       absl::StrCat("claim-", i)};
    n.reader().Set(ref.uid, std::vector<AllocatedDevice>{Dev(i % 2 == 0 ? kHca0 : kHca1)});
    claims.push_back(ref);
  }
  api.SetCallers(kClaims);
  std::vector<absl::StatusOr<std::vector<PreparedDevice>>> out(kClaims);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClaims; ++i) {
    threads.emplace_back([&, i] {
      out[i] = n.driver().Prepare({claims[i]}).at(claims[i].uid);
      api.Left();
    });
  }
  for (std::thread& t : threads) t.join();
  int failed = 0;
  for (int i = 0; i < kClaims; ++i) {
    if (!out[i].ok()) {
      ++failed;
      ADD_FAILURE() << claims[i].name << ": " << out[i].status();
      continue;
    }
    EXPECT_EQ(SpecEnv(n, claims[i].uid).count("NCCL_IB_HCA"), 1u)
        << claims[i].name << ": its pod was not read in time";
  }
  EXPECT_EQ(failed, 0);
  EXPECT_FALSE(api.serialised()) << "the calls' reads were not all in flight at once";
  EXPECT_EQ(api.rounds(), 2);
  EXPECT_EQ(n.reader().reads(), kClaims);
  EXPECT_EQ(n.reader().pod_reads(), kClaims);
}

// Claim "shared" (mlx5_0) is read for pod "first" alone; while that call reads the pod, pod
// "second", whose container uses "shared" and "own" (mlx5_1), is admitted and "own" is prepared
// by another call, which does not wait for the first: "own" names both HCAs, and "shared",
// committed after it, sets no common variables (naming mlx5_0 alone, they would win over "own"'s
// in that container), as when "shared" was prepared first and then withdrawn.
TEST(DRAPrepareLoadTest, AClaimDecidedAfterAnotherCallCommittedTakesInItsHolders) {
  DraNode n;
  GatedReader gate(n.reader());
  n.SetReader(&gate);
  n.NewDriver();
  const PodRef first{"ns", "first", "pod-1"};
  const PodRef second{"ns", "second", "pod-2"};
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().SetName(kUid1, "shared");
  n.reader().SetReserved(kUid1, {first});
  n.reader().SetPod({first, {{"c", {{"shared", ""}}}}});
  gate.Hold(first.uid);
  absl::StatusOr<std::vector<PreparedDevice>> shared;
  std::thread reading([&] { shared = n.driver().Prepare({{"ns", kUid1, "shared"}}).at(kUid1); });
  ASSERT_TRUE(gate.WaitHeld()) << "the first call never read its pod";

  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca1)});
  n.reader().SetName(kUid2, "own");
  n.reader().SetReserved(kUid1, {first, second});
  n.reader().SetReserved(kUid2, {second});
  n.reader().SetPod({second, {{"c", {{"shared", ""}, {"own", ""}}}}});
  absl::Notification own_done;
  absl::StatusOr<std::vector<PreparedDevice>> own;
  std::thread other([&] {
    own = n.driver().Prepare({{"ns", kUid2, "own"}}).at(kUid2);
    own_done.Notify();
  });
  const bool in_parallel = own_done.WaitForNotificationWithTimeout(kWait);
  gate.Release();
  other.join();
  reading.join();
  EXPECT_TRUE(in_parallel) << "the second call waited for the first call's reads";
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(SpecEnv(n, kUid2).at("NCCL_IB_HCA"), "=mlx5_0,mlx5_1");
  EXPECT_EQ(SpecEnv(n, kUid1).count("NCCL_IB_HCA"), 0u);
  EXPECT_TRUE(n.driver().Prepared().at(kUid1).common.empty());
}

// Claim "shared" (mlx5_0) is prepared for pod "first"; during each of that call's first
// `commits` reads of pod "first", a pod whose container "a" uses "shared" (alone, as in "first")
// and whose container "b" uses a claim of its own (mlx5_1) is admitted and that claim prepared by
// another call. Returns how often pod "first" was read, and "shared" as prepared.
std::pair<int, PreparedClaim> PrepareSharedWhileOthersCommit(int commits) {
  DraNode n;
  GatedReader gate(n.reader());
  n.SetReader(&gate);
  n.NewDriver();
  const PodRef first{"ns", "first", "pod-1"};
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().SetName(kUid1, "shared");
  std::vector<PodRef> holders = {first};
  n.reader().SetReserved(kUid1, holders);
  n.reader().SetPod({first, {{"c", {{"shared", ""}}}}});
  gate.Hold(first.uid);
  absl::StatusOr<std::vector<PreparedDevice>> shared;
  std::thread reading([&] { shared = n.driver().Prepare({{"ns", kUid1, "shared"}}).at(kUid1); });
  for (int i = 0; i < commits; ++i) {
    EXPECT_TRUE(gate.WaitHeld()) << "pod first was not read a " << i + 1 << ". time";
    const PodRef pod{"ns", absl::StrCat("second-", i), absl::StrCat("pod-2", i)};
    const ClaimRef own{"ns", absl::StrFormat("0c1a1e00-0000-4000-8000-0000000002%02d", i),
                       absl::StrCat("own-", i)};
    n.reader().Set(own.uid, std::vector<AllocatedDevice>{Dev(kHca1)});
    n.reader().SetName(own.uid, own.name);
    n.reader().SetReserved(own.uid, {pod});
    holders.push_back(pod);
    n.reader().SetReserved(kUid1, holders);
    n.reader().SetPod({pod, {{"a", {{"shared", ""}}}, {"b", {{own.name, ""}}}}});
    const auto r = n.driver().Prepare({own}).at(own.uid);
    EXPECT_TRUE(r.ok()) << r.status();
    gate.Pass();
  }
  gate.Release();
  reading.join();
  EXPECT_TRUE(shared.ok()) << shared.status();
  const PreparedClaims prepared = n.driver().Prepared();
  const auto it = prepared.find(kUid1);
  return {gate.held_reads(), it == prepared.end() ? PreparedClaim{} : it->second};
}

// A call that finds its claim named by other calls' commits while it read reads again, at most
// three times in all: its claim's holders are those of its last reads (here the common variables
// name mlx5_0, right for every container that gets "shared"); after three it decides without
// knowing them, and the claim gets no common variables.
TEST(DRAPrepareLoadTest, AClaimWhoseHoldersKeepChangingIsReadAtMostThreeTimes) {
  {
    const auto [reads, shared] = PrepareSharedWhileOthersCommit(2);
    EXPECT_EQ(reads, 3);
    ASSERT_EQ(shared.common.count("hca"), 1u) << "holders known after the third read";
  }
  {
    const auto [reads, shared] = PrepareSharedWhileOthersCommit(3);
    EXPECT_EQ(reads, 3);
    EXPECT_EQ(shared.ref.uid, kUid1) << "not prepared";
    EXPECT_TRUE(shared.common.empty()) << "decided on holders it may not have read";
  }
}

}  // namespace
}  // namespace rdp::dra
