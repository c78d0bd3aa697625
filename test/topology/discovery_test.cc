// Discovery on the bundled hwloc exports, alone and merged with fake sysfs trees.

#include "topology/discovery.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/support/temp_dir.h"
#include "test/topology/load.h"
#include "sim/fixture_node.h"
#include "sim/sysfs_fixture.h"

namespace rdp::topology {
namespace {
using sim::FixtureHca;
using sim::FixturePort;
using sim::SysfsFixture;
using ::testing::_;
using ::testing::Contains;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::Pair;
using ::testing::HasSubstr;
using testing::Load;
using testing::LoadXml;
using testing::TestData;


PathClass PathByPci(const Topology& t, const std::string& hca, const std::string& gpu) {
  return t.Path(t.HcaIndex(hca), t.GpuIndex(gpu));
}

TEST(DiscoveryXmlTest, DgxH100Like) {
  TopologyPtr t = LoadXml("dgx-h100-like.xml");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->numa_nodes(), (std::vector<int>{0, 1}));
  ASSERT_EQ(t->hcas().size(), 9u);
  ASSERT_EQ(t->gpus().size(), 8u);
  const Hca& h0 = t->hcas()[0];
  EXPECT_EQ(h0.name, "mlx5_0");
  EXPECT_EQ(h0.place.pci, "0000:1a:00.0");
  EXPECT_EQ(h0.place.numa, 0);
  EXPECT_EQ(h0.place.pcie_root, "pci0000:15");
  EXPECT_EQ(h0.place.Switch(), "0000:16:00.0");
  EXPECT_EQ(h0.uverbs, "");
  ASSERT_EQ(h0.ports.size(), 1u);
  EXPECT_EQ(h0.ports[0].state, "ACTIVE");
  EXPECT_TRUE(h0.AllPortsActive());
  EXPECT_THAT(h0.netdevs, ElementsAre("ibp26s0"));

  const Hca& bond = t->hcas()[8];
  EXPECT_EQ(bond.name, "mlx5_bond_0");
  EXPECT_EQ(bond.place.pci, "0000:c9:00.0");
  EXPECT_EQ(bond.place.pcie_root, "pci0000:c8");
  EXPECT_EQ(bond.place.Switch(), "");
  EXPECT_EQ(bond.place.numa, 1);

  for (const Gpu& g : t->gpus()) EXPECT_EQ(g.vendor, "10de");
  EXPECT_EQ(t->gpus()[0].place.pci, "0000:18:00.0");
  EXPECT_EQ(t->gpus()[0].place.Switch(), "0000:16:00.0");
  EXPECT_EQ(t->gpus()[0].device, "2330");

  EXPECT_EQ(PathByPci(*t, "0000:1a:00.0", "0000:18:00.0"), PathClass::kPIX);
  EXPECT_EQ(PathByPci(*t, "0000:1a:00.0", "0000:3a:00.0"), PathClass::kNODE);
  EXPECT_EQ(PathByPci(*t, "0000:1a:00.0", "0000:9d:00.0"), PathClass::kSYS);
  EXPECT_EQ(PathByPci(*t, "0000:c1:00.0", "0000:bf:00.0"), PathClass::kPIX);
  EXPECT_EQ(PathByPci(*t, "0000:c9:00.0", "0000:be:00.0"), PathClass::kNODE);
  EXPECT_EQ(PathByPci(*t, "0000:c9:00.0", "0000:18:00.0"), PathClass::kSYS);
}

TEST(DiscoveryXmlTest, Dgx2TwoLevelSwitches) {
  TopologyPtr t = LoadXml("nvidiaDGX2.xml");
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->hcas().empty()) << "its NICs were removed before export";
  ASSERT_EQ(t->gpus().size(), 16u);
  auto gpu = [&](const char* pci) { return t->gpus()[t->GpuIndex(pci)].place; };
  EXPECT_EQ(gpu("0000:34:00.0").Switch(), "0000:32:00.0");
  EXPECT_EQ(gpu("0000:39:00.0").Switch(), "0000:37:00.0");
  EXPECT_EQ(gpu("0000:34:00.0").bridges.at(2).switch_id, "0000:2c:00.0")
      << "2d:04.0 is a downstream port of the outer switch, not a switch of its own";
  EXPECT_EQ(Classify(gpu("0000:34:00.0"), gpu("0000:36:00.0")), PathClass::kPIX);
  EXPECT_EQ(Classify(gpu("0000:34:00.0"), gpu("0000:39:00.0")), PathClass::kPXB);
  EXPECT_EQ(Classify(gpu("0000:34:00.0"), gpu("0000:57:00.0")), PathClass::kNODE);
  EXPECT_EQ(Classify(gpu("0000:34:00.0"), gpu("0000:b7:00.0")), PathClass::kSYS);
  EXPECT_EQ(gpu("0000:e7:00.0").numa, 1);
  EXPECT_EQ(gpu("0000:e7:00.0").pcie_root, "pci0000:d7");
}

TEST(DiscoveryXmlTest, SupermicroGpusOnRootPortsAndBmcVga) {
  TopologyPtr t = LoadXml("32em64t-2n8c2t-pci-normalio.xml");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->hcas().size(), 1u);
  EXPECT_EQ(t->hcas()[0].name, "mlx5_0");
  EXPECT_EQ(t->hcas()[0].place.numa, 1);
  EXPECT_TRUE(t->hcas()[0].AllPortsActive());
  // 3 Teslas and a Radeon (AMD, class 0300); the Matrox BMC VGA (102b:0532) is not a GPU.
  ASSERT_EQ(t->gpus().size(), 4u);
  EXPECT_EQ(t->GpuIndex("0000:05:03.0"), -1);
  EXPECT_EQ(t->gpus()[3].vendor, "1002");
  EXPECT_EQ(t->gpus()[0].place.Switch(), "");
  EXPECT_EQ(PathByPci(*t, "0000:04:00.0", "0000:03:00.0"), PathClass::kSYS);
  EXPECT_EQ(PathByPci(*t, "0000:04:00.0", "0000:83:00.0"), PathClass::kPHB);
  EXPECT_EQ(PathByPci(*t, "0000:04:00.0", "0000:84:00.0"), PathClass::kPIX);
}

TEST(DiscoveryXmlTest, GroupNumaAndEs1000IsNotAGpu) {
  TopologyPtr t = LoadXml("96em64t-4n4d3ca2co-pci.xml");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->numa_nodes(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(t->gpus().empty()) << "ATI ES1000 1002:515e is a BMC VGA";
}

TEST(DiscoveryXmlTest, ManyVfsUsnic) {
  TopologyPtr t = LoadXml("16intel64-manyVFs.xml");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->hcas().size(), 3u);
  EXPECT_EQ(t->hcas()[0].name, "usnic_0");
  EXPECT_EQ(t->hcas()[2].place.numa, 1);
}

TEST(DiscoveryXmlTest, GpuFlagsOverrideDefaults) {
  DiscoveryOptions o;
  o.topology_xml = TestData("32em64t-2n8c2t-pci-normalio.xml");
  o.gpu_vendors = {0x10de};
  TopologyPtr t = Load(o);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->gpus().size(), 3u) << "the AMD Radeon is no longer a GPU vendor's";
  o.gpu_classes = {0x0300};
  o.gpu_vendors = {0x102b};
  t = Load(o);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->gpus().size(), 1u);
  EXPECT_EQ(t->gpus()[0].place.pci, "0000:05:03.0");
}

TEST(DiscoveryErrorTest, MissingAndMalformedXml) {
  DiscoveryOptions o;
  o.topology_xml = "/nonexistent/node.xml";
  auto t = Discover(o);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("/nonexistent/node.xml"));

  testing::TempDir dir;
  const std::string bad = dir.path() + "/bad.xml";
  std::ofstream(bad) << "<?xml version=\"1.0\"?><topology><object type=\"Machine\"";
  o.topology_xml = bad;
  t = Discover(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(bad));

  o.topology_xml = TestData("dgx-h100-like.xml");
  o.sysfs_root = "/nonexistent/sysroot";
  t = Discover(o);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("/nonexistent/sysroot"));
}

// hwloc 2.9.0 itself dies (NULL dereference) loading this XML, found by fuzz_hwloc_xml: the
// crash stays in the child that probes the file, and Discover names the file.
TEST(DiscoveryErrorTest, XmlThatCrashesHwlocIsAnError) {
  DiscoveryOptions o;
  o.topology_xml =
      TestData("../fuzz/regressions/hwloc_xml/hwloc-crashes-on-it.xml");
  auto t = Discover(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("hwloc-crashes-on-it.xml"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("hwloc crashed loading it"));
  // The process is fine: the next XML loads.
  o.topology_xml = TestData("dgx-h100-like.xml");
  EXPECT_TRUE(Discover(o).ok());
}

// dgx-h100-like.xml copied into `dir`, so that a test may change or remove it.
std::string CopyOfFixture(const testing::TempDir& dir) {
  const std::string xml = dir.path() + "/node.xml";
  std::filesystem::copy_file(TestData("dgx-h100-like.xml"), xml);
  return xml;
}

// A file that loaded is not probed again while unchanged; rewritten in place (same path), it is
// probed again: here with the XML that crashes hwloc, which must stay an error, not a crash.
TEST(DiscoveryErrorTest, XmlRewrittenInPlaceIsProbedAgain) {
  testing::TempDir dir;
  const std::string xml = CopyOfFixture(dir);
  DiscoveryOptions o;
  o.topology_xml = xml;
  ASSERT_TRUE(Discover(o).ok());
  ASSERT_TRUE(Discover(o).ok());
  std::filesystem::copy_file(
      TestData("../fuzz/regressions/hwloc_xml/hwloc-crashes-on-it.xml"), xml,
      std::filesystem::copy_options::overwrite_existing);
  auto t = Discover(o);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("hwloc crashed loading it"));
}

// An XML does not change under a running plugin: a Discoverer reads (and probes) it once, and
// re-discovery after a hotplug reuses it. Before, every re-discovery re-read and re-probed the
// file (forking the multi-threaded daemon for the probe).
TEST(DiscoveryXmlTest, DiscovererReadsTheXmlOnce) {
  testing::TempDir dir;
  const std::string xml = CopyOfFixture(dir);
  DiscoveryOptions o;
  o.topology_xml = xml;
  Discoverer discoverer(o);
  auto first = discoverer.Discover();
  ASSERT_TRUE(first.ok()) << first.status();
  std::filesystem::remove(xml);
  auto again = discoverer.Discover();
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ((*again)->hcas().size(), (*first)->hcas().size());
  EXPECT_EQ((*again)->gpus().size(), (*first)->gpus().size());
  EXPECT_FALSE(Discover(o).ok()) << "a new Discoverer reads the file again";
}

// What hwloc reads from the environment is pinned before main(): no dynamic plugins (the same
// XML parser and PCI discovery whether or not libhwloc-plugins is installed: with it, libxml2
// parsed XML, and this suite failed from a fresh clone), and nothing inherited replaces the
// source the flags choose. ctest also runs this binary with hostile values of each variable
// (discovery_test_hwloc_env).
TEST(HwlocEnvironmentTest, PinnedBeforeMain) {
  ASSERT_NE(std::getenv("HWLOC_PLUGINS_PATH"), nullptr);
  EXPECT_EQ(std::string(std::getenv("HWLOC_PLUGINS_PATH")), "");
  ASSERT_NE(std::getenv("HWLOC_LIBXML_IMPORT"), nullptr);
  EXPECT_EQ(std::string(std::getenv("HWLOC_LIBXML_IMPORT")), "0");
  for (const char* name : {"HWLOC_XMLFILE", "HWLOC_SYNTHETIC", "HWLOC_COMPONENTS"}) {
    EXPECT_EQ(std::getenv(name), nullptr) << name;
  }
}

TEST(DiscoveryParseTest, HexLists) {
  EXPECT_THAT(*ParseHexList("0x0302, 0300,10DE"), ElementsAre(0x0302u, 0x0300u, 0x10deu));
  EXPECT_FALSE(ParseHexList("").ok());
  EXPECT_FALSE(ParseHexList("0x").ok());
  EXPECT_FALSE(ParseHexList("nvidia").ok());
  EXPECT_FALSE(ParseHexList("123456789").ok());
}

// dgx-h100-like.xml laid out under `node`, and the options that discover it from both.
DiscoveryOptions LaidOutDgxH100Like(SysfsFixture& node) {
  TopologyPtr xml_only = LoadXml("dgx-h100-like.xml");
  EXPECT_TRUE(xml_only);
  if (xml_only) {
    EXPECT_TRUE(node.AddTopology(*xml_only).ok());
  }
  DiscoveryOptions o;
  o.topology_xml = TestData("dgx-h100-like.xml");
  o.sysfs_root = node.sysfs_root();
  o.dev_root = node.dev_root();
  return o;
}

// sysfs gives the HCAs (names, uverbs, ports), hwloc gives the tree, matched by PCI address.
TEST(DiscoveryMergeTest, SysfsOverXmlTree) {
  testing::TempDir dir;
  SysfsFixture node(dir.path());
  const DiscoveryOptions o = LaidOutDgxH100Like(node);
  // An HCA that hwloc does not know: still listed, placed from sysfs.
  FixtureHca extra;
  extra.name = "mlx5_9";
  extra.pci = "0000:e1:00.0";
  extra.numa = 1;
  extra.pcie_root = "pci0000:e0";
  extra.bridges = {"0000:e0:01.0"};
  ASSERT_TRUE(node.AddHca(extra).ok());
  ASSERT_TRUE(node.SetPortState("mlx5_3", 1, "DOWN").ok());
  TopologyPtr t = Load(o);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->hcas().size(), 10u);
  const Hca& h0 = t->hcas()[t->HcaIndex("0000:1a:00.0")];
  EXPECT_EQ(h0.uverbs, "uverbs0");
  EXPECT_EQ(h0.place.Switch(), "0000:16:00.0");
  EXPECT_TRUE(h0.place.bridges_known);
  EXPECT_THAT(h0.char_devices, Contains(Pair("/dev/infiniband/uverbs0", true)));
  EXPECT_THAT(h0.char_devices, Each(Pair(_, true)));
  EXPECT_FALSE(t->hcas()[t->HcaIndex("0000:3d:00.0")].AllPortsActive()) << "mlx5_3 port DOWN";
  const Hca& bond = t->hcas()[t->HcaIndex("0000:c9:00.0")];
  EXPECT_EQ(bond.name, "mlx5_bond_0");
  EXPECT_EQ(bond.ports[0].link_layer, "Ethernet");
  EXPECT_TRUE(bond.umad.empty());
  const Hca& e = t->hcas()[t->HcaIndex("0000:e1:00.0")];
  EXPECT_EQ(e.place.numa, 1);
  EXPECT_EQ(e.place.pcie_root, "pci0000:e0");
  EXPECT_FALSE(e.place.bridges_known);
  EXPECT_EQ(PathByPci(*t, "0000:e1:00.0", "0000:be:00.0"), PathClass::kNODE);
  EXPECT_EQ(PathByPci(*t, "0000:1a:00.0", "0000:19:00.0"), PathClass::kPIX);
}

// An SR-IOV VF that hwloc's export does not hold, and whose own numa_node the kernel does not
// know, sits where its PF sits: the PF's NUMA node, root and switch, its own address.
TEST(DiscoveryMergeTest, VirtualFunctionTakesItsPfsPlacement) {
  testing::TempDir dir;
  SysfsFixture node(dir.path());
  const DiscoveryOptions o = LaidOutDgxH100Like(node);
  FixtureHca vf;
  vf.name = "mlx5_9";
  vf.pci = "0000:1a:00.1";
  vf.physfn = "0000:1a:00.0";
  vf.device = "101e";
  ASSERT_TRUE(node.AddHca(vf).ok());
  std::ofstream(std::filesystem::path(dir.path()) /
                    "sys/bus/pci/devices/0000:1a:00.1/numa_node",
                std::ios::trunc)
      << "-1\n";
  TopologyPtr t = Load(o);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->hcas().size(), 10u);
  const Hca& pf = t->hcas()[t->HcaIndex("0000:1a:00.0")];
  const Hca& got = t->hcas()[t->HcaIndex("0000:1a:00.1")];
  EXPECT_EQ(got.name, "mlx5_9");
  EXPECT_EQ(got.physfn, "0000:1a:00.0");
  EXPECT_EQ(got.place.pci, "0000:1a:00.1");
  EXPECT_EQ(got.place.numa, 0);
  EXPECT_EQ(got.place.numa, pf.place.numa);
  EXPECT_EQ(got.place.pcie_root, "pci0000:15");
  EXPECT_TRUE(got.place.bridges_known);
  EXPECT_EQ(got.place.Switch(), "0000:16:00.0");
  EXPECT_EQ(PathByPci(*t, "0000:1a:00.1", "0000:18:00.0"), PathClass::kPIX);
  EXPECT_EQ(PathByPci(*t, "0000:1a:00.1", "0000:3a:00.0"), PathClass::kNODE);
  EXPECT_FALSE(pf.IsVirtualFunction());

  // A health scan that finds the VF new after a failed discovery places it by its PF as well.
  TopologyPtr without_vf = std::make_shared<const Topology>(
      Topology::WithNumaNodes(t->all_numa_nodes(), {pf}, t->gpus()));
  auto raw = ReadSysfsHcas(dir.path(), dir.path());
  ASSERT_TRUE(raw.ok()) << raw.status();
  TopologyPtr rescued = WithScannedHcas(*without_vf, *raw);
  const Hca& rescued_vf = rescued->hcas()[rescued->HcaIndex("0000:1a:00.1")];
  EXPECT_EQ(rescued_vf.place.Switch(), "0000:16:00.0");
  EXPECT_EQ(rescued_vf.place.numa, 0);
  EXPECT_EQ(rescued_vf.place.pci, "0000:1a:00.1");
}

// The node with roles (sim::LayOutNamedNode "dgx-roles"): discovery fills every identity field,
// tells the compute, storage and VF functions apart and places each.
TEST(DiscoveryMergeTest, NodeWithRoles) {
  testing::TempDir dir;
  auto laid = sim::LayOutNamedNode(dir.path(), "dgx-roles");
  ASSERT_TRUE(laid.ok()) << laid.status();
  DiscoveryOptions o;
  o.topology_xml = laid->xml;
  o.sysfs_root = laid->root;
  o.dev_root = laid->root;
  TopologyPtr t = Load(o);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->hcas().size(), 10u);
  EXPECT_EQ(t->gpus().size(), 8u);
  int compute = 0, storage = 0, vfs = 0;
  for (std::size_t i = 0; i < t->hcas().size(); ++i) {
    const Hca& h = t->hcas()[i];
    SCOPED_TRACE(h.name);
    EXPECT_EQ(h.vendor, "15b3");
    EXPECT_EQ(h.driver, "mlx5_core");
    EXPECT_EQ(h.firmware_version, "28.39.1002");
    EXPECT_FALSE(h.node_guid.empty());
    EXPECT_FALSE(h.uverbs.empty());
    ASSERT_EQ(h.ports.size(), 1u);
    EXPECT_EQ(h.device, h.IsVirtualFunction() ? "101e" : "1021");
    if (h.IsVirtualFunction()) {
      ++vfs;
      EXPECT_EQ(h.physfn, "0000:15:00.0");
      EXPECT_EQ(h.place.numa, 0);
      EXPECT_EQ(h.place.Switch(), t->hcas()[t->HcaIndex("0000:15:00.0")].place.Switch());
      EXPECT_EQ(h.ports[0].link_layer, "InfiniBand");
    } else if (h.ports[0].link_layer == "InfiniBand") {
      ++compute;
      EXPECT_EQ(h.netdev_link_type, "infiniband");
      // On a switch with two GPUs.
      int pix = 0;
      for (std::size_t g = 0; g < t->gpus().size(); ++g) pix += t->Path(i, g) == PathClass::kPIX;
      EXPECT_EQ(pix, 2);
      EXPECT_NE(h.place.Switch(), "");
    } else {
      ++storage;
      EXPECT_EQ(h.ports[0].link_layer, "Ethernet");
      EXPECT_EQ(h.netdev_link_type, "ether");
      ASSERT_EQ(h.netdevs.size(), 1u);
      EXPECT_THAT(h.netdevs[0], ::testing::MatchesRegex("ens[37]f[01]np[01]"));
      EXPECT_EQ(h.place.Switch(), "");
    }
  }
  EXPECT_EQ(compute, 4);
  EXPECT_EQ(storage, 4);
  EXPECT_EQ(vfs, 2);
  const Hca& vf0 = t->hcas()[t->HcaIndex("0000:15:00.1")];
  EXPECT_EQ(vf0.name, "mlx5_8");
  EXPECT_THAT(vf0.netdevs, ElementsAre("ibp21s0f1"));
  const Hca& vf1 = t->hcas()[t->HcaIndex("0000:15:00.2")];
  EXPECT_EQ(vf1.name, "mlx5_9");
  EXPECT_TRUE(vf1.netdevs.empty());
  EXPECT_EQ(vf1.netdev_link_type, "");
  // What LayOutNamedNode says the node is, discovery finds.
  ASSERT_EQ(laid->topology->hcas().size(), t->hcas().size());
  for (std::size_t i = 0; i < t->hcas().size(); ++i) {
    EXPECT_EQ(laid->topology->hcas()[i].name, t->hcas()[i].name);
    EXPECT_EQ(laid->topology->hcas()[i].physfn, t->hcas()[i].physfn);
  }

  // From the XML alone: the eight PFs, with what an export holds of their identity.
  TopologyPtr xml_only = Load([&] {
    DiscoveryOptions x;
    x.topology_xml = laid->xml;
    return x;
  }());
  ASSERT_TRUE(xml_only);
  ASSERT_EQ(xml_only->hcas().size(), 8u);
  for (const Hca& h : xml_only->hcas()) {
    EXPECT_EQ(h.vendor, "15b3") << h.name;
    EXPECT_EQ(h.device, "1021") << h.name;
    EXPECT_FALSE(h.node_guid.empty()) << h.name;
    EXPECT_EQ(h.driver, "") << h.name;
    EXPECT_FALSE(h.IsVirtualFunction()) << h.name;
  }
}

TEST(DiscoveryMergeTest, UnknownNamedNodeIsRefusedNamingTheKnownOnes) {
  testing::TempDir dir;
  auto laid = sim::LayOutNamedNode(dir.path(), "dgx-nope");
  ASSERT_FALSE(laid.ok());
  EXPECT_EQ(laid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(laid.status().message(), HasSubstr("dgx-nope"));
  EXPECT_THAT(laid.status().message(), HasSubstr("dgx-roles"));
}

// An HCA placed below the DGX-2's NVSwitch PLX switch, a second-level switch of the outer one.
TEST(DiscoveryMergeTest, TwoLevelSwitchesFromSysfsAndXml) {
  testing::TempDir dir;
  SysfsFixture node(dir.path());
  FixtureHca h;
  h.name = "mlx5_0";
  h.pci = "0000:66:00.0";
  h.numa = 0;
  h.pcie_root = "pci0000:4e";
  h.bridges = {"0000:4e:00.0", "0000:4f:00.0", "0000:50:10.0", "0000:5f:00.0", "0000:60:0b.0"};
  ASSERT_TRUE(node.AddHca(h).ok());
  DiscoveryOptions o;
  o.topology_xml = TestData("nvidiaDGX2.xml");
  o.sysfs_root = dir.path();
  o.dev_root = dir.path();
  TopologyPtr t = Load(o);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->hcas().size(), 1u);
  EXPECT_EQ(t->hcas()[0].place.Switch(), "0000:5f:00.0");
  EXPECT_EQ(PathByPci(*t, "0000:66:00.0", "0000:57:00.0"), PathClass::kPXB);
  EXPECT_EQ(PathByPci(*t, "0000:66:00.0", "0000:34:00.0"), PathClass::kNODE);
  EXPECT_EQ(PathByPci(*t, "0000:66:00.0", "0000:e7:00.0"), PathClass::kSYS);
}

// sysfs says numa_node -1; hwloc knows the device sits under a Group with one NUMA node.
TEST(DiscoveryMergeTest, NumaFromHwlocWhenSysfsUnknown) {
  testing::TempDir dir;
  SysfsFixture node(dir.path());
  FixtureHca h;
  h.name = "mlx5_0";
  h.pci = "0000:62:00.0";
  h.numa = -1;
  h.pcie_root = "pci0000:60";
  ASSERT_TRUE(node.AddHca(h).ok());
  DiscoveryOptions o;
  o.topology_xml = TestData("96em64t-4n4d3ca2co-pci.xml");
  o.sysfs_root = dir.path();
  TopologyPtr t = Load(o);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->hcas().size(), 1u);
  EXPECT_EQ(t->hcas()[0].place.numa, 2);
}

}  // namespace
}  // namespace rdp::topology
