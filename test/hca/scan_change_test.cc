#include "hca/scan_change.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rdp::hca {
namespace {

topology::Hca Scanned(const std::string& pci, const std::string& name, const std::string& state) {
  topology::Hca h;
  h.name = name;
  h.place.pci = pci;
  h.place.numa = 0;  // as sysfs says: the snapshot's placement must win
  h.uverbs = "uverbs0";
  h.char_devices = {{"/dev/infiniband/uverbs0", true}};
  topology::Port port;
  port.number = 1;
  port.state = state;
  h.ports.push_back(port);
  return h;
}

// As a discovery placed them: hwloc's PCIe path and the NUMA node of their locality.
topology::Hca Discovered(topology::Hca h, int numa, const std::string& root) {
  h.place.numa = numa;
  h.place.pcie_root = root;
  h.place.bridges_known = true;
  return h;
}

TEST(ScanChangeTest, TellsAStateChangeFromAHotplug) {
  const std::vector<topology::Hca> known = {Scanned("0000:1a:00.0", "mlx5_0", "ACTIVE"),
                                            Scanned("0000:3a:00.0", "mlx5_1", "ACTIVE")};
  // Order does not matter.
  EXPECT_EQ(CompareScan(known, {known[1], known[0]}), ScanChange::kNone);
  // A port going DOWN, a rename after a driver rebind: the same PCI functions.
  EXPECT_EQ(CompareScan(known, {known[0], Scanned("0000:3a:00.0", "mlx5_1", "DOWN")}),
            ScanChange::kState);
  EXPECT_EQ(CompareScan(known, {known[0], Scanned("0000:3a:00.0", "mlx5_7", "ACTIVE")}),
            ScanChange::kState);
  // One gone, one added, one replaced by another.
  EXPECT_EQ(CompareScan(known, {known[0]}), ScanChange::kFunctions);
  EXPECT_EQ(CompareScan(known, {known[0], known[1], Scanned("0000:5a:00.0", "mlx5_2", "ACTIVE")}),
            ScanChange::kFunctions);
  EXPECT_EQ(CompareScan(known, {known[0], Scanned("0000:5a:00.0", "mlx5_1", "ACTIVE")}),
            ScanChange::kFunctions);
  EXPECT_EQ(PciFunctions({known[1], known[0]}), "0000:1a:00.0;0000:3a:00.0");
}

// The scanned state goes in, the discovered placement, NUMA nodes and GPUs stay. Before, the
// device plugin's patch kept only the NUMA nodes with CPUs: on a Grace node a port flap dropped
// the GPU-memory nodes from the snapshot.
TEST(ScanChangeTest, WithScannedStateKeepsWhatDiscoveryPlaced) {
  topology::Gpu gpu;
  gpu.place.pci = "0000:1b:00.0";
  gpu.place.numa = 1;
  topology::NumaNode gpu_memory;
  gpu_memory.id = 4;
  gpu_memory.has_cpus = false;
  gpu_memory.memory_kind = "GPUMemory";
  const topology::Topology snapshot = topology::Topology::WithNumaNodes(
      {{0, true, "0-71", ""}, {1, true, "72-143", ""}, gpu_memory},
      {Discovered(Scanned("0000:1a:00.0", "mlx5_0", "ACTIVE"), 1, "pci0000:15"),
       Discovered(Scanned("0000:3a:00.0", "mlx5_1", "ACTIVE"), 1, "pci0000:35")},
      {gpu});
  topology::Hca down = Scanned("0000:3a:00.0", "mlx5_1", "DOWN");
  down.char_devices = {{"/dev/infiniband/uverbs0", false}};
  const topology::TopologyPtr patched = WithScannedState(
      snapshot, {Scanned("0000:1a:00.0", "mlx5_0", "ACTIVE"), down,
                 Scanned("0000:5a:00.0", "mlx5_2", "ACTIVE")});  // not in the snapshot: left out
  ASSERT_EQ(patched->hcas().size(), 2u);
  const topology::Hca& h = patched->hcas()[1];
  EXPECT_EQ(h.ports[0].state, "DOWN");
  EXPECT_FALSE(h.char_devices[0].second);
  EXPECT_EQ(h.place.numa, 1);
  EXPECT_EQ(h.place.pcie_root, "pci0000:35");
  EXPECT_TRUE(h.place.bridges_known);
  ASSERT_EQ(patched->all_numa_nodes().size(), 3u);
  EXPECT_EQ(patched->all_numa_nodes()[2].memory_kind, "GPUMemory");
  EXPECT_EQ(patched->all_numa_nodes()[0].cpus, "0-71");
  EXPECT_EQ(patched->numa_nodes(), (std::vector<int>{0, 1}));
  ASSERT_EQ(patched->gpus().size(), 1u);
  EXPECT_EQ(patched->Path(1, 0), snapshot.Path(1, 0));
}

}  // namespace
}  // namespace rdp::hca
