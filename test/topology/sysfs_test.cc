// sysfs discovery on trees laid out the way the kernel lays them out.

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/support/temp_dir.h"
#include "topology/discovery.h"
#include "sim/sysfs_fixture.h"

namespace rdp::topology {
namespace {
using sim::FixtureHca;
using sim::FixturePort;
using sim::SysfsFixture;
namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

FixtureHca IbHca(const std::string& name, const std::string& pci, int numa) {
  FixtureHca h;
  h.name = name;
  h.pci = pci;
  h.numa = numa;
  h.pcie_root = "pci0000:" + pci.substr(5, 2);
  h.bridges = {"0000:" + pci.substr(5, 2) + ":01.0"};
  h.netdevs = {"ib" + name.substr(name.size() - 1)};
  return h;
}

const Hca* ByName(const std::vector<Hca>& hcas, const std::string& name) {
  for (const Hca& h : hcas) {
    if (h.name == name) return &h;
  }
  return nullptr;
}

class SysfsTest : public ::testing::Test {
 protected:
  testing::TempDir dir_;
  SysfsFixture node_{dir_.path()};
};

TEST_F(SysfsTest, InfiniBandHcaWithUmadAndIssm) {
  FixtureHca h = IbHca("mlx5_0", "0000:1a:00.0", 0);
  h.ports.push_back(FixturePort{2, "ACTIVE", "LinkUp", "InfiniBand", "200 Gb/sec (4X HDR)"});
  ASSERT_TRUE(node_.AddHca(h).ok());
  ASSERT_TRUE(node_.AddRdmaCm().ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 1u);
  const Hca& got = hcas->front();
  EXPECT_EQ(got.name, "mlx5_0");
  EXPECT_EQ(got.place.pci, "0000:1a:00.0");
  EXPECT_EQ(got.place.numa, 0);
  EXPECT_EQ(got.place.pcie_root, "pci0000:1a");
  EXPECT_FALSE(got.place.bridges_known);
  EXPECT_EQ(got.uverbs, "uverbs0");
  EXPECT_THAT(got.umad, ElementsAre("umad0", "umad1"));
  EXPECT_THAT(got.issm, ElementsAre("issm0", "issm1"));
  EXPECT_THAT(got.netdevs, ElementsAre("ib0"));
  ASSERT_EQ(got.ports.size(), 2u);
  EXPECT_EQ(got.ports[0].state, "ACTIVE");
  EXPECT_EQ(got.ports[0].phys_state, "LinkUp");
  EXPECT_EQ(got.ports[0].link_layer, "InfiniBand");
  EXPECT_EQ(got.ports[1].rate, "200 Gb/sec (4X HDR)");
  EXPECT_TRUE(got.AllPortsActive());
  EXPECT_THAT(got.char_devices, ElementsAre(Pair("/dev/infiniband/uverbs0", true),
                                            Pair("/dev/infiniband/umad0", true),
                                            Pair("/dev/infiniband/umad1", true),
                                            Pair("/dev/infiniband/issm0", true),
                                            Pair("/dev/infiniband/issm1", true)));
}

TEST_F(SysfsTest, BondedRoceWithoutUmad) {
  FixtureHca h = IbHca("mlx5_bond_0", "0000:c9:00.0", 1);
  h.pcie_root = "pci0000:c8";
  h.bridges = {"0000:c8:01.0"};
  h.ports = {FixturePort{1, "ACTIVE", "LinkUp", "Ethernet", "400 Gb/sec (4X NDR)"}};
  h.umad = false;
  h.netdevs = {"ens6f0np0"};
  ASSERT_TRUE(node_.AddHca(h).ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 1u);
  EXPECT_EQ((*hcas)[0].name, "mlx5_bond_0");
  EXPECT_EQ((*hcas)[0].place.pcie_root, "pci0000:c8");
  EXPECT_TRUE((*hcas)[0].umad.empty());
  EXPECT_EQ((*hcas)[0].ports[0].link_layer, "Ethernet");
  EXPECT_THAT((*hcas)[0].netdevs, ElementsAre("ens6f0np0"));
  ASSERT_FALSE((*hcas)[0].uverbs.empty());
  EXPECT_THAT((*hcas)[0].char_devices,
              ElementsAre(Pair("/dev/infiniband/" + (*hcas)[0].uverbs, true)));
}

// A RoCE port's GID table as mlx5 fills it for a netdev with an IPv6 link-local address, a
// global IPv6 address and (when `ipv4`) an IPv4 address: each address once as RoCE v1 and once as
// RoCE v2, in the order the kernel adds them; `v1_only` keeps only the RoCE v1 entries.
std::vector<sim::FixtureGid> RoceGids(const std::string& netdev, bool ipv4, bool v1_only = false) {
  const std::string link_local = "fe80:0000:0000:0000:0a5c:3cff:fe2b:91e4";
  const std::string global6 = "2001:0db8:0000:0000:0a5c:3cff:fe2b:91e4";
  std::vector<std::string> addresses = {link_local, global6};
  if (ipv4) addresses.push_back(sim::Ipv4Gid("192.0.2.10"));
  std::vector<sim::FixtureGid> out;
  int index = 0;
  for (const std::string& gid : addresses) {
    for (const char* type : {"IB/RoCE v1", "RoCE v2"}) {
      if (v1_only && std::string(type) == "RoCE v2") {
        ++index;  // the entry stays unused
        continue;
      }
      out.push_back({index++, gid, type, netdev});
    }
  }
  return out;
}

FixtureHca RoceHca(std::vector<sim::FixtureGid> gids) {
  FixtureHca h = IbHca("mlx5_2", "0000:c9:00.0", 1);
  h.ports = {FixturePort{1, "ACTIVE", "LinkUp", "Ethernet", "400 Gb/sec (4X NDR)"}};
  h.ports[0].gids = std::move(gids);
  h.umad = false;
  h.netdevs = {"ens6f0np0"};
  return h;
}

TEST_F(SysfsTest, RoceV2GidWithIpv4IsFound) {
  ASSERT_TRUE(node_.AddHca(RoceHca(RoceGids("ens6f0np0", /*ipv4=*/true))).ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  const Port& port = hcas->at(0).ports.at(0);
  EXPECT_EQ(port.roce_v2_ipv4_gid, 5);  // 0-1 link-local, 2-3 global IPv6, 4 v1 IPv4, 5 v2 IPv4
  EXPECT_EQ(port.gid_ipv4, "192.0.2.10");
  EXPECT_EQ(port.gid_netdev, "ens6f0np0");
}

TEST_F(SysfsTest, RoceWithOnlyIpv6HasNoGidIndex) {
  ASSERT_TRUE(node_.AddHca(RoceHca(RoceGids("ens6f0np0", /*ipv4=*/false))).ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  const Port& port = hcas->at(0).ports.at(0);
  EXPECT_EQ(port.roce_v2_ipv4_gid, std::nullopt);
  EXPECT_EQ(port.gid_ipv4, "");
  EXPECT_EQ(port.gid_netdev, "");
}

TEST_F(SysfsTest, RoceV1OnlyHasNoGidIndex) {
  ASSERT_TRUE(node_.AddHca(RoceHca(RoceGids("ens6f0np0", /*ipv4=*/true, /*v1_only=*/true))).ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  EXPECT_EQ(hcas->at(0).ports.at(0).roce_v2_ipv4_gid, std::nullopt);
}

TEST_F(SysfsTest, InfiniBandPortsHaveNoRoceGid) {
  FixtureHca h = IbHca("mlx5_0", "0000:1a:00.0", 0);
  // An IB port's table holds IB GIDs (subnet prefix + GUID); even an entry that looked like an
  // IPv4-mapped one is not RoCE.
  h.ports[0].gids = {{0, sim::Ipv4Gid("192.0.2.10"), "RoCE v2", ""}};
  ASSERT_TRUE(node_.AddHca(h).ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  EXPECT_EQ(hcas->at(0).ports.at(0).roce_v2_ipv4_gid, std::nullopt);
}

TEST_F(SysfsTest, MalformedGidsAreSkipped) {
  ASSERT_TRUE(node_.AddHca(RoceHca({{0, "0000:0000:0000:0000:0000:ffff:c000", "RoCE v2", "e"},
                                    {1, "0000:0000:0000:0000:0000:ffff:c000:zz0a", "RoCE v2", "e"},
                                    {2, "0000:0000:0000:0000:0001:ffff:c000:020a", "RoCE v2", "e"},
                                    {3, sim::Ipv4Gid("198.51.100.7"), "RoCE v2", "e"}}))
                  .ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  EXPECT_EQ(hcas->at(0).ports.at(0).roce_v2_ipv4_gid, 3);
  EXPECT_EQ(hcas->at(0).ports.at(0).gid_ipv4, "198.51.100.7");
}

TEST_F(SysfsTest, PortDownNumaUnknownAndMissingUverbs) {
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_0", "0000:1a:00.0", -1)).ok());
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_1", "0000:1b:00.0", 0)).ok());
  ASSERT_TRUE(node_.SetPortState("mlx5_0", 1, "DOWN").ok());
  ASSERT_TRUE(node_.RemoveUverbs("mlx5_1").ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok());
  const Hca* h0 = ByName(*hcas, "mlx5_0");
  const Hca* h1 = ByName(*hcas, "mlx5_1");
  ASSERT_TRUE(h0 && h1);
  EXPECT_EQ(h0->place.numa, std::nullopt);
  EXPECT_EQ(h0->ports[0].state, "DOWN");
  EXPECT_FALSE(h0->AllPortsActive());
  EXPECT_TRUE(h1->AllPortsActive());
  ASSERT_FALSE(h1->uverbs.empty());
  EXPECT_THAT(h1->char_devices, Contains(Pair("/dev/infiniband/" + h1->uverbs, false)));
}

TEST_F(SysfsTest, BrokenDevicesAreSkippedOthersKept) {
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_0", "0000:1a:00.0", 0)).ok());
  const fs::path klass = fs::path(dir_.path()) / "sys/class/infiniband";
  // A dangling class link (device removed mid-scan) and a non-PCI device (like scif0).
  fs::create_symlink("../../devices/pci0000:99/0000:99:01.0/0000:9a:00.0/infiniband/mlx5_9",
                     klass / "mlx5_9");
  fs::create_directories(fs::path(dir_.path()) / "sys/devices/virtual/scif_dma_0/infiniband/scif0");
  fs::create_symlink("../../devices/virtual/scif_dma_0/infiniband/scif0", klass / "scif0");
  fs::create_symlink("..", fs::path(dir_.path()) / "sys/devices/virtual/scif_dma_0/infiniband/scif0/device");
  // A port whose state cannot be read: the HCA stays, the port counts as not ACTIVE.
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_2", "0000:1c:00.0", 0)).ok());
  fs::remove(fs::path(dir_.path()) /
             "sys/devices/pci0000:1c/0000:1c:01.0/0000:1c:00.0/infiniband/mlx5_2/ports/1/state");
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 2u);
  EXPECT_EQ((*hcas)[0].name, "mlx5_0");
  EXPECT_EQ((*hcas)[1].name, "mlx5_2");
  EXPECT_EQ((*hcas)[1].ports[0].state, "");
  EXPECT_FALSE((*hcas)[1].AllPortsActive());
}

// The PCI function's and the RDMA device's identity, as the kernel shows them.
TEST_F(SysfsTest, IdentityOfEachHca) {
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_0", "0000:1a:00.0", 0)).ok());
  FixtureHca roce = IbHca("mlx5_1", "0000:1b:00.0", 0);
  roce.ports[0].link_layer = "Ethernet";
  roce.netdevs = {"ens3f0np0"};
  roce.device = "101D";  // sysfs prints lower case; the reader normalises either
  roce.firmware_version = "22.36.1010";
  roce.node_guid = "b8ce:f603:00a1:b2c4";
  ASSERT_TRUE(node_.AddHca(roce).ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 2u);
  const Hca& ib = (*hcas)[0];
  EXPECT_EQ(ib.vendor, "15b3");
  EXPECT_EQ(ib.device, "1021");
  EXPECT_EQ(ib.driver, "mlx5_core");
  EXPECT_EQ(ib.firmware_version, "28.39.1002");
  EXPECT_EQ(ib.node_guid, sim::FixtureNodeGuid("0000:1a:00.0"));
  EXPECT_EQ(ib.node_guid, "b8ce:f600:001a:0000");
  EXPECT_EQ(ib.netdev_link_type, "infiniband");
  EXPECT_EQ(ib.physfn, "");
  EXPECT_FALSE(ib.IsVirtualFunction());
  const Hca& eth = (*hcas)[1];
  EXPECT_EQ(eth.device, "101d");
  EXPECT_EQ(eth.firmware_version, "22.36.1010");
  EXPECT_EQ(eth.node_guid, "b8ce:f603:00a1:b2c4");
  EXPECT_EQ(eth.netdev_link_type, "ether");
}

// An SR-IOV VF: a PCI function with a physfn link to its PF (and the PF's virtfnN link to it),
// an RDMA device of its own, here without a netdev.
TEST_F(SysfsTest, VirtualFunctionNamesItsPf) {
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_0", "0000:1a:00.0", 0)).ok());
  FixtureHca vf;
  vf.name = "mlx5_2";
  vf.pci = "0000:1a:00.1";
  vf.physfn = "0000:1a:00.0";
  vf.device = "101e";
  ASSERT_TRUE(node_.AddHca(vf).ok());
  const fs::path pf_dir = fs::path(dir_.path()) / "sys/devices/pci0000:1a/0000:1a:01.0/0000:1a:00.0";
  EXPECT_EQ(fs::canonical(pf_dir / "virtfn0"), fs::canonical(pf_dir.parent_path() / "0000:1a:00.1"));
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 2u);
  const Hca* got = ByName(*hcas, "mlx5_2");
  ASSERT_NE(got, nullptr);
  EXPECT_TRUE(got->IsVirtualFunction());
  EXPECT_EQ(got->physfn, "0000:1a:00.0");
  EXPECT_EQ(got->device, "101e");
  EXPECT_EQ(got->uverbs, "uverbs1");
  EXPECT_TRUE(got->netdevs.empty());
  EXPECT_EQ(got->netdev_link_type, "") << "no netdev, no link type";
  EXPECT_EQ(got->place.pcie_root, "pci0000:1a") << "laid out beside its PF";
  EXPECT_FALSE(ByName(*hcas, "mlx5_0")->IsVirtualFunction());
  // A VF whose PF is not laid out is refused by the fixture, naming both.
  vf.name = "mlx5_3";
  vf.pci = "0000:1c:00.1";
  vf.physfn = "0000:1c:00.0";
  const absl::Status no_pf = node_.AddHca(vf);
  EXPECT_EQ(no_pf.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_pf.message(), HasSubstr("0000:1c:00.0"));
}

// Every identity file missing, unreadable as a number or dangling: the fields are "", the HCA
// is listed with everything else it has.
TEST_F(SysfsTest, MissingIdentityFilesLeaveFieldsEmpty) {
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_0", "0000:1a:00.0", 0)).ok());
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_1", "0000:1b:00.0", 0)).ok());
  const fs::path dev = fs::path(dir_.path()) / "sys/devices/pci0000:1a/0000:1a:01.0/0000:1a:00.0";
  for (const char* file : {"vendor", "driver", "infiniband/mlx5_0/fw_ver",
                           "infiniband/mlx5_0/node_guid", "net/ib0/type"}) {
    ASSERT_TRUE(fs::remove(dev / file)) << file;
  }
  std::ofstream(dev / "device", std::ios::trunc) << "0xnot-hex\n";
  // A physfn link that dangles (its PF went away mid-scan): not a VF.
  fs::create_symlink("../0000:1a:07.0", dev / "physfn");
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 2u);
  const Hca& got = (*hcas)[0];
  EXPECT_EQ(got.name, "mlx5_0");
  EXPECT_EQ(got.vendor, "");
  EXPECT_EQ(got.device, "");
  EXPECT_EQ(got.driver, "");
  EXPECT_EQ(got.firmware_version, "");
  EXPECT_EQ(got.node_guid, "");
  EXPECT_EQ(got.netdev_link_type, "");
  EXPECT_FALSE(got.IsVirtualFunction());
  EXPECT_EQ(got.uverbs, "uverbs0");
  EXPECT_TRUE(got.AllPortsActive());
  EXPECT_THAT(got.netdevs, ElementsAre("ib0"));
  // The other HCA is whole; a link type other than Ethernet or InfiniBand is its number.
  EXPECT_EQ((*hcas)[1].driver, "mlx5_core");
  std::ofstream(fs::path(dir_.path()) / "sys/devices/pci0000:1b/0000:1b:01.0/0000:1b:00.0/net/ib1/type",
                std::ios::trunc)
      << "772\n";
  hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  EXPECT_EQ((*hcas)[1].netdev_link_type, "772");
}

TEST_F(SysfsTest, HugeAttributeIsBounded) {
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_0", "0000:1a:00.0", 0)).ok());
  std::ofstream(fs::path(dir_.path()) /
                "sys/devices/pci0000:1a/0000:1a:01.0/0000:1a:00.0/infiniband/mlx5_0/ports/1/rate")
      << std::string(1 << 20, 'x');
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok());
  EXPECT_EQ((*hcas)[0].ports[0].rate.size(), 4096u);
}

TEST_F(SysfsTest, RemovedHcaDisappears) {
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_0", "0000:1a:00.0", 0)).ok());
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_1", "0000:1b:00.0", 0)).ok());
  ASSERT_TRUE(node_.RemoveHca("mlx5_0").ok());
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok());
  ASSERT_EQ(hcas->size(), 1u);
  EXPECT_EQ((*hcas)[0].name, "mlx5_1");
  EXPECT_EQ((*hcas)[0].uverbs, "uverbs1");
}

// Numbers in sysfs are parsed whole and range-checked: atoi took "4294967297" for 1 (and
// overflow is undefined), and "1abc" for port 1.
TEST_F(SysfsTest, NumbersOutOfRangeOrWithTrailingJunkAreRejected) {
  ASSERT_TRUE(node_.AddHca(IbHca("mlx5_0", "0000:1a:00.0", 0)).ok());
  const fs::path dev = fs::path(dir_.path()) / "sys/devices/pci0000:1a/0000:1a:01.0/0000:1a:00.0";
  std::ofstream(dev / "numa_node") << "4294967297\n";
  const fs::path ports = dev / "infiniband/mlx5_0/ports";
  fs::create_directories(ports / "4294967297");
  fs::create_directories(ports / "2abc");
  auto hcas = ReadSysfsHcas(node_.sysfs_root(), node_.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 1u);
  EXPECT_EQ((*hcas)[0].place.numa, std::nullopt);
  ASSERT_EQ((*hcas)[0].ports.size(), 1u);
  EXPECT_EQ((*hcas)[0].ports[0].number, 1);
}

// The PCIe root is the first component below <root>/sys/devices, whatever folders the root itself
// lies in: a root under a folder named "devices" gave "" before.
TEST(SysfsRootTest, RootUnderAFolderNamedDevices) {
  testing::TempDir dir;
  const std::string root = dir.path() + "/devices/sys/node";
  SysfsFixture node(root);
  ASSERT_TRUE(node.AddHca(IbHca("mlx5_0", "0000:1a:00.0", 0)).ok());
  auto hcas = ReadSysfsHcas(node.sysfs_root(), node.dev_root());
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 1u);
  EXPECT_EQ((*hcas)[0].place.pcie_root, "pci0000:1a");
}

TEST(SysfsRootTest, MissingRootNamesThePath) {
  auto hcas = ReadSysfsHcas("/nonexistent/root", "/");
  ASSERT_FALSE(hcas.ok());
  EXPECT_EQ(hcas.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(hcas.status().message()), HasSubstr("/nonexistent/root"));
}

TEST(SysfsRootTest, NoRdmaClassMeansNoHcas) {
  testing::TempDir dir;
  fs::create_directories(fs::path(dir.path()) / "sys/class");
  auto hcas = ReadSysfsHcas(dir.path(), dir.path());
  ASSERT_TRUE(hcas.ok());
  EXPECT_TRUE(hcas->empty());
}

// Exists, as Allocate checks device nodes with it: device nodes, links to them (followed),
// dangling links, a missing directory, a directory itself, a path outside the node's trees and a
// path without a directory.
TEST(EnvTest, ExistsFollowsLinksAndSeesNothingDangling) {
  testing::TempDir dir;
  const fs::path ib = fs::path(dir.path()) / "dev/infiniband";
  fs::create_directories(ib);
  fs::create_directories(fs::path(dir.path()) / "sys/class");
  std::ofstream(ib / "uverbs0").put('x');
  std::ofstream(ib / "rdma_cm").put('x');
  fs::create_symlink("uverbs0", ib / "uverbs-link");
  fs::create_symlink("nowhere", ib / "dangling");
  const std::shared_ptr<Env> env = NewNodeEnv({dir.path(), dir.path(), dir.path()});
  const std::vector<std::string> paths = {
      "/dev/infiniband/uverbs0", "/dev/infiniband/umad0",    "/dev/infiniband/uverbs-link",
      "/dev/infiniband/dangling", "/dev/missing/uverbs0",    "/dev/infiniband",
      "/sys/class",              "/dev/infiniband/rdma_cm", "no-directory",
      "/dev/infiniband/",        "/sys/class/infiniband",   "/dev/infiniband/uverbs0",
      "/dev/infiniband/.",       "/dev/ib-link/uverbs0"};
  fs::create_directory_symlink("infiniband", fs::path(dir.path()) / "dev/ib-link");
  std::vector<bool> found;
  for (const std::string& p : paths) found.push_back(env->Exists(p));
  EXPECT_EQ(found, (std::vector<bool>{true, false, true, false, false, true, true, true, false,
                                      true, false, true, true, true}));
}

}  // namespace
}  // namespace rdp::topology

