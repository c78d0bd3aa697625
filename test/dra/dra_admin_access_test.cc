// Admin access (KEP-5018): a claim whose results say adminAccess gets the HCA's device nodes
// beside the HCA's holder and is never counted as one.

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "dra/cdi.h"
#include "dra/checkpoint.h"
#include "dra/driver.h"
#include "dra/plugin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/dra/dra_node.h"
#include "test/support/log_lines.h"

namespace rdp::dra {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::DraNode;
using testing::Dev;
using testing::kHca0;
using testing::kHca1;
using testing::kUid1;
using testing::kUid2;
using testing::kUid3;
using testing::ReadJson;
using testing::SpecDevice;
using testing::SpecEnv;

const ClaimRef kHolder{"team", kUid1, "holder"};
const ClaimRef kMonitor{"ops", kUid2, "monitor"};

AllocatedDevice Admin(const std::string& device, const std::string& request = "hca") {
  AllocatedDevice d = Dev(device, request);
  d.admin_access = true;
  return d;
}

std::vector<std::string> SpecPaths(DraNode& n, const std::string& uid) {
  std::vector<std::string> out;
  const nlohmann::json device = SpecDevice(n, uid, "hca");
  for (const auto& d : device["containerEdits"]["deviceNodes"]) out.push_back(d["path"]);
  return out;
}

// What the driver keeps of a claim that others could change: its CDI spec and its checkpoint
// entry.
struct Kept {
  std::string spec;
  std::string entry;
  bool operator==(const Kept& o) const { return spec == o.spec && entry == o.entry; }
};
Kept KeptOf(DraNode& n, const std::string& uid) {
  return {ReadJson(n.cdi().PathOf(uid)).dump(), ReadJson(n.checkpoint_path())["claims"][uid].dump()};
}

std::set<std::string> Held(DraNode& n) {
  return HeldHcas(n.driver().Prepared(), *n.core().Now());
}

// An exclusive holder of mlx5_0, then an admin claim on it: both prepared; the admin claim's CDI
// device has the HCA's every node (uverbs, umad, issm: perfquery needs umad read-write) and
// rdma_cm; the holder's spec, checkpoint entry and the held HCAs are as before; unpreparing the
// admin claim leaves the holder prepared.
TEST(DRAAdminAccessTest, BesideAnExclusiveHolderWhichKeepsItsAccounting) {
  DraNode n;
  n.reader().Set(kHolder.uid, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().Set(kMonitor.uid, std::vector<AllocatedDevice>{Admin(kHca0)});
  ASSERT_TRUE(n.driver().Prepare({kHolder}).at(kHolder.uid).ok());
  const Kept before = KeptOf(n, kHolder.uid);
  const std::set<std::string> held = Held(n);
  EXPECT_EQ(held, std::set<std::string>{"0000:1a:00.0"});

  rdp::testing::LogLines log("dra");
  auto out = n.driver().Prepare({kMonitor});
  ASSERT_TRUE(out.at(kMonitor.uid).ok()) << out.at(kMonitor.uid).status();
  EXPECT_EQ(out.at(kMonitor.uid)->size(), 1u);
  EXPECT_EQ(out.at(kMonitor.uid)->front().device, kHca0);
  EXPECT_THAT(SpecPaths(n, kMonitor.uid),
              ElementsAre("/dev/infiniband/uverbs0", "/dev/infiniband/umad0",
                          "/dev/infiniband/issm0", "/dev/infiniband/rdma_cm"));
  const nlohmann::json device = SpecDevice(n, kMonitor.uid, "hca");
  for (const auto& node : device["containerEdits"]["deviceNodes"]) {
    EXPECT_EQ(node["permissions"], "rw") << node.dump();
  }
  EXPECT_EQ(KeptOf(n, kHolder.uid), before);
  EXPECT_EQ(Held(n), held);
  EXPECT_EQ(log.Count(absl::StrCat("claim ops/monitor (uid ", kUid2,
                                   "): admin access to HCA mlx5_0 (hca-0000-1a-00-0)")),
            1);

  ASSERT_TRUE(n.driver().Unprepare({kMonitor}).at(kMonitor.uid).ok());
  EXPECT_EQ(n.driver().Prepared().count(kHolder.uid), 1u);
  EXPECT_EQ(KeptOf(n, kHolder.uid), before);
  EXPECT_TRUE(std::filesystem::exists(n.cdi().PathOf(kHolder.uid)));
  EXPECT_FALSE(std::filesystem::exists(n.cdi().PathOf(kMonitor.uid)));
}

// The other order: an admin claim first, then the exclusive holder; unpreparing the holder
// leaves the admin claim prepared, and an admin claim alone holds nothing.
TEST(DRAAdminAccessTest, AnExclusiveClaimBesideAnAdminOneAndUnprepareOfEither) {
  DraNode n;
  n.reader().Set(kMonitor.uid, std::vector<AllocatedDevice>{Admin(kHca1)});
  n.reader().Set(kHolder.uid, std::vector<AllocatedDevice>{Dev(kHca1)});
  ASSERT_TRUE(n.driver().Prepare({kMonitor}).at(kMonitor.uid).ok());
  EXPECT_TRUE(Held(n).empty());
  const Kept monitor = KeptOf(n, kMonitor.uid);
  auto out = n.driver().Prepare({kHolder});
  ASSERT_TRUE(out.at(kHolder.uid).ok()) << out.at(kHolder.uid).status();
  EXPECT_EQ(SpecEnv(n, kHolder.uid).at("NCCL_IB_HCA"), "=mlx5_1");
  EXPECT_EQ(Held(n), std::set<std::string>{"0000:3a:00.0"});
  ASSERT_TRUE(n.driver().Unprepare({kHolder}).at(kHolder.uid).ok());
  EXPECT_EQ(n.driver().Prepared().count(kMonitor.uid), 1u);
  EXPECT_EQ(KeptOf(n, kMonitor.uid), monitor);
  EXPECT_TRUE(Held(n).empty());
}

// One container holding mlx5_0 exclusively and both HCAs for admin access (a training pod with
// a monitoring claim in an admin namespace): the holder's common variables name its HCA alone,
// and the admin request's device sets only its own variables (it would otherwise win over the
// holder's NCCL_IB_HCA in that container).
TEST(DRAAdminAccessTest, NamesNoDeviceInTheCommonVariables) {
  DraNode n;
  const ClaimRef holder{"ops", kUid1, "train"};
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Admin(kHca0), Admin(kHca1)});
  n.reader().SetName(kUid1, "train");
  n.reader().SetName(kUid2, "monitor");
  const PodRef pod{"ops", "trainer", "pod-1"};
  n.reader().SetReserved(kUid1, {pod});
  n.reader().SetReserved(kUid2, {pod});
  n.reader().SetPod({pod, {{"c", {{"train", ""}, {"monitor", ""}}}}});
  rdp::testing::LogLines log("dra");
  auto out = n.driver().Prepare({holder, kMonitor});
  ASSERT_TRUE(out.at(kUid1).ok()) << out.at(kUid1).status();
  ASSERT_TRUE(out.at(kUid2).ok()) << out.at(kUid2).status();
  const auto train = SpecEnv(n, kUid1);
  EXPECT_EQ(train.at("NCCL_IB_HCA"), "=mlx5_0");
  EXPECT_EQ(train.at("RDMA_HCA_NAMES"), "mlx5_0");
  const auto monitor = SpecEnv(n, kUid2);
  EXPECT_EQ(monitor.count("NCCL_IB_HCA"), 0u);
  EXPECT_EQ(monitor.count("RDMA_HCA_NAMES"), 0u);
  EXPECT_EQ(monitor.at("RDMA_HCA_NAMES_" + OwnVariableSuffix(kUid2, "hca")), "mlx5_0,mlx5_1");
  EXPECT_EQ(ReadJson(n.checkpoint_path())["claims"][kUid2].count("common"), 0u);
  EXPECT_EQ(log.Count("no container of its pods holds request"), 0);
  EXPECT_EQ(log.Count("admin access to HCA mlx5_0 (hca-0000-1a-00-0), mlx5_1 (hca-0000-3a-00-0)"),
            1);
}

// The checkpoint records admin access: after a restart without the API server the claim is
// still admin (it holds nothing) and is answered as before.
TEST(DRAAdminAccessTest, ARestartKeepsTheRule) {
  DraNode n;
  n.reader().Set(kMonitor.uid, std::vector<AllocatedDevice>{Admin(kHca0)});
  auto first = n.driver().Prepare({kMonitor});
  ASSERT_TRUE(first.at(kMonitor.uid).ok()) << first.at(kMonitor.uid).status();
  EXPECT_EQ(ReadJson(n.checkpoint_path())["claims"][kMonitor.uid]["devices"][0]["adminAccess"],
            true);
  n.reader().SetDown(true);
  n.NewDriver();
  const PreparedClaims prepared = n.driver().Prepared();
  ASSERT_EQ(prepared.count(kMonitor.uid), 1u);
  EXPECT_THAT(prepared.at(kMonitor.uid).devices, ElementsAre(Admin(kHca0)));
  EXPECT_TRUE(Held(n).empty());
  auto again = n.driver().Prepare({kMonitor});
  ASSERT_TRUE(again.at(kMonitor.uid).ok()) << again.at(kMonitor.uid).status();
  EXPECT_EQ(*again.at(kMonitor.uid), *first.at(kMonitor.uid));
}

// An HCA that is not usable (its ports DOWN) is refused to a holder and given to an admin
// claim, for diagnostics: its device nodes that exist, and a warning naming why it is unusable.
TEST(DRAAdminAccessTest, IsPreparedOnAnUnusableHca) {
  DraNode n;
  ASSERT_TRUE(n.node().fixture().SetPortState("mlx5_1", 1, "DOWN").ok());
  n.core().Poll(std::nullopt);
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca1)});
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Admin(kHca1)});
  auto holder = n.driver().Prepare({kHolder});
  EXPECT_TRUE(absl::IsFailedPrecondition(holder.at(kUid1).status())) << holder.at(kUid1).status();
  rdp::testing::LogLines log("dra");
  auto monitor = n.driver().Prepare({kMonitor});
  ASSERT_TRUE(monitor.at(kUid2).ok()) << monitor.at(kUid2).status();
  EXPECT_THAT(SpecPaths(n, kUid2),
              ElementsAre("/dev/infiniband/uverbs1", "/dev/infiniband/umad1",
                          "/dev/infiniband/issm1", "/dev/infiniband/rdma_cm"));
  EXPECT_EQ(log.Count("admin access to HCA mlx5_1 (hca-0000-3a-00-0), which is unusable now"), 1);
  // A claim with an ordinary result on that HCA beside the admin one is refused as any holder.
  n.reader().Set(kUid3, std::vector<AllocatedDevice>{Admin(kHca1), Dev(kHca1, "own")});
  EXPECT_TRUE(absl::IsFailedPrecondition(
      n.driver().Prepare({{"ops", kUid3, "mixed"}}).at(kUid3).status()));
}

}  // namespace
}  // namespace rdp::dra
