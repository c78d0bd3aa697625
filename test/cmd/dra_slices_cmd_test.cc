// `rdma-device-plugin dra slices` end to end on bundled fixtures: the ResourceSlices it prints
// for a node, its flags and exit codes. (How devices and slices are built: test/dra.)

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dra/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sim/fixture_node.h"
#include "test/support/child.h"
#include "test/support/temp_dir.h"

namespace rdp::cmd {
namespace {

using ::testing::HasSubstr;
using dra::kDefaultDriverName;
using nlohmann::json;

constexpr char kStd[] = "resource.kubernetes.io/";

std::string Own(const std::string& name) { return std::string(kDefaultDriverName) + "/" + name; }

struct RunResult {
  int code = -1;
  std::string out;  // stdout
  std::string all;  // stdout and stderr
};

RunResult RunBinary(const std::vector<std::string>& args) {
  rdp::testing::Child child(testing::PluginBinary(), args);
  RunResult r;
  r.code = child.Wait(absl::Seconds(60));
  r.out = child.stdout_text();
  r.all = child.output();
  return r;
}

// A sysfs + /dev tree laid out from a bundled XML (sim/fixture_node.h).
class DRASlicesCmdTest : public ::testing::Test {
 protected:
  std::vector<std::string> Fixture(const std::string& xml) {
    const std::string out = dir_.Sub("node");
    const auto laid = sim::LayOutXml(rdp::testing::TestData(xml), out);
    EXPECT_TRUE(laid.ok()) << laid.status();
    return {"--topology-xml", rdp::testing::TestData(xml), "--sysfs-root", out, "--dev-root", out,
            "--log-level", "warn"};
  }
  json Slices(std::vector<std::string> args) {
    args.insert(args.begin(), {"dra", "slices"});
    const RunResult r = RunBinary(args);
    EXPECT_EQ(r.code, 0) << r.all;
    json list = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(list.is_discarded()) << r.out;
    return list;
  }
  static std::vector<json> Devices(const json& list) {
    std::vector<json> out;
    for (const json& slice : list["items"]) {
      for (const json& d : slice["spec"]["devices"]) out.push_back(d);
    }
    return out;
  }

  rdp::testing::TempDir dir_;
};

TEST_F(DRASlicesCmdTest, PrintsTheDgxH100LikeNodesSlices) {
  std::vector<std::string> args = Fixture("dgx-h100-like.xml");
  args.insert(args.end(), {"--node-name", "node-a"});
  const json list = Slices(args);
  EXPECT_EQ(list["apiVersion"], "v1");
  EXPECT_EQ(list["kind"], "List");
  ASSERT_EQ(list["items"].size(), 1u);
  const json& slice = list["items"][0];
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["kind"], "ResourceSlice");
  EXPECT_EQ(slice["spec"]["driver"], kDefaultDriverName);
  EXPECT_EQ(slice["spec"]["nodeName"], "node-a");
  EXPECT_EQ(slice["spec"]["pool"]["generation"], 1);
  EXPECT_FALSE(slice["metadata"].contains("ownerReferences"));

  // test/data/README.md: 4 roots each with a switch of 2 GPUs + 2 ConnectX-7, and mlx5_bond_0
  // alone on pci0000:c8; NUMA 0 for the first two roots.
  const std::vector<json> devices = Devices(list);
  ASSERT_EQ(devices.size(), 9u);
  std::map<std::string, std::vector<std::string>> by_switch;
  std::set<std::string> roots;
  std::string previous;
  for (const json& d : devices) {
    const std::string name = d["name"];
    EXPECT_LT(previous, name) << "PCI order";
    previous = name;
    const json& a = d["attributes"];
    const std::string pci = a[std::string(kStd) + "pciBusID"]["string"];
    std::string expected_name = "hca-" + pci;
    std::replace(expected_name.begin(), expected_name.end(), ':', '-');
    std::replace(expected_name.begin(), expected_name.end(), '.', '-');
    EXPECT_EQ(name, expected_name);
    const std::string root = a[std::string(kStd) + "pcieRoot"]["string"];
    roots.insert(root);
    const int numa = a[std::string(kStd) + "numaNode"]["int"];
    EXPECT_EQ(numa, root == "pci0000:15" || root == "pci0000:37" ? 0 : 1) << name;
    EXPECT_FALSE(d.contains("taints")) << d.dump();
    EXPECT_EQ(a[Own("allPortsActive")]["bool"], true);
    EXPECT_EQ(a[Own("mode")]["string"], "exclusive");
    EXPECT_TRUE(a.contains(Own("uverbs")));
    // The identity the fixture lays out for every HCA (sim/sysfs_fixture.h).
    EXPECT_EQ(a[Own("pciVendorID")]["string"], "15b3") << name;
    EXPECT_EQ(a[Own("pciDeviceID")]["string"], "1021") << name;
    EXPECT_EQ(a[Own("driver")]["string"], "mlx5_core") << name;
    EXPECT_EQ(a[Own("firmwareVersion")]["string"], "28.39.1002") << name;
    EXPECT_TRUE(a.contains(Own("nodeGUID"))) << name;
    EXPECT_TRUE(a.contains(Own("netdevs"))) << name;
    EXPECT_EQ(a[Own("virtualFunction")]["bool"], false) << name;
    EXPECT_FALSE(a.contains(Own("physicalFunction"))) << name;
    if (a[Own("hcaName")]["string"] == "mlx5_bond_0") {
      EXPECT_EQ(root, "pci0000:c8");
      EXPECT_FALSE(a.contains(Own("pcieSwitch")));
      EXPECT_FALSE(a.contains(Own("pcieTopSwitch")));
      EXPECT_EQ(a[Own("linkLayer")]["string"], "Ethernet");
    } else {
      by_switch[a[Own("pcieSwitch")]["string"]].push_back(name);
      EXPECT_EQ(a[Own("pcieTopSwitch")], a[Own("pcieSwitch")]) << "one level of switches";
      EXPECT_EQ(a[Own("linkLayer")]["string"], "InfiniBand");
    }
  }
  EXPECT_EQ(roots, (std::set<std::string>{"pci0000:15", "pci0000:37", "pci0000:9a", "pci0000:bb",
                                          "pci0000:c8"}));
  ASSERT_EQ(by_switch.size(), 4u);
  for (const auto& [sw, names] : by_switch) EXPECT_EQ(names.size(), 2u) << sw;
}

// The node with roles (sim::LayOutNamedNode "dgx-roles"): every function is published, the two
// VFs of the first compute NIC marked, with their PF and its placement.
TEST_F(DRASlicesCmdTest, TheNodeWithRolesPublishesItsVfsMarked) {
  const auto laid = sim::LayOutNamedNode(dir_.path(), "dgx-roles");
  ASSERT_TRUE(laid.ok()) << laid.status();
  const std::vector<json> devices =
      Devices(Slices({"--topology-xml", laid->xml, "--sysfs-root", laid->root, "--dev-root",
                      laid->root, "--log-level", "warn", "--node-name", "node-a"}));
  ASSERT_EQ(devices.size(), 10u);
  std::map<std::string, json> by_name;
  for (const json& d : devices) by_name[d["name"]] = d["attributes"];
  const json& pf = by_name["hca-0000-15-00-0"];
  int vfs = 0, ethernet = 0;
  for (const auto& [name, a] : by_name) {
    const bool vf = a[Own("virtualFunction")]["bool"];
    if (a[Own("linkLayer")]["string"] == "Ethernet") {
      ++ethernet;
      EXPECT_THAT(a[Own("netdevs")]["string"].get<std::string>(), HasSubstr("np")) << name;
    }
    if (!vf) {
      EXPECT_EQ(a[Own("pciDeviceID")]["string"], "1021") << name;
      continue;
    }
    ++vfs;
    EXPECT_EQ(a[Own("physicalFunction")]["string"], "0000:15:00.0") << name;
    EXPECT_EQ(a[Own("pciDeviceID")]["string"], "101e") << name;
    EXPECT_EQ(a[std::string(kStd) + "pcieRoot"], pf[std::string(kStd) + "pcieRoot"]) << name;
    EXPECT_EQ(a[std::string(kStd) + "numaNode"], pf[std::string(kStd) + "numaNode"]) << name;
    EXPECT_EQ(a[Own("pcieSwitch")], pf[Own("pcieSwitch")]) << name;
  }
  EXPECT_EQ(vfs, 2);
  EXPECT_EQ(ethernet, 4);
  EXPECT_EQ(by_name["hca-0000-15-00-1"][Own("netdevs")]["string"], "ibp21s0f1");
  EXPECT_FALSE(by_name["hca-0000-15-00-2"].contains(Own("netdevs"))) << "a VF without a netdev";
}

// test/data/README.md: two-level-switches has, per root, a top switch over two leaf switches of
// 2 GPUs + 1 HCA each.
TEST_F(DRASlicesCmdTest, TwoLevelSwitchesNodeHasOneHcaPerLeafTwoPerTopSwitch) {
  std::vector<std::string> args = Fixture("two-level-switches.xml");
  args.insert(args.end(), {"--node-name", "node-d"});
  const std::vector<json> devices = Devices(Slices(args));
  ASSERT_EQ(devices.size(), 8u);
  std::map<std::string, int> leaf, top;
  for (const json& d : devices) {
    const json& a = d["attributes"];
    ASSERT_TRUE(a.contains(Own("pcieSwitch")) && a.contains(Own("pcieTopSwitch"))) << d.dump();
    EXPECT_NE(a[Own("pcieSwitch")], a[Own("pcieTopSwitch")]);
    ++leaf[a[Own("pcieSwitch")]["string"]];
    ++top[a[Own("pcieTopSwitch")]["string"]];
  }
  EXPECT_EQ(leaf.size(), 8u);
  ASSERT_EQ(top.size(), 4u);
  for (const auto& [sw, n] : top) EXPECT_EQ(n, 2) << sw;
}

TEST_F(DRASlicesCmdTest, SharedModeAndADriverName) {
  std::vector<std::string> args = Fixture("four-numa.xml");
  args.insert(args.end(), {"--node-name", "node-b", "--mode", "shared", "--driver-name",
                           "rdma.example.com"});
  const json list = Slices(args);
  EXPECT_EQ(list["items"][0]["spec"]["driver"], "rdma.example.com");
  const std::vector<json> devices = Devices(list);
  ASSERT_EQ(devices.size(), 8u);
  for (const json& d : devices) {
    EXPECT_EQ(d["allowMultipleAllocations"], true);
    EXPECT_EQ(d["attributes"]["rdma.example.com/mode"]["string"], "shared");
    EXPECT_EQ(d["capacity"]["pods"]["value"], "1k") << d.dump();
  }
  args.insert(args.end(), {"--shared-devices", "64"});
  for (const json& d : Devices(Slices(args))) EXPECT_EQ(d["capacity"]["pods"]["value"], "64");
}

TEST_F(DRASlicesCmdTest, NodeNameFromTheEnvironment) {
  std::vector<std::string> args = Fixture("fewer-hcas-than-gpus.xml");
  args.insert(args.begin(), {"dra", "slices"});
  rdp::testing::Child::Options options;
  options.env["NODE_NAME"] = "from-env";
  rdp::testing::Child child(testing::PluginBinary(), args, options);
  ASSERT_EQ(child.Wait(absl::Seconds(60)), 0) << child.output();
  const json list = json::parse(child.stdout_text());
  EXPECT_EQ(list["items"][0]["spec"]["nodeName"], "from-env");
  EXPECT_EQ(Devices(list).size(), 4u);
}

TEST_F(DRASlicesCmdTest, AnUnhealthyHcaIsTainted) {
  std::vector<std::string> args = Fixture("fewer-hcas-than-gpus.xml");
  // The fixture's first HCA loses its uverbs device node, as a driver unload does.
  const std::filesystem::path uverbs0 = dir_.Sub("node") + "/dev/infiniband/uverbs0";
  ASSERT_TRUE(std::filesystem::remove(uverbs0));
  args.insert(args.end(), {"--node-name", "node-c"});
  const std::vector<json> devices = Devices(Slices(args));
  ASSERT_EQ(devices.size(), 4u);
  int tainted = 0;
  for (const json& d : devices) {
    if (!d.contains("taints")) continue;
    ++tainted;
    EXPECT_EQ(d["attributes"][Own("uverbs")]["string"], "uverbs0");
    EXPECT_EQ(d["taints"][0]["key"], Own("unhealthy"));
    EXPECT_EQ(d["taints"][0]["value"], "DeviceNodeMissing");
  }
  EXPECT_EQ(tainted, 1);
}

// hwloc-gather-topology's tree of a real machine: the kernel's /sys/bus/pci/devices links and
// numa_node files are there, so the standard attributes come from them.
TEST_F(DRASlicesCmdTest, ARealGatheredTreeTakesTheKernelsView) {
  const std::string cmd = "tar -xjf '" + rdp::testing::TestData("32em64t-2n8c+1mic.tar.bz2") +
                          "' -C '" + dir_.path() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string root = dir_.path() + "/32em64t-2n8c+1mic";
  const json list = Slices({"--sysfs-root", root, "--dev-root", root, "--node-name", "gathered",
                            "--log-level", "warn"});
  const std::vector<json> devices = Devices(list);
  // mlx4_0 (scif0 is no PCI function): /sys/bus/pci/devices/0000:82:00.0 ->
  // ../../../devices/pci0000:80/0000:80:02.2/0000:82:00.0, numa_node 1.
  ASSERT_EQ(devices.size(), 1u) << list.dump(2);
  const json& a = devices[0]["attributes"];
  EXPECT_EQ(devices[0]["name"], "hca-0000-82-00-0");
  EXPECT_EQ(a[std::string(kStd) + "pcieRoot"]["string"], "pci0000:80");
  EXPECT_EQ(a[std::string(kStd) + "pciBusID"]["string"], "0000:82:00.0");
  EXPECT_EQ(a[std::string(kStd) + "numaNode"]["int"], 1);
  EXPECT_EQ(a[Own("hcaName")]["string"], "mlx4_0");
  EXPECT_EQ(a[Own("rateGbps")]["int"], 56);
}

TEST_F(DRASlicesCmdTest, BadFlagsExitTwoNamingTheFlag) {
  const std::vector<std::string> node = Fixture("fewer-hcas-than-gpus.xml");
  struct Case {
    std::vector<std::string> extra;
    std::string flag;
  };
  for (const Case& c : std::vector<Case>{{{"--mode", "both"}, "--mode"},
                                         {{"--driver-name", "Not_A_Domain"}, "--driver-name"},
                                         {{"--node-name", "Node A"}, "--node-name"},
                                         {{"--log-level", "loud"}, "--log-level"},
                                         {{"--gpu-classes", "zz"}, "--gpu-classes"},
                                         {{"--shared-devices", "0"}, "--shared-devices"},
                                         {{"--shared-devices", "100001"}, "--shared-devices"}}) {
    std::vector<std::string> args = {"dra", "slices"};
    args.insert(args.end(), node.begin(), node.end());
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    if (c.flag != "--node-name") args.insert(args.end(), {"--node-name", "n"});
    const RunResult r = RunBinary(args);
    EXPECT_EQ(r.code, 2) << c.flag << ": " << r.all;
    EXPECT_THAT(r.all, HasSubstr(c.flag));
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // `dra` alone runs the driver (cmd/dra_serve_cmd.cc); a bad flag of it still exits 2.
  EXPECT_EQ(RunBinary({"dra", "--mode", "both"}).code, 2);
  EXPECT_EQ(RunBinary({"dra", "slices", "--no-such-flag"}).code, 2);
}

TEST_F(DRASlicesCmdTest, DiscoveryFailureExitsOne) {
  const RunResult r = RunBinary({"dra", "slices", "--topology-xml", dir_.Sub("missing.xml"),
                           "--node-name", "n"});
  EXPECT_EQ(r.code, 1) << r.all;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
}  // namespace rdp::cmd
