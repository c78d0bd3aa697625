// The device plugin on a Grace-class node (test/data/gb200-tray.xml laid out as the kernel shows
// it): what it advertises when discovery cannot run again.

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "deviceplugin/node_state.h"
#include "test/deviceplugin/test_node.h"
#include "topology/discovery.h"

namespace rdp::deviceplugin {
namespace {

using ::testing::ElementsAre;
using testing::TestNode;

std::optional<int> NumaOf(const ResourceState::DeviceList& list, const std::string& id) {
  for (const DeviceState& d : list.devices) {
    if (d.id == id) return d.numa;
  }
  ADD_FAILURE() << id << " is not listed";
  return std::nullopt;
}

// A health scan that sees the HCAs change runs a discovery; when that fails, the plugin goes on
// with the scan placed as the last discovery placed it. Before, it took the raw scan: an HCA
// whose kernel numa_node names a node of GPU memory (firmware that says so; hwloc's locality
// says the socket) was advertised on that CPU-less node, and the snapshot lost the nodes without
// CPUs and every HCA's PCIe path until a discovery succeeded again.
TEST(GraceNodeTest, FailedRediscoveryKeepsTheDiscoveredPlacements) {
  TestNode node(std::vector<sim::FixtureHca>{});
  topology::DiscoveryOptions options;
  options.topology_xml = rdp::testing::TestData("gb200-tray.xml");
  absl::StatusOr<topology::TopologyPtr> xml_only = topology::Discover(options);
  ASSERT_TRUE(xml_only.ok()) << xml_only.status();
  ASSERT_TRUE(node.fixture().AddTopology(**xml_only).ok());
  const std::string root = node.dir().Sub("node");
  std::ofstream(root + "/sys/bus/pci/devices/0002:01:00.0/numa_node", std::ios::trunc) << "2\n";

  options.sysfs_root = root;
  options.dev_root = root;
  std::shared_ptr<Env> env = node.NodeEnv();
  auto discoverer = std::make_shared<topology::Discoverer>(options, env);
  auto failing = std::make_shared<std::atomic<bool>>(false);
  NodeSources sources;
  sources.env = env;
  sources.scan = [env] { return topology::ReadSysfsHcas(*env); };
  sources.discover = [discoverer, failing]() -> absl::StatusOr<topology::TopologyPtr> {
    if (*failing) return absl::UnavailableError("hwloc cannot load the topology (test)");
    return discoverer->Discover();
  };
  NodeState state(node.MakeConfig(hca::Mode::kExclusive), std::move(sources));
  ASSERT_TRUE(state.Init().ok());
  EXPECT_EQ(NumaOf(state.resource().Devices(), "0002:01:00.0"), 0) << "hwloc's locality, reduced to CPUs";

  failing->store(true);
  ASSERT_TRUE(node.fixture().RemoveHca("mlx5_3").ok());
  state.Poll();
  const ResourceState::DeviceList list = state.resource().Devices();
  EXPECT_EQ(NumaOf(list, "0000:01:00.0"), 0);
  EXPECT_EQ(NumaOf(list, "0002:01:00.0"), 0) << "not the GPU memory the kernel's numa_node names";
  EXPECT_EQ(NumaOf(list, "0010:01:00.0"), 1);
  EXPECT_EQ(NumaOf(list, "0012:01:00.0"), 1) << "vanished, listed with its last node";
  const topology::TopologyPtr t = state.topology();
  ASSERT_EQ(t->hcas().size(), 3u) << "the scan's HCAs";
  EXPECT_THAT(t->numa_nodes(), ElementsAre(0, 1));
  EXPECT_EQ(t->all_numa_nodes().size(), 6u) << "the GPU memory nodes are still known";
  for (const topology::Hca& h : t->hcas()) {
    EXPECT_TRUE(h.place.bridges_known) << h.name << ": its PCIe path as discovered";
    EXPECT_EQ(h.place.bridges.size(), 1u) << h.name << ": its root port";
  }
  EXPECT_EQ(t->gpus().size(), 4u);
}

}  // namespace
}  // namespace rdp::deviceplugin
