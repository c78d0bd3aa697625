#include "hca/hca.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace rdp::hca {
namespace {

TEST(ModeTest, ParsesItsOwnNames) {
  for (Mode m : {Mode::kExclusive, Mode::kShared}) {
    absl::StatusOr<Mode> parsed = ParseMode(ModeName(m));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  for (const char* bad : {"Shared", "", "both"}) {
    absl::StatusOr<Mode> parsed = ParseMode(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseMode("both").status().message(), "'both' is not a mode: shared or exclusive");
}

topology::Hca Card(const std::string& name, std::vector<std::string> states) {
  topology::Hca h;
  h.name = name;
  h.place.pci = "0000:1a:00.0";
  h.uverbs = "uverbs0";
  h.char_devices = {{"/dev/infiniband/uverbs0", true}};
  for (std::size_t i = 0; i < states.size(); ++i) {
    topology::Port port;
    port.number = static_cast<int>(i) + 1;
    port.state = states[i];
    h.ports.push_back(port);
  }
  return h;
}

// BuildAllocation of a door with an allocation dir (the file built too), on copies of `hcas`
// with their device nodes as scanned.
ContainerAllocation Built(const std::vector<topology::Hca>& hcas, bool with_rdma_cm,
                          const std::map<std::string, std::string>& paired_gpu = {},
                          const std::string& allocation_dir = "/var/run/rdma/allocations") {
  std::vector<HcaNow> now;
  for (const topology::Hca& h : hcas) now.push_back(AsScanned(h));
  return BuildAllocation(std::move(now), with_rdma_cm, paired_gpu, allocation_dir);
}

// Usable: at least one ACTIVE port (a dual-port card with one port uncabled used to be never
// offered); the verdict names the ports a container uses, or every port
// that is not ACTIVE.
TEST(AssessTest, AtLeastOneActivePort) {
  Verdict one_down = Assess(Card("mlx5_0", {"ACTIVE", "DOWN"}));
  EXPECT_TRUE(one_down.usable) << one_down.reason;
  EXPECT_EQ(one_down.active_ports, std::vector<int>{1});
  Verdict other_down = Assess(Card("mlx5_0", {"DOWN", "ACTIVE"}));
  EXPECT_TRUE(other_down.usable);
  EXPECT_EQ(other_down.active_ports, std::vector<int>{2});
  Verdict both = Assess(Card("mlx5_0", {"ACTIVE", "ACTIVE"}));
  EXPECT_EQ(both.active_ports, (std::vector<int>{1, 2}));
  Verdict none = Assess(Card("mlx5_0", {"DOWN", "INIT"}));
  EXPECT_FALSE(none.usable);
  EXPECT_EQ(none.reason, "port 1 is DOWN, port 2 is INIT");
  EXPECT_EQ(Assess(Card("mlx5_0", {"DOWN"})).reason, "port 1 is DOWN");
  EXPECT_EQ(Assess(Card("mlx5_0", {})).reason, "no port state is known");
  topology::Hca missing = Card("mlx5_0", {"ACTIVE", "DOWN"});
  missing.char_devices[0].second = false;
  EXPECT_EQ(Assess(missing).reason, "device node /dev/infiniband/uverbs0 is missing");
}

// NCCL uses every port of an HCA named alone: one with a port that is not ACTIVE is named by its
// ACTIVE ports ("mlx5_0:1"), in NCCL's exact-match form.
TEST(BuildAllocationTest, NcclNamesTheActivePortsOfAPartlyDownHca) {
  ContainerAllocation got =
      Built({Card("mlx5_0", {"ACTIVE", "DOWN"}), Card("mlx5_1", {"ACTIVE", "ACTIVE"}),
                       Card("mlx5_2", {"ACTIVE"})},
                      true);
  EXPECT_EQ(got.envs["NCCL_IB_HCA"], "=mlx5_0:1,mlx5_1,mlx5_2");
  EXPECT_EQ(got.envs["RDMA_HCA_NAMES"], "mlx5_0,mlx5_1,mlx5_2");
}

// UCX names a device by port, always: UCX_NET_DEVICES lists the ACTIVE ports, so that UCX opens
// the container's HCAs only (libibverbs lists every HCA of the node, from sysfs) and no port
// that is down; an HCA with no port state known is given with every port.
TEST(BuildAllocationTest, UcxNamesTheActivePorts) {
  ContainerAllocation got =
      Built({Card("mlx5_0", {"ACTIVE", "DOWN"}), Card("mlx5_1", {"ACTIVE", "ACTIVE"}),
                       Card("mlx5_2", {"ACTIVE"})},
                      true);
  EXPECT_EQ(got.envs["UCX_NET_DEVICES"], "mlx5_0:1,mlx5_1:1,mlx5_1:2,mlx5_2:1");
}

TEST(BuildAllocationTest, SpecsAndExactMatchEnvs) {
  topology::Hca a;
  a.name = "mlx5_1";
  a.place.pci = "0000:1a:00.0";
  a.uverbs = "uverbs1";
  a.umad = {"umad1"};
  a.issm = {"issm1"};
  a.char_devices = {{"/x/dev/infiniband/uverbs1", true},
                    {"/x/dev/infiniband/umad1", true},
                    {"/x/dev/infiniband/issm1", false}};
  topology::Hca b;
  b.name = "mlx5_10";
  b.place.pci = "0000:9a:00.0";
  b.uverbs = "uverbs10";
  b.char_devices = {{"/x/dev/infiniband/uverbs10", true}};
  ContainerAllocation got = Built({a, b}, true);
  std::vector<std::string> paths;
  for (const auto& s : got.devices) {
    EXPECT_EQ(s.host_path, s.container_path);
    EXPECT_EQ(s.permissions, "rw");
    paths.push_back(s.host_path);
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"/dev/infiniband/uverbs1", "/dev/infiniband/umad1",
                                             "/dev/infiniband/uverbs10",
                                             "/dev/infiniband/rdma_cm"}));
  EXPECT_EQ(got.envs["NCCL_IB_HCA"], "=mlx5_1,mlx5_10");
  EXPECT_EQ(got.envs["RDMA_HCA_NAMES"], "mlx5_1,mlx5_10");
  EXPECT_EQ(got.envs["RDMA_HCA_PCI"], "0000:1a:00.0,0000:9a:00.0");
}

topology::Hca RoceHca(const std::string& name, const std::string& pci, std::optional<int> gid) {
  topology::Hca h;
  h.name = name;
  h.place.pci = pci;
  h.place.numa = 1;
  h.uverbs = "uverbs" + name.substr(name.size() - 1);
  h.char_devices = {{"/dev/infiniband/" + h.uverbs, true}};
  h.netdevs = {"ens" + name.substr(name.size() - 1)};
  topology::Port p;
  p.number = 1;
  p.state = "ACTIVE";
  p.link_layer = "Ethernet";
  p.roce_v2_ipv4_gid = gid;
  if (gid) {
    p.gid_ipv4 = "192.0.2." + name.substr(name.size() - 1);
    p.gid_netdev = h.netdevs.front();
  }
  h.ports = {p};
  return h;
}

TEST(BuildAllocationTest, SameHcasInAnyOrderGiveTheSameValues) {
  const topology::Hca a = RoceHca("mlx5_1", "0000:1a:00.0", 3);
  const topology::Hca b = RoceHca("mlx5_2", "0000:9a:00.0", 3);
  const ContainerAllocation ab = Built({a, b}, true);
  const ContainerAllocation ba = Built({b, a}, true);
  EXPECT_EQ(ab.envs, ba.envs);
  EXPECT_EQ(ab.file, ba.file);
  EXPECT_EQ(ba.envs.at("NCCL_IB_HCA"), "=mlx5_1,mlx5_2");
  EXPECT_EQ(ba.envs.at("RDMA_HCA_PCI"), "0000:1a:00.0,0000:9a:00.0");
  ASSERT_FALSE(ba.devices.empty());
  EXPECT_EQ(ba.devices.front().host_path, "/dev/infiniband/uverbs1");
}

TEST(BuildAllocationTest, GidIndexOfTheRoceV2Ipv4Gid) {
  const ContainerAllocation got =
      Built({RoceHca("mlx5_1", "0000:1a:00.0", 3), RoceHca("mlx5_2", "0000:9a:00.0", 3)},
                      false);
  EXPECT_EQ(got.envs.at("NCCL_IB_GID_INDEX"), "3");
  EXPECT_TRUE(got.warnings.empty());
}

TEST(BuildAllocationTest, NoIpv4GidLeavesTheIndexUnsetWithAWarning) {
  const ContainerAllocation got = Built(
      {RoceHca("mlx5_1", "0000:1a:00.0", 3), RoceHca("mlx5_2", "0000:9a:00.0", std::nullopt)},
      false);
  EXPECT_EQ(got.envs.count("NCCL_IB_GID_INDEX"), 0u);
  ASSERT_EQ(got.warnings.size(), 1u);
  EXPECT_EQ(got.warnings[0],
            "NCCL_IB_GID_INDEX not set: no RoCE v2 GID with an IPv4 address on mlx5_2 port 1 "
            "(give the netdev an IPv4 address, or set NCCL_IB_GID_INDEX in the pod spec)");
}

TEST(BuildAllocationTest, DifferentIndicesLeaveTheIndexUnsetWithAWarning) {
  const ContainerAllocation got = Built(
      {RoceHca("mlx5_2", "0000:9a:00.0", 5), RoceHca("mlx5_1", "0000:1a:00.0", 3)}, false);
  EXPECT_EQ(got.envs.count("NCCL_IB_GID_INDEX"), 0u);
  ASSERT_EQ(got.warnings.size(), 1u);
  EXPECT_EQ(got.warnings[0],
            "NCCL_IB_GID_INDEX not set: the RoCE v2 IPv4 GIDs of mlx5_1,mlx5_2 are at different "
            "indices (3, 5); NCCL takes one");
}

TEST(BuildAllocationTest, InfiniBandAndInactivePortsNeedNoGid) {
  topology::Hca ib = RoceHca("mlx5_0", "0000:0a:00.0", std::nullopt);
  ib.ports[0].link_layer = "InfiniBand";
  topology::Hca roce = RoceHca("mlx5_1", "0000:1a:00.0", 3);
  topology::Port down = roce.ports[0];
  down.number = 2;
  down.state = "DOWN";
  down.roce_v2_ipv4_gid.reset();
  roce.ports.push_back(down);
  const ContainerAllocation got = Built({ib, roce}, false);
  EXPECT_EQ(got.envs.at("NCCL_IB_GID_INDEX"), "3");
  EXPECT_TRUE(got.warnings.empty());
  const ContainerAllocation ib_only = Built({ib}, false);
  EXPECT_EQ(ib_only.envs.count("NCCL_IB_GID_INDEX"), 0u);
  EXPECT_TRUE(ib_only.warnings.empty());
}

TEST(BuildAllocationTest, TheAllocationFile) {
  topology::Hca ib = RoceHca("mlx5_0", "0000:0a:00.0", std::nullopt);
  ib.ports[0].link_layer = "InfiniBand";
  ib.netdevs = {"ib0"};
  ib.place.numa.reset();
  const ContainerAllocation got = Built(
      {RoceHca("mlx5_1", "0000:1a:00.0", 3), ib}, true, {{"0000:1a:00.0", "0000:1b:00.0"}});
  const nlohmann::json file = nlohmann::json::parse(got.file);
  EXPECT_EQ(file, nlohmann::json::parse(R"({
    "hcas": [
      {"name": "mlx5_0", "pci": "0000:0a:00.0", "netdevs": ["ib0"],
       "uverbs": "/dev/infiniband/uverbs0",
       "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "netdev": "ib0"}]},
      {"name": "mlx5_1", "pci": "0000:1a:00.0", "numa": 1, "netdevs": ["ens1"],
       "uverbs": "/dev/infiniband/uverbs1", "gpu": "0000:1b:00.0",
       "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "Ethernet", "netdev": "ens1",
                  "gid_index": 3, "gid_ipv4": "192.0.2.1"}]}],
    "env": {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
            "RDMA_HCA_NAMES": "mlx5_0,mlx5_1", "RDMA_HCA_PCI": "0000:0a:00.0,0000:1a:00.0",
            "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1"}})"))
      << got.file;
}

// Without an allocation dir no file is built, and everything else is the same.
TEST(BuildAllocationTest, NoAllocationDirNoFileTheRestTheSame) {
  const std::vector<topology::Hca> hcas = {RoceHca("mlx5_2", "0000:9a:00.0", 3),
                                           RoceHca("mlx5_1", "0000:1a:00.0", 3)};
  const ContainerAllocation with = Built(hcas, true);
  EXPECT_NE(with.file, "");
  EXPECT_EQ(with.file_name, AllocationFileName(with.file));
  const ContainerAllocation none = Built(hcas, true, {}, "");
  EXPECT_EQ(none.file, "");
  EXPECT_EQ(none.file_name, "");
  EXPECT_EQ(none.envs, with.envs);
  EXPECT_EQ(none.warnings, with.warnings);
  ASSERT_EQ(none.devices.size(), with.devices.size());
  for (std::size_t i = 0; i < none.devices.size(); ++i) {
    EXPECT_EQ(none.devices[i].host_path, with.devices[i].host_path);
    EXPECT_EQ(none.devices[i].container_path, with.devices[i].container_path);
  }
}

// The device nodes as checked now (an HcaNow's), not as scanned, decide the DeviceSpecs.
TEST(BuildAllocationTest, DeviceNodesAsCheckedNow) {
  topology::Hca b = RoceHca("mlx5_2", "0000:9a:00.0", 3);
  b.umad = {"umad2"};
  b.char_devices.push_back({"/dev/infiniband/umad2", true});
  HcaNow now = AsScanned(b);
  now.present[1] = false;
  const ContainerAllocation got = BuildAllocation({now}, false, {}, "");
  ASSERT_EQ(got.devices.size(), 1u);
  EXPECT_EQ(got.devices[0].host_path, "/dev/infiniband/uverbs2");
}

// The device nodes checked now go into the HcaNow, not into the snapshot; Assess reads them.
TEST(AssessTest, HcaNowHasTheDeviceNodesAsChecked) {
  const topology::Hca card = Card("mlx5_0", {"ACTIVE"});
  HcaNow now = AsScanned(card);
  EXPECT_TRUE(Assess(now).usable);
  now.present[0] = false;
  EXPECT_EQ(Assess(now).reason, "device node /dev/infiniband/uverbs0 is missing");
  EXPECT_TRUE(Assess(card).usable);
}

}  // namespace
}  // namespace rdp::hca
