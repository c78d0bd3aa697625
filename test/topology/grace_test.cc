// Discovery on Grace-class nodes (test/data/gen_grace_nodes.py): CPU-less NUMA nodes of GPU
// memory and MIG reserve, a PCI domain per root complex, and NUMA IDs that are not contiguous.
// Each node through the XML alone and through the kernel's view (a fixture sysfs over the XML).

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/sysfs_fixture.h"
#include "test/support/temp_dir.h"
#include "test/topology/load.h"
#include "topology/discovery.h"

namespace rdp::topology {
namespace {
using ::testing::ElementsAre;
using testing::Load;
using testing::LoadXml;
using testing::TestData;


// The node laid out as `rdma-device-plugin fixture` lays it out (from its XML alone), then
// discovered with that sysfs over the XML; `edit` may change the tree in between.
struct KernelView {
  testing::TempDir dir;
  DiscoveryOptions options;

  explicit KernelView(const std::string& file) {
    TopologyPtr xml_only = LoadXml(file);
    EXPECT_TRUE(xml_only);
    if (xml_only) {
      EXPECT_TRUE(sim::SysfsFixture(dir.path()).AddTopology(*xml_only).ok());
    }
    options.topology_xml = TestData(file);
    options.sysfs_root = dir.path();
    options.dev_root = dir.path();
  }
  void Write(const std::string& path, const std::string& text) {
    std::ofstream(dir.path() + path, std::ios::trunc) << text << "\n";
  }
  TopologyPtr Discover() { return Load(options); }
};

int NumaOfGpu(const Topology& t, const std::string& pci) {
  const int i = t.GpuIndex(pci);
  return i < 0 ? -2 : t.gpus()[i].place.numa.value_or(-1);
}
int NumaOfHca(const Topology& t, const std::string& pci) {
  const int i = t.HcaIndex(pci);
  return i < 0 ? -2 : t.hcas()[i].place.numa.value_or(-1);
}
PathClass PathByPci(const Topology& t, const std::string& hca, const std::string& gpu) {
  return t.Path(t.HcaIndex(hca), t.GpuIndex(gpu));
}

std::vector<int> CpulessIds(const Topology& t) {
  std::vector<int> out;
  for (const NumaNode& n : t.all_numa_nodes()) {
    if (!n.has_cpus) out.push_back(n.id);
  }
  return out;
}

// What is right on a GB200 compute tray, however it was discovered.
void ExpectGb200(const Topology& t) {
  EXPECT_THAT(t.numa_nodes(), ElementsAre(0, 1));
  EXPECT_THAT(CpulessIds(t), ElementsAre(2, 3, 4, 5));
  ASSERT_EQ(t.all_numa_nodes().size(), 6u);
  EXPECT_EQ(t.all_numa_nodes()[0].cpus, "0-71");
  EXPECT_EQ(t.all_numa_nodes()[1].cpus, "72-143");
  ASSERT_EQ(t.gpus().size(), 4u);
  ASSERT_EQ(t.hcas().size(), 4u);
  for (const char* gpu : {"0008:01:00.0", "0009:01:00.0"}) EXPECT_EQ(NumaOfGpu(t, gpu), 0) << gpu;
  for (const char* gpu : {"0018:01:00.0", "0019:01:00.0"}) EXPECT_EQ(NumaOfGpu(t, gpu), 1) << gpu;
  for (const char* hca : {"0000:01:00.0", "0002:01:00.0"}) EXPECT_EQ(NumaOfHca(t, hca), 0) << hca;
  for (const char* hca : {"0010:01:00.0", "0012:01:00.0"}) EXPECT_EQ(NumaOfHca(t, hca), 1) << hca;
  // Every device alone on its own root complex: NODE on its socket, SYS across.
  for (const Hca& h : t.hcas()) {
    EXPECT_EQ(h.place.pcie_root, "pci" + h.place.pci.substr(0, 4) + ":00") << h.name;
    EXPECT_EQ(h.place.Switch(), "") << h.name;
    for (const Gpu& g : t.gpus()) {
      const PathClass want = h.place.numa == g.place.numa ? PathClass::kNODE : PathClass::kSYS;
      EXPECT_EQ(PathByPci(t, h.place.pci, g.place.pci), want) << h.name << " " << g.place.pci;
    }
  }
  EXPECT_EQ(t.hcas()[0].name, "mlx5_0");
  EXPECT_EQ(t.hcas()[0].place.pci, "0000:01:00.0");
  EXPECT_EQ(t.hcas()[2].place.pci, "0010:01:00.0");
  EXPECT_EQ(t.gpus()[0].pci_class, "0302");
}

TEST(GraceDiscoveryTest, Gb200TrayFromXmlAlone) {
  TopologyPtr t = LoadXml("gb200-tray.xml");
  ASSERT_TRUE(t);
  ExpectGb200(*t);
  EXPECT_EQ(t->all_numa_nodes()[2].memory_kind, "GPUMemory");
}

TEST(GraceDiscoveryTest, Gb200TrayFromTheKernelsView) {
  KernelView node("gb200-tray.xml");
  TopologyPtr t = node.Discover();
  ASSERT_TRUE(t);
  ExpectGb200(*t);
  EXPECT_EQ(t->hcas()[0].uverbs, "uverbs0") << "the HCAs come from sysfs";
}

// Several functions are 01:00.0 of their domain: an address without a domain names none of them.
TEST(GraceDiscoveryTest, AnAddressWithoutItsDomainIsAmbiguous) {
  TopologyPtr t = LoadXml("gb200-tray.xml");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->HcaIndex("01:00.0"), -1);
  EXPECT_EQ(t->GpuIndex("01:00.0"), -1);
  EXPECT_EQ(t->HcaIndex("0010:01:00.0"), 2);
  EXPECT_EQ(t->GpuIndex("0019:01:00.0"), 3);
  EXPECT_EQ(t->GpuIndex("0000:01:00.0"), -1) << "an HCA's address";
}

// The kernel's numa_node decides for every device, GPUs included, unless it names a node
// without CPUs; its cpulists decide which nodes have CPUs.
TEST(GraceDiscoveryTest, TheKernelsNumaNodeUnlessItHasNoCpus) {
  KernelView node("gb200-tray.xml");
  node.Write("/sys/bus/pci/devices/0008:01:00.0/numa_node", "1");  // not what hwloc says
  node.Write("/sys/bus/pci/devices/0009:01:00.0/numa_node", "3");  // its memory: no CPUs
  node.Write("/sys/bus/pci/devices/0018:01:00.0/numa_node", "-1");
  TopologyPtr t = node.Discover();
  ASSERT_TRUE(t);
  EXPECT_EQ(NumaOfGpu(*t, "0008:01:00.0"), 1);
  EXPECT_EQ(NumaOfGpu(*t, "0009:01:00.0"), 0) << "hwloc's locality, reduced to CPU nodes";
  EXPECT_EQ(NumaOfGpu(*t, "0018:01:00.0"), 1);
}

// A node hwloc cannot tell apart from a CPU node (no subtype, same locality) is CPU-less when the
// kernel's cpulist is empty.
TEST(GraceDiscoveryTest, TheKernelsCpulistDecidesWhichNodesHaveCpus) {
  KernelView node("gb200-tray.xml");
  node.Write("/sys/devices/system/node/node1/cpulist", "");
  TopologyPtr t = node.Discover();
  ASSERT_TRUE(t);
  EXPECT_THAT(t->numa_nodes(), ElementsAre(0));
  // Socket 1's devices: the kernel still says 1, which has no CPUs, and their locality names
  // no other node with CPUs.
  EXPECT_EQ(NumaOfGpu(*t, "0018:01:00.0"), -1);
  EXPECT_EQ(NumaOfHca(*t, "0010:01:00.0"), -1);
  EXPECT_EQ(NumaOfGpu(*t, "0008:01:00.0"), 0);
}

void ExpectGh200(const Topology& t) {
  EXPECT_THAT(t.numa_nodes(), ElementsAre(0));
  EXPECT_THAT(CpulessIds(t), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9));
  ASSERT_EQ(t.gpus().size(), 1u);
  EXPECT_EQ(NumaOfGpu(t, "0009:01:00.0"), 0);
  ASSERT_EQ(t.hcas().size(), 2u);
  for (const Hca& h : t.hcas()) {
    EXPECT_EQ(h.place.numa, 0) << h.name;
    EXPECT_EQ(PathByPci(t, h.place.pci, "0009:01:00.0"), PathClass::kNODE) << h.name;
  }
}

// GPU memory beside the CPU node, and the MIG reserve attached to the Machine.
TEST(GraceDiscoveryTest, Gh200FromXmlAlone) {
  TopologyPtr t = LoadXml("gh200.xml");
  ASSERT_TRUE(t);
  ExpectGh200(*t);
  EXPECT_EQ(t->all_numa_nodes()[1].memory_kind, "GPUMemory");
  EXPECT_EQ(t->all_numa_nodes()[2].memory_kind, "");
}

TEST(GraceDiscoveryTest, Gh200FromTheKernelsView) {
  KernelView node("gh200.xml");
  TopologyPtr t = node.Discover();
  ASSERT_TRUE(t);
  ExpectGh200(*t);
}

void ExpectPower9(const Topology& t) {
  EXPECT_THAT(t.numa_nodes(), ElementsAre(0, 8));
  EXPECT_TRUE(CpulessIds(t).empty());
  for (const char* gpu : {"0004:01:00.0", "0005:01:00.0"}) EXPECT_EQ(NumaOfGpu(t, gpu), 0) << gpu;
  for (const char* gpu : {"0034:01:00.0", "0035:01:00.0"}) EXPECT_EQ(NumaOfGpu(t, gpu), 8) << gpu;
  EXPECT_EQ(NumaOfHca(t, "0003:01:00.0"), 0);
  EXPECT_EQ(NumaOfHca(t, "0033:01:00.0"), 8);
  EXPECT_EQ(PathByPci(t, "0033:01:00.0", "0034:01:00.0"), PathClass::kNODE);
  EXPECT_EQ(PathByPci(t, "0033:01:00.0", "0004:01:00.0"), PathClass::kSYS);
}

TEST(GraceDiscoveryTest, Power9NumaZeroAndEight) {
  TopologyPtr t = LoadXml("power9-numa-0-8.xml");
  ASSERT_TRUE(t);
  ExpectPower9(*t);
  KernelView node("power9-numa-0-8.xml");
  t = node.Discover();
  ASSERT_TRUE(t);
  ExpectPower9(*t);
}

// What the fixture lays out of the kernel's view: the GPUs' functions, /sys/bus/pci links and
// the NUMA nodes' cpulists.
TEST(GraceDiscoveryTest, FixtureLaysOutTheKernelsView) {
  KernelView node("gb200-tray.xml");
  auto read = [&](const std::string& path) {
    std::ifstream in(node.dir.path() + path);
    std::string line;
    std::getline(in, line);
    return in ? line : std::string("<missing>");
  };
  EXPECT_EQ(read("/sys/devices/system/node/node0/cpulist"), "0-71");
  EXPECT_EQ(read("/sys/devices/system/node/node3/cpulist"), "");
  EXPECT_EQ(read("/sys/bus/pci/devices/0019:01:00.0/numa_node"), "1");
  EXPECT_EQ(read("/sys/bus/pci/devices/0019:01:00.0/class"), "0x030200");
  EXPECT_EQ(read("/sys/bus/pci/devices/0010:01:00.0/numa_node"), "1");
  namespace fs = std::filesystem;
  EXPECT_EQ(fs::canonical(node.dir.path() + "/sys/bus/pci/devices/0019:01:00.0"),
            fs::canonical(node.dir.path() + "/sys/devices/pci0019:00/0019:00:00.0/0019:01:00.0"));
}

// A health scan after a failed discovery (WithScannedHcas): the HCAs the last snapshot had keep
// its placements, whatever the scan read; a new one is on the kernel's numa_node unless that node
// has no CPUs; the nodes without CPUs and the GPUs stay.
TEST(GraceDiscoveryTest, ScannedHcasArePlacedAsLastDiscovered) {
  KernelView node("gb200-tray.xml");
  TopologyPtr last = node.Discover();
  ASSERT_TRUE(last);
  absl::StatusOr<std::vector<Hca>> scanned =
      ReadSysfsHcas(node.options.sysfs_root, node.options.dev_root);
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  ASSERT_EQ(scanned->size(), 4u);
  (*scanned)[1].place.numa = 2;  // what firmware might say: the GPU memory beside it
  auto added = [&](const std::string& name, const std::string& pci, std::optional<int> numa) {
    Hca h = scanned->front();
    h.name = name;
    h.place.pci = pci;
    h.place.numa = numa;
    scanned->push_back(h);
  };
  added("mlx5_4", "0020:01:00.0", 3);  // a node without CPUs: unknown
  added("mlx5_5", "0021:01:00.0", 1);
  added("mlx5_6", "0022:01:00.0", 8);  // a node the last snapshot did not know

  TopologyPtr t = WithScannedHcas(*last, *scanned);
  ASSERT_EQ(t->hcas().size(), 7u);
  for (std::size_t i = 0; i < last->hcas().size(); ++i) {
    const Hca& was = last->hcas()[i];
    const Hca& now = t->hcas()[t->HcaIndex(was.place.pci)];
    EXPECT_EQ(now.place.numa, was.place.numa) << was.name;
    EXPECT_EQ(now.place.pcie_root, was.place.pcie_root) << was.name;
    EXPECT_TRUE(now.place.bridges_known) << was.name;
    EXPECT_EQ(now.place.bridges.size(), was.place.bridges.size()) << was.name;
  }
  EXPECT_EQ(NumaOfHca(*t, "0002:01:00.0"), 0);
  EXPECT_EQ(NumaOfHca(*t, "0020:01:00.0"), -1);
  EXPECT_EQ(NumaOfHca(*t, "0021:01:00.0"), 1);
  EXPECT_EQ(NumaOfHca(*t, "0022:01:00.0"), 8);
  EXPECT_THAT(t->numa_nodes(), ElementsAre(0, 1, 8));
  EXPECT_THAT(CpulessIds(*t), ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(t->gpus().size(), 4u);
  EXPECT_EQ(PathByPci(*t, "0010:01:00.0", "0018:01:00.0"), PathClass::kNODE);
}

}  // namespace
}  // namespace rdp::topology
