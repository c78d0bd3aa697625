// Discovery of a gathered tree (hwloc-gather-topology's output, test/data/*.tar.bz2): hwloc reads
// it through HWLOC_FSROOT, our reader through the root. Apart from discovery_test: unpacking and
// discovering the tree takes seconds (ctest label slow).

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/support/temp_dir.h"
#include "test/topology/load.h"
#include "topology/discovery.h"

namespace rdp::topology {
namespace {
using ::testing::HasSubstr;
using testing::Load;
using testing::TestData;

// hwloc-gather-topology's tree: hwloc reads it through HWLOC_FSROOT, our reader through the root.
class DiscoveryGatheredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string cmd = "tar -xjf '" + TestData("32em64t-2n8c+1mic.tar.bz2") + "' -C '" +
                            dir_.path() + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    o_.sysfs_root = dir_.path() + "/32em64t-2n8c+1mic";
    o_.dev_root = o_.sysfs_root;
  }
  void TearDown() override { EXPECT_TRUE(PrepareHwloc(DiscoveryOptions()).ok()); }

  testing::TempDir dir_;
  DiscoveryOptions o_;
};

// hwloc reads the root from the environment; the environment is written once, before threads
// start (PrepareHwloc), never by a discovery: setenv/unsetenv on every discovery raced with
// every thread of the running plugin.
TEST_F(DiscoveryGatheredTest, RootIsSetOnceNeverByADiscovery) {
  auto unprepared = Discover(o_);
  ASSERT_FALSE(unprepared.ok());
  EXPECT_EQ(unprepared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unprepared.status().message()), HasSubstr(o_.sysfs_root));

  ASSERT_TRUE(PrepareHwloc(o_).ok());
  ASSERT_NE(std::getenv("HWLOC_FSROOT"), nullptr);
  EXPECT_EQ(std::string(std::getenv("HWLOC_FSROOT")), o_.sysfs_root);
  EXPECT_TRUE(Discover(o_).ok());
  ASSERT_NE(std::getenv("HWLOC_FSROOT"), nullptr) << "a discovery must not touch the environment";
  EXPECT_EQ(std::string(std::getenv("HWLOC_FSROOT")), o_.sysfs_root);

  DiscoveryOptions other = o_;
  other.sysfs_root = dir_.path();
  std::filesystem::create_directories(dir_.path() + "/sys");
  auto elsewhere = Discover(other);
  ASSERT_FALSE(elsewhere.ok()) << "another root than the one set must not be read";
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kFailedPrecondition);

  DiscoveryOptions missing = o_;
  missing.sysfs_root = dir_.path() + "/nowhere";
  EXPECT_EQ(PrepareHwloc(missing).code(), absl::StatusCode::kNotFound);
}

TEST_F(DiscoveryGatheredTest, FsrootTarball) {
  ASSERT_TRUE(PrepareHwloc(o_).ok());
  TopologyPtr t = Load(o_);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->numa_nodes(), (std::vector<int>{0, 1}));
  ASSERT_EQ(t->hcas().size(), 1u) << "scif0 is not a PCI function";
  const Hca& h = t->hcas()[0];
  EXPECT_EQ(h.name, "mlx4_0");
  EXPECT_EQ(h.place.pci, "0000:82:00.0");
  EXPECT_EQ(h.place.numa, 1);
  EXPECT_EQ(h.place.pcie_root, "pci0000:80");
  EXPECT_TRUE(h.place.bridges_known) << "hwloc placed it from the gathered tree";
  ASSERT_EQ(h.ports.size(), 1u);
  EXPECT_EQ(h.ports[0].link_layer, "InfiniBand");
  EXPECT_TRUE(h.AllPortsActive());
}

}  // namespace
}  // namespace rdp::topology
