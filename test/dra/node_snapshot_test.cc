// dra::NodeSnapshot, the DRA driver's view of the node: the health poll's scans patch a change
// of state (a flapping link) into the snapshot; only a change of the set of PCI functions (a
// hotplug) runs a discovery.

#include "dra/node_snapshot.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "test/support/test_node.h"
#include "topology/discovery.h"

namespace rdp::dra {
namespace {

class DRANodeSnapshotTest : public ::testing::Test {
 protected:
  // Discovery from the fixture's sysfs; each HCA's PCIe root names the discovery that placed it
  // ("discovery-1"), so that a snapshot tells which discovery its placement comes from.
  NodeSnapshot::Discover CountingDiscover() {
    std::shared_ptr<Env> env = node_.NodeEnv();
    return [this, env]() -> absl::StatusOr<topology::TopologyPtr> {
      ++discoveries_;
      absl::StatusOr<std::vector<topology::Hca>> hcas = topology::ReadSysfsHcas(*env);
      if (!hcas.ok()) return hcas.status();
      for (topology::Hca& h : *hcas) h.place.pcie_root = absl::StrCat("discovery-", discoveries_);
      return std::make_shared<const topology::Topology>(std::vector<int>{0, 1}, *hcas,
                                                        std::vector<topology::Gpu>{});
    };
  }
  std::vector<topology::Hca> Scan() {
    absl::StatusOr<std::vector<topology::Hca>> hcas = topology::ReadSysfsHcas(*node_.NodeEnv());
    EXPECT_TRUE(hcas.ok()) << hcas.status();
    return hcas.ok() ? *hcas : std::vector<topology::Hca>{};
  }
  // The state of `name`'s port 1 in `snapshot`, "" when it has no such HCA.
  static std::string Port1(const topology::Topology& snapshot, const std::string& name) {
    for (const topology::Hca& h : snapshot.hcas()) {
      if (h.name == name && !h.ports.empty()) return h.ports[0].state;
    }
    return "";
  }

  rdp::testing::TestNode node_;
  int discoveries_ = 0;  // the test's thread only: Apply runs on it
};

// A flapping link: each change of a port's state is patched into the snapshot (the HCAs'
// placement kept from the first discovery), never a full discovery; a hotplug still discovers.
// Before, the DRA health poll ran a hwloc discovery of the whole node on every flap (issue 25).
TEST_F(DRANodeSnapshotTest, AFlappingLinkIsPatchedNotRediscovered) {
  NodeSnapshot snapshot(CountingDiscover());
  ASSERT_TRUE(snapshot.Init().ok());
  ASSERT_EQ(discoveries_, 1);
  EXPECT_FALSE(snapshot.Apply(Scan())) << "nothing changed";
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(node_.fixture().SetPortState("mlx5_1", 1, "DOWN").ok());
    EXPECT_TRUE(snapshot.Apply(Scan()));
    EXPECT_EQ(Port1(*snapshot.Current(), "mlx5_1"), "DOWN");
    ASSERT_TRUE(node_.fixture().SetPortState("mlx5_1", 1, "ACTIVE").ok());
    EXPECT_TRUE(snapshot.Apply(Scan()));
    EXPECT_EQ(Port1(*snapshot.Current(), "mlx5_1"), "ACTIVE");
  }
  EXPECT_EQ(discoveries_, 1) << "a flap ran a full discovery";
  for (const topology::Hca& h : snapshot.Current()->hcas()) {
    EXPECT_EQ(h.place.pcie_root, "discovery-1") << h.name << ": placement not kept";
  }

  // Hotplug: the set of PCI functions changed, only a discovery places them.
  ASSERT_TRUE(node_.fixture().RemoveHca("mlx5_2").ok());
  EXPECT_TRUE(snapshot.Apply(Scan()));
  EXPECT_EQ(discoveries_, 2);
  EXPECT_EQ(snapshot.Current()->hcas().size(), 3u);
  EXPECT_FALSE(snapshot.Apply(Scan()));
  EXPECT_EQ(discoveries_, 2);
}

// A discovery that fails keeps the snapshot (and says so: no change to publish); the next scan
// tries again.
TEST_F(DRANodeSnapshotTest, AFailedDiscoveryKeepsTheSnapshot) {
  bool fail = false;
  NodeSnapshot::Discover discover = CountingDiscover();
  NodeSnapshot snapshot([&fail, discover]() -> absl::StatusOr<topology::TopologyPtr> {
    if (fail) return absl::InternalError("hwloc failed");
    return discover();
  });
  ASSERT_TRUE(snapshot.Init().ok());
  const topology::TopologyPtr first = snapshot.Current();
  ASSERT_TRUE(node_.fixture().RemoveHca("mlx5_2").ok());
  fail = true;
  EXPECT_FALSE(snapshot.Apply(Scan()));
  EXPECT_EQ(snapshot.Current(), first);
  fail = false;
  EXPECT_TRUE(snapshot.Apply(Scan()));
  EXPECT_EQ(snapshot.Current()->hcas().size(), 3u);
}

}  // namespace
}  // namespace rdp::dra
