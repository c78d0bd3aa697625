// node::Node: the health poll and its one set of rules for both doors (a failed scan, a failed
// discovery, a flapping link, a hotplug, an HCA that vanishes and is forgotten), Rediscover's
// rate limit, the device-node check at hand-out time, and what a container gets.

#include "node/node.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sim/sysfs_fixture.h"
#include "test/support/temp_dir.h"
#include "topology/discovery.h"

namespace rdp::node {
namespace {

sim::FixtureHca Card(const std::string& name, const std::string& pci, int numa) {
  sim::FixtureHca h;
  h.name = name;
  h.pci = pci;
  h.numa = numa;
  h.pcie_root = "pci0000:" + pci.substr(5, 2);
  return h;
}

class NodeTest : public ::testing::Test {
 protected:
  NodeTest() : fixture_(dir_.Sub("node")) {
    for (const auto& c : {Card("mlx5_0", "0000:1a:00.0", 0), Card("mlx5_1", "0000:3a:00.0", 0),
                          Card("mlx5_2", "0000:9a:00.0", 1)}) {
      EXPECT_TRUE(fixture_.AddHca(c).ok()) << c.name;
    }
    EXPECT_TRUE(fixture_.AddRdmaCm().ok());
  }

  std::shared_ptr<Env> NodeEnv() const {
    const std::string root = dir_.Sub("node");
    return NewNodeEnv({root, root, root});
  }

  // Discovery from sysfs alone, counted; each HCA's PCIe root names the discovery that placed it
  // ("discovery-N"), so that a view tells which discovery its placement comes from. Fails while
  // fail_discovery_ is set; the scan fails while fail_scan_ is set.
  Sources TestSources() {
    Sources s;
    std::shared_ptr<Env> env = NodeEnv();
    s.env = env;
    s.discover = [this, env]() -> absl::StatusOr<topology::TopologyPtr> {
      if (fail_discovery_) return absl::InternalError("hwloc failed");
      ++discoveries_;
      absl::StatusOr<std::vector<topology::Hca>> hcas = topology::ReadSysfsHcas(*env);
      if (!hcas.ok()) return hcas.status();
      for (topology::Hca& h : *hcas) h.place.pcie_root = absl::StrCat("discovery-", discoveries_);
      return std::make_shared<const topology::Topology>(std::vector<int>{0, 1}, *hcas,
                                                        std::vector<topology::Gpu>{});
    };
    s.scan = [this, env]() -> absl::StatusOr<std::vector<topology::Hca>> {
      if (fail_scan_) return absl::NotFoundError("/host/sys/class/infiniband: not mounted");
      return topology::ReadSysfsHcas(*env);
    };
    s.now = [this] { return now_; };
    return s;
  }

  std::unique_ptr<Node> MakeNode(Options options = {}) {
    options.forget_after_polls = 3;
    auto node = std::make_unique<Node>(options, TestSources());
    EXPECT_TRUE(node->Init().ok());
    return node;
  }

  static const hca::AdvertisedHca& Hca(const View& view, const std::string& pci) {
    static const hca::AdvertisedHca kNone;
    auto it = view.hcas.find(pci);
    return it == view.hcas.end() ? kNone : it->second;
  }

  rdp::testing::TempDir dir_;
  sim::SysfsFixture fixture_;
  std::atomic<bool> fail_scan_{false};
  std::atomic<bool> fail_discovery_{false};
  int discoveries_ = 0;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST_F(NodeTest, InitDiscoversEveryHcaHealthy) {
  auto node = MakeNode();
  ViewPtr view = node->Now();
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->topology->hcas().size(), 3u);
  ASSERT_EQ(view->hcas.size(), 3u);
  for (const auto& [pci, a] : view->hcas) {
    EXPECT_TRUE(a.present && a.healthy) << pci << ": " << a.reason;
  }
  EXPECT_EQ(discoveries_, 1);
  EXPECT_FALSE(node->Poll(std::set<std::string>{})) << "nothing changed";
}

TEST_F(NodeTest, InitFailsWhenDiscoveryFails) {
  fail_discovery_ = true;
  Node node({}, TestSources());
  EXPECT_FALSE(node.Init().ok());
  EXPECT_EQ(node.Now(), nullptr);
}

// A failed scan (a broken /sys mount) keeps the last good state: every HCA listed, unusable with
// the scan's error as the reason, none counted absent; the next good scan restores them. The
// DRA door used to drop a failed scan silently and keep publishing the last health.
TEST_F(NodeTest, AFailedScanKeepsTheLastGoodStateUnusable) {
  auto node = MakeNode();
  fail_scan_ = true;
  for (int i = 0; i < 5; ++i) node->Poll(std::set<std::string>{});
  ViewPtr view = node->Now();
  EXPECT_EQ(view->hcas.size(), 3u) << "none forgotten";
  EXPECT_EQ(view->topology->hcas().size(), 3u);
  EXPECT_NE(view->scan_error.find("not mounted"), std::string::npos) << view->scan_error;
  for (const topology::Hca& h : view->topology->hcas()) {
    const hca::Verdict v = view->Verdict(h);
    EXPECT_FALSE(v.usable);
    EXPECT_NE(v.reason.find("the health scan failed"), std::string::npos) << v.reason;
    const hca::AdvertisedHca& a = Hca(*view, h.place.pci);
    EXPECT_TRUE(a.present);
    EXPECT_FALSE(a.healthy);
    EXPECT_EQ(a.absent_polls, 0);
  }
  fail_scan_ = false;
  EXPECT_TRUE(node->Poll(std::set<std::string>{}));
  view = node->Now();
  EXPECT_TRUE(view->scan_error.empty());
  for (const auto& [pci, a] : view->hcas) EXPECT_TRUE(a.healthy) << pci << ": " << a.reason;
  EXPECT_EQ(discoveries_, 1);
}

// A port going DOWN and ACTIVE again is patched into the snapshot (placement kept from the first
// discovery), never a full discovery.
TEST_F(NodeTest, AFlappingLinkIsPatchedNotRediscovered) {
  auto node = MakeNode();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(fixture_.SetPortState("mlx5_1", 1, "DOWN").ok());
    EXPECT_TRUE(node->Poll(std::set<std::string>{}));
    const hca::AdvertisedHca& down = Hca(*node->Now(), "0000:3a:00.0");
    EXPECT_FALSE(down.healthy);
    EXPECT_NE(down.reason.find("port 1 is DOWN"), std::string::npos) << down.reason;
    ASSERT_TRUE(fixture_.SetPortState("mlx5_1", 1, "ACTIVE").ok());
    EXPECT_TRUE(node->Poll(std::set<std::string>{}));
    EXPECT_TRUE(Hca(*node->Now(), "0000:3a:00.0").healthy);
  }
  EXPECT_EQ(discoveries_, 1);
  for (const topology::Hca& h : node->Now()->topology->hcas()) {
    EXPECT_EQ(h.place.pcie_root, "discovery-1") << h.name;
  }
}

// A hotplug (a PCI function added) runs a discovery; a failed one places the scan as the last
// discovery placed the HCAs and is tried again at every poll until it succeeds.
TEST_F(NodeTest, AFailedDiscoveryFallsBackToTheScanAndIsRetried) {
  auto node = MakeNode();
  ASSERT_TRUE(fixture_.AddHca(Card("mlx5_3", "0000:ba:00.0", 1)).ok());
  fail_discovery_ = true;
  EXPECT_TRUE(node->Poll(std::set<std::string>{}));
  ViewPtr view = node->Now();
  ASSERT_EQ(view->topology->hcas().size(), 4u) << "the scan's HCAs, the new one included";
  EXPECT_TRUE(Hca(*view, "0000:ba:00.0").present);
  EXPECT_EQ(view->topology->hcas()[view->topology->HcaIndex("0000:1a:00.0")].place.pcie_root,
            "discovery-1")
      << "placed as last discovered";
  node->Poll(std::set<std::string>{});
  EXPECT_EQ(discoveries_, 1);
  fail_discovery_ = false;
  EXPECT_TRUE(node->Poll(std::set<std::string>{}));
  EXPECT_EQ(discoveries_, 2) << "retried while pending";
  view = node->Now();
  for (const topology::Hca& h : view->topology->hcas()) {
    EXPECT_EQ(h.place.pcie_root, "discovery-2") << h.name;
  }
  node->Poll(std::set<std::string>{});
  EXPECT_EQ(discoveries_, 2) << "no longer pending";
}

// A vanished HCA is listed unusable; it is forgotten after forget_after_polls polls only when the
// door knows nobody holds it; one that returns is healthy again.
TEST_F(NodeTest, AVanishedHcaIsForgottenOnlyWhenNothingHoldsIt) {
  auto node = MakeNode();
  ASSERT_TRUE(fixture_.RemoveHca("mlx5_2").ok());
  ASSERT_TRUE(fixture_.RemoveHca("mlx5_1").ok());
  const std::set<std::string> held = {"0000:9a:00.0"};
  for (int i = 0; i < 3; ++i) node->Poll(held);
  ViewPtr view = node->Now();
  EXPECT_EQ(view->hcas.count("0000:3a:00.0"), 0u) << "absent 3 polls, not held: forgotten";
  ASSERT_EQ(view->hcas.count("0000:9a:00.0"), 1u) << "held: kept";
  const hca::AdvertisedHca& gone = Hca(*view, "0000:9a:00.0");
  EXPECT_FALSE(gone.present);
  EXPECT_FALSE(gone.healthy);
  EXPECT_EQ(gone.reason, "it is gone from the node");
  EXPECT_EQ(gone.numa, 1) << "its last known NUMA node";
  // Without the holders known nothing is forgotten.
  for (int i = 0; i < 5; ++i) node->Poll(std::nullopt);
  EXPECT_EQ(node->Now()->hcas.count("0000:9a:00.0"), 1u);
  ASSERT_TRUE(fixture_.AddHca(Card("mlx5_2", "0000:9a:00.0", 1)).ok());
  EXPECT_TRUE(node->Poll(held));
  EXPECT_TRUE(Hca(*node->Now(), "0000:9a:00.0").healthy);
}

// A driver reload: every RDMA device gone for 60 s while the PCI functions stay, then back with
// every mlx5_N and uverbsN numbered anew. Each HCA keeps its PCI address, placement and place in
// the snapshot, unusable with the driver's reason, never forgotten (nothing holds them); back,
// each is healthy under the same ID with the new names and device nodes, without a discovery; one
// reload is counted and logged with how long the driver was away.
TEST_F(NodeTest, ADriverReloadKeepsEveryHcaUnderItsPciAddress) {
  auto node = MakeNode();
  const std::vector<std::string> pcis = {"0000:1a:00.0", "0000:3a:00.0", "0000:9a:00.0"};
  for (const char* name : {"mlx5_0", "mlx5_1", "mlx5_2"}) {
    ASSERT_TRUE(fixture_.UnbindRdma(name).ok()) << name;
  }
  for (int i = 0; i < 12; ++i) {  // 60 s of polls every 5 s, nothing held
    now_ += absl::Seconds(5);
    node->Poll(std::set<std::string>{});
  }
  ViewPtr view = node->Now();
  EXPECT_EQ(view->driver_away, std::set<std::string>(pcis.begin(), pcis.end()));
  ASSERT_EQ(view->topology->hcas().size(), 3u) << "kept in the snapshot";
  for (const std::string& pci : pcis) {
    const hca::AdvertisedHca& a = Hca(*view, pci);
    EXPECT_EQ(a.pci, pci) << "never forgotten";
    EXPECT_TRUE(a.present);
    EXPECT_FALSE(a.healthy);
    EXPECT_EQ(a.absent_polls, 0);
    EXPECT_EQ(a.reason.rfind("its RDMA driver is not bound", 0), 0u) << a.reason;
    const topology::Hca& h = view->topology->hcas()[view->topology->HcaIndex(pci)];
    EXPECT_EQ(h.place.pcie_root, "discovery-1") << "placement kept";
    EXPECT_TRUE(h.uverbs.empty());
    EXPECT_FALSE(view->Verdict(h).usable);
  }
  EXPECT_EQ(Hca(*view, "0000:9a:00.0").numa, 1);

  // Back, numbered anew: mlx5_0 is now mlx5_5 on uverbs3, and so on.
  ASSERT_TRUE(fixture_.BindRdma("0000:9a:00.0", "mlx5_3").ok());
  ASSERT_TRUE(fixture_.BindRdma("0000:1a:00.0", "mlx5_5").ok());
  ASSERT_TRUE(fixture_.BindRdma("0000:3a:00.0", "mlx5_4").ok());
  now_ += absl::Seconds(5);
  EXPECT_TRUE(node->Poll(std::set<std::string>{}));
  view = node->Now();
  EXPECT_TRUE(view->driver_away.empty());
  EXPECT_EQ(Hca(*view, "0000:1a:00.0").name, "mlx5_5");
  for (const std::string& pci : pcis) {
    EXPECT_TRUE(Hca(*view, pci).healthy) << pci << ": " << Hca(*view, pci).reason;
  }
  const topology::Hca& first = view->topology->hcas()[view->topology->HcaIndex("0000:1a:00.0")];
  EXPECT_EQ(first.uverbs, "uverbs4");
  EXPECT_EQ(first.place.pcie_root, "discovery-1");
  EXPECT_EQ(discoveries_, 1) << "the same PCI functions: no discovery";
  // What a container gets names the new device nodes.
  hca::NodesNow checked = node->CheckNow({&first});
  ASSERT_TRUE(hca::Assess(checked.hcas[0]).usable);
  Grant grant = node->GrantFor(checked.hcas, checked.rdma_cm);
  EXPECT_EQ(grant.allocation.envs.at("NCCL_IB_HCA"), "=mlx5_5");
  EXPECT_EQ(grant.allocation.devices[0].host_path, "/dev/infiniband/uverbs4");
  metrics::Exposition out;
  node->WriteMetrics(out, {});
  EXPECT_NE(out.Take().find("rdma_device_plugin_driver_reloads_total 1\n"), std::string::npos);
}

// A driver that never comes back for one HCA whose PCI function then goes (a hot-unplug during
// the reload): that one is forgotten after the grace, the others stay.
TEST_F(NodeTest, AnHcaWhosePciFunctionGoesDuringAReloadIsForgotten) {
  auto node = MakeNode();
  ASSERT_TRUE(fixture_.UnbindRdma("mlx5_0").ok());
  ASSERT_TRUE(fixture_.UnbindRdma("mlx5_1").ok());
  node->Poll(std::set<std::string>{});
  ASSERT_TRUE(fixture_.RemoveHca("mlx5_1").ok());
  for (int i = 0; i < 3; ++i) node->Poll(std::set<std::string>{});
  ViewPtr view = node->Now();
  EXPECT_EQ(view->hcas.count("0000:3a:00.0"), 0u);
  EXPECT_EQ(view->driver_away, std::set<std::string>{"0000:1a:00.0"});
  EXPECT_EQ(Hca(*view, "0000:1a:00.0").pci, "0000:1a:00.0");
}

TEST_F(NodeTest, RediscoverIsRateLimited) {
  auto node = MakeNode();
  ASSERT_TRUE(fixture_.AddHca(Card("mlx5_3", "0000:ba:00.0", 1)).ok());
  ViewPtr view = node->Rediscover();
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->topology->hcas().size(), 4u);
  EXPECT_TRUE(Hca(*view, "0000:ba:00.0").healthy);
  EXPECT_EQ(node->Rediscover(), nullptr) << "within the interval";
  now_ += absl::Seconds(3);
  EXPECT_NE(node->Rediscover(), nullptr);
  EXPECT_EQ(discoveries_, 3);
}

TEST_F(NodeTest, ListenersRunOnEveryChange) {
  auto node = MakeNode();
  int changes = 0;
  const int id = node->AddListener([&] { ++changes; });
  EXPECT_FALSE(node->Poll(std::set<std::string>{}));
  ASSERT_TRUE(fixture_.SetPortState("mlx5_0", 1, "DOWN").ok());
  EXPECT_TRUE(node->Poll(std::set<std::string>{}));
  EXPECT_EQ(changes, 1);
  const std::uint64_t version = node->Now()->version;
  node->RemoveListener(id);
  ASSERT_TRUE(fixture_.SetPortState("mlx5_0", 1, "ACTIVE").ok());
  EXPECT_TRUE(node->Poll(std::set<std::string>{}));
  EXPECT_EQ(changes, 1);
  EXPECT_GT(node->Now()->version, version);
}

// A device node gone since the last scan: CheckNow sees it at the call and asks for a poll.
TEST_F(NodeTest, CheckNowSeesADeviceNodeGoneAndAsksForAPoll) {
  auto node = MakeNode();
  int requests = 0;
  node->SetRescanRequest([&] { ++requests; });
  ViewPtr view = node->Now();
  std::vector<const topology::Hca*> hcas;
  for (const topology::Hca& h : view->topology->hcas()) hcas.push_back(&h);
  hca::NodesNow now = node->CheckNow(hcas);
  EXPECT_TRUE(now.rdma_cm);
  for (const hca::HcaNow& h : now.hcas) EXPECT_TRUE(hca::Assess(h).usable);
  EXPECT_EQ(requests, 0);
  ASSERT_TRUE(fixture_.RemoveUverbs("mlx5_1").ok());
  now = node->CheckNow(hcas);
  EXPECT_FALSE(hca::Assess(now.hcas[1]).usable);
  EXPECT_EQ(requests, 1);
}

// The allocation file is built and written only with an allocation dir; its mount names it.
TEST_F(NodeTest, GrantWritesTheAllocationFileOnlyWithADirectory) {
  auto without = MakeNode();
  ViewPtr view = without->Now();
  std::vector<const topology::Hca*> one = {&view->topology->hcas()[0]};
  hca::NodesNow now = without->CheckNow(one);
  Grant grant = without->GrantFor(now.hcas, now.rdma_cm);
  EXPECT_TRUE(grant.file_mount.empty());
  EXPECT_TRUE(grant.allocation.file.empty());
  EXPECT_EQ(grant.allocation.envs.at("NCCL_IB_HCA"), "=mlx5_0");

  Options options;
  options.allocation_dir = dir_.Sub("alloc");
  std::filesystem::create_directories(options.allocation_dir);
  auto with = MakeNode(options);
  view = with->Now();
  one = {&view->topology->hcas()[0]};
  now = with->CheckNow(one);
  grant = with->GrantFor(now.hcas, now.rdma_cm);
  ASSERT_FALSE(grant.file_mount.empty());
  EXPECT_EQ(grant.file_mount.rfind(options.allocation_dir, 0), 0u) << grant.file_mount;
  EXPECT_TRUE(std::filesystem::exists(grant.file_mount));
  EXPECT_EQ(grant.allocation.envs, without->GrantFor(now.hcas, now.rdma_cm).allocation.envs);
}

}  // namespace
}  // namespace rdp::node
