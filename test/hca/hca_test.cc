#include "hca/hca.h"

#include <algorithm>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Usable: at least one ACTIVE port (issue 25: every port had to be, so a dual-port card with one
// port uncabled was never offered); the verdict names the ports a container uses, or every port
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
      BuildAllocation({Card("mlx5_0", {"ACTIVE", "DOWN"}), Card("mlx5_1", {"ACTIVE", "ACTIVE"}),
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
      BuildAllocation({Card("mlx5_0", {"ACTIVE", "DOWN"}), Card("mlx5_1", {"ACTIVE", "ACTIVE"}),
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
  ContainerAllocation got = BuildAllocation({a, b}, true);
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
  const ContainerAllocation ab = BuildAllocation({a, b}, true);
  const ContainerAllocation ba = BuildAllocation({b, a}, true);
  EXPECT_EQ(ab.envs, ba.envs);
  EXPECT_EQ(ab.file, ba.file);
  EXPECT_EQ(ba.envs.at("NCCL_IB_HCA"), "=mlx5_1,mlx5_2");
  EXPECT_EQ(ba.envs.at("RDMA_HCA_PCI"), "0000:1a:00.0,0000:9a:00.0");
  ASSERT_FALSE(ba.devices.empty());
  EXPECT_EQ(ba.devices.front().host_path, "/dev/infiniband/uverbs1");
}

TEST(BuildAllocationTest, GidIndexOfTheRoceV2Ipv4Gid) {
  const ContainerAllocation got =
      BuildAllocation({RoceHca("mlx5_1", "0000:1a:00.0", 3), RoceHca("mlx5_2", "0000:9a:00.0", 3)},
                      false);
  EXPECT_EQ(got.envs.at("NCCL_IB_GID_INDEX"), "3");
  EXPECT_TRUE(got.warnings.empty());
}

TEST(BuildAllocationTest, NoIpv4GidLeavesTheIndexUnsetWithAWarning) {
  const ContainerAllocation got = BuildAllocation(
      {RoceHca("mlx5_1", "0000:1a:00.0", 3), RoceHca("mlx5_2", "0000:9a:00.0", std::nullopt)},
      false);
  EXPECT_EQ(got.envs.count("NCCL_IB_GID_INDEX"), 0u);
  ASSERT_EQ(got.warnings.size(), 1u);
  EXPECT_EQ(got.warnings[0],
            "NCCL_IB_GID_INDEX not set: no RoCE v2 GID with an IPv4 address on mlx5_2 port 1 "
            "(give the netdev an IPv4 address, or set NCCL_IB_GID_INDEX in the pod spec)");
}

TEST(BuildAllocationTest, DifferentIndicesLeaveTheIndexUnsetWithAWarning) {
  const ContainerAllocation got = BuildAllocation(
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
  const ContainerAllocation got = BuildAllocation({ib, roce}, false);
  EXPECT_EQ(got.envs.at("NCCL_IB_GID_INDEX"), "3");
  EXPECT_TRUE(got.warnings.empty());
  const ContainerAllocation ib_only = BuildAllocation({ib}, false);
  EXPECT_EQ(ib_only.envs.count("NCCL_IB_GID_INDEX"), 0u);
  EXPECT_TRUE(ib_only.warnings.empty());
}

TEST(BuildAllocationTest, TheAllocationFile) {
  topology::Hca ib = RoceHca("mlx5_0", "0000:0a:00.0", std::nullopt);
  ib.ports[0].link_layer = "InfiniBand";
  ib.netdevs = {"ib0"};
  ib.place.numa.reset();
  const ContainerAllocation got = BuildAllocation(
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

// The doors' form: HCAs of a snapshot, not copied, with their device nodes now.
std::vector<HcaNow> Now(const topology::Topology& t, std::vector<int> indices) {
  std::vector<HcaNow> out;
  for (int i : indices) out.push_back(AsScanned(t.hcas()[i]));
  return out;
}

topology::TopologyPtr Snapshot(std::vector<topology::Hca> hcas) {
  return std::make_shared<const topology::Topology>(std::vector<int>{0, 1}, std::move(hcas),
                                                    std::vector<topology::Gpu>{});
}

// Without a file-writing memo (no --allocation-dir) the doors' form builds no file (issue 25's
// Allocate profile: a quarter of the call went to a file thrown away), and everything else is
// the same.
TEST(BuildAllocationTest, NoMemoNoFileTheRestTheSame) {
  EXPECT_FALSE(AllocationMemo::For("")->with_file());
  EXPECT_TRUE(AllocationMemo::For("/var/run/rdma-device-plugin/allocations")->with_file());
  const topology::TopologyPtr t = Snapshot(
      {RoceHca("mlx5_1", "0000:1a:00.0", 3), RoceHca("mlx5_2", "0000:9a:00.0", 3)});
  const ContainerAllocation value = BuildAllocation({t->hcas()[1], t->hcas()[0]}, true);
  AllocationMemo without_file(4, false);
  for (AllocationMemo* memo : {static_cast<AllocationMemo*>(nullptr), &without_file}) {
    const std::shared_ptr<const ContainerAllocation> none =
        BuildAllocation(t, Now(*t, {1, 0}), true, {}, memo);
    EXPECT_EQ(none->file, "");
    EXPECT_EQ(none->file_name, "");
    EXPECT_EQ(none->envs, value.envs);
    EXPECT_EQ(none->warnings, value.warnings);
    ASSERT_EQ(none->devices.size(), value.devices.size());
    for (std::size_t i = 0; i < none->devices.size(); ++i) {
      EXPECT_EQ(none->devices[i].host_path, value.devices[i].host_path);
      EXPECT_EQ(none->devices[i].container_path, value.devices[i].container_path);
    }
  }
  AllocationMemo memo(4, true);
  const std::shared_ptr<const ContainerAllocation> with =
      BuildAllocation(t, Now(*t, {1, 0}), true, {}, &memo);
  EXPECT_EQ(with->file, value.file);
  EXPECT_EQ(with->file_name, AllocationFileName(value.file));
  EXPECT_EQ(value.file_name, with->file_name);
}

// What BuildAllocation gives for `hcas` (their device nodes as each HcaNow has them) built
// afresh, without any memo: the value form on copies of the HCAs.
ContainerAllocation Fresh(const std::vector<HcaNow>& hcas, bool cm,
                          const std::map<std::string, std::string>& gpus) {
  std::vector<topology::Hca> values;
  for (const HcaNow& h : hcas) {
    topology::Hca copy = *h.hca;
    for (std::size_t i = 0; i < copy.char_devices.size(); ++i) {
      copy.char_devices[i].second = h.present[i];
    }
    values.push_back(std::move(copy));
  }
  return BuildAllocation(std::move(values), cm, gpus);
}

// Everything a container gets is what a fresh build gives (a memo that served another key's
// entry, or an entry of a replaced snapshot, fails here).
void ExpectFresh(const ContainerAllocation& got, const std::vector<HcaNow>& hcas, bool cm,
                 const std::map<std::string, std::string>& gpus) {
  const ContainerAllocation want = Fresh(hcas, cm, gpus);
  ASSERT_EQ(got.devices.size(), want.devices.size());
  for (std::size_t i = 0; i < got.devices.size(); ++i) {
    EXPECT_EQ(got.devices[i].container_path, want.devices[i].container_path);
    EXPECT_EQ(got.devices[i].host_path, want.devices[i].host_path);
    EXPECT_EQ(got.devices[i].permissions, want.devices[i].permissions);
  }
  EXPECT_EQ(got.envs, want.envs);
  EXPECT_EQ(got.warnings, want.warnings);
  EXPECT_EQ(got.file, want.file);
  EXPECT_EQ(got.file_name, want.file_name);
}

// Same inputs: built once, one shared value. Any input changed: built again, and the whole
// allocation (devices, envs, warnings, file) is what a fresh build gives for the new inputs.
TEST(AllocationMemoTest, BuiltOncePerInputsNeverStale) {
  topology::Hca a = RoceHca("mlx5_1", "0000:1a:00.0", 3);
  topology::Hca b = RoceHca("mlx5_2", "0000:9a:00.0", 3);
  b.umad = {"umad2"};
  b.char_devices.push_back({"/dev/infiniband/umad2", true});
  // Both snapshots in one buffer: the new one takes the replaced one's address, as an allocator
  // may make it do.
  alignas(topology::Topology) unsigned char buffer[sizeof(topology::Topology)];
  auto placed = [&buffer](std::vector<topology::Hca> hcas) {
    auto* p = new (buffer) topology::Topology(std::vector<int>{0, 1}, std::move(hcas),
                                              std::vector<topology::Gpu>{});
    return topology::TopologyPtr(p, [](const topology::Topology* q) { q->~Topology(); });
  };
  topology::TopologyPtr t = placed({a, b});
  AllocationMemo memo(8, true);
  auto built = [&memo](const topology::TopologyPtr& snapshot, std::vector<HcaNow> hcas, bool cm,
                       const std::map<std::string, std::string>& gpus) {
    return BuildAllocation(snapshot, std::move(hcas), cm, gpus, &memo);
  };
  const auto first = built(t, Now(*t, {0, 1}), true, {});
  EXPECT_EQ(memo.builds(), 1u);
  ExpectFresh(*first, Now(*t, {0, 1}), true, {});
  EXPECT_EQ(built(t, Now(*t, {0, 1}), true, {}), first);  // a hit: the one shared value
  EXPECT_EQ(built(t, Now(*t, {1, 0}), true, {}), first);  // in any order
  EXPECT_EQ(memo.builds(), 1u);

  // Another set of HCAs.
  const auto one = built(t, Now(*t, {0}), true, {});
  EXPECT_EQ(memo.builds(), 2u);
  EXPECT_NE(one->file, first->file);
  ExpectFresh(*one, Now(*t, {0}), true, {});
  // Another paired GPU, then another GPU for the same HCA.
  const auto paired = built(t, Now(*t, {0, 1}), true, {{"0000:1a:00.0", "0000:1b:00.0"}});
  EXPECT_EQ(memo.builds(), 3u);
  EXPECT_NE(paired->file, first->file);
  const auto repaired = built(t, Now(*t, {0, 1}), true, {{"0000:1a:00.0", "0000:1c:00.0"}});
  EXPECT_EQ(memo.builds(), 4u);
  EXPECT_NE(repaired->file, paired->file);
  ExpectFresh(*repaired, Now(*t, {0, 1}), true, {{"0000:1a:00.0", "0000:1c:00.0"}});
  // A device node gone now, and rdma_cm gone: inputs of the key. The DeviceSpecs lose them.
  std::vector<HcaNow> gone = Now(*t, {0, 1});
  gone[1].present[1] = false;
  const auto no_umad = built(t, gone, true, {});
  EXPECT_EQ(memo.builds(), 5u);
  EXPECT_EQ(no_umad->devices.size() + 1, first->devices.size());
  ExpectFresh(*no_umad, gone, true, {});
  const auto no_cm = built(t, Now(*t, {0, 1}), false, {});
  EXPECT_EQ(memo.builds(), 6u);
  EXPECT_EQ(no_cm->devices.size() + 1, first->devices.size());
  ExpectFresh(*no_cm, Now(*t, {0, 1}), false, {});

  // A new snapshot (the port went DOWN, the GID moved): built again with the new values, even
  // when the new snapshot takes the address of the one it replaces.
  topology::Hca moved = a;
  moved.ports[0].roce_v2_ipv4_gid = 5;
  moved.ports[0].gid_ipv4 = "198.51.100.7";
  std::weak_ptr<const topology::Topology> old = t;
  const topology::Topology* old_address = t.get();
  t.reset();
  ASSERT_TRUE(old.expired());
  const topology::TopologyPtr u = placed({moved, b});
  ASSERT_EQ(u.get(), old_address);
  const auto after = built(u, Now(*u, {0, 1}), true, {});
  EXPECT_EQ(memo.builds(), 7u);
  EXPECT_NE(after->file, first->file);
  // The GIDs are at different indices now (5 and 3): no NCCL_IB_GID_INDEX, and a warning,
  // where the replaced snapshot's entry said 3.
  EXPECT_EQ(first->envs.at("NCCL_IB_GID_INDEX"), "3");
  EXPECT_EQ(after->envs.count("NCCL_IB_GID_INDEX"), 0u);
  EXPECT_EQ(after->warnings.size(), 1u);
  ExpectFresh(*after, Now(*u, {0, 1}), true, {});
  EXPECT_NE(after->file.find("198.51.100.7"), std::string::npos);
  // The replaced snapshot's entries are dropped, not kept until evicted.
  EXPECT_EQ(memo.size(), 1u);
}

// Bounded: the least recently used entry goes.
TEST(AllocationMemoTest, HoldsAtMostItsCapacity) {
  const topology::TopologyPtr t = Snapshot(
      {RoceHca("mlx5_1", "0000:1a:00.0", 3), RoceHca("mlx5_2", "0000:9a:00.0", 3)});
  AllocationMemo memo(2, true);
  for (int i = 0; i < 10; ++i) {
    BuildAllocation(t, Now(*t, {0}), true, {{"0000:1a:00.0", absl::StrCat("0000:", 10 + i, ":00.0")}},
                    &memo);
  }
  EXPECT_EQ(memo.size(), 2u);
  EXPECT_EQ(memo.builds(), 10u);
  BuildAllocation(t, Now(*t, {0}), true, {{"0000:1a:00.0", "0000:19:00.0"}}, &memo);  // the latest
  EXPECT_EQ(memo.builds(), 10u);
  BuildAllocation(t, Now(*t, {0}), true, {{"0000:1a:00.0", "0000:10:00.0"}}, &memo);  // evicted
  EXPECT_EQ(memo.builds(), 11u);
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
