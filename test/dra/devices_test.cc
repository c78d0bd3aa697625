// BuildDevices on hand-built HCAs; the kernel's placement read as deviceattribute reads it; the
// device name round trip. `rdma-device-plugin dra slices` end to end: test/cmd.

#include "dra/devices.h"
#include "dra/health.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "dra/kernel_pci.h"
#include "hca/hca.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/support/node_builder.h"
#include "test/support/temp_dir.h"

namespace rdp::dra {
namespace {

using nlohmann::json;

constexpr char kStd[] = "resource.kubernetes.io/";

// A healthy HCA on a switch: two ACTIVE ports, uverbs and its device node present.
topology::Hca HealthyHca() {
  topology::Hca h;
  h.name = "mlx5_0";
  h.place.pci = "0000:1a:00.0";
  h.place.numa = 0;
  h.place.pcie_root = "pci0000:15";
  h.place.bridges = {{"0000:15:01.0", ""}, {"0000:16:00.0", "0000:16:00.0"},
                     {"0000:17:01.0", "0000:16:00.0"}};
  h.place.bridges_known = true;
  h.uverbs = "uverbs0";
  h.ports = {{1, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)"},
             {2, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)"}};
  h.char_devices = {{"/dev/infiniband/uverbs0", true}};
  h.netdevs = {"ibp26s0"};
  h.vendor = "15b3";
  h.device = "1021";
  h.driver = "mlx5_core";
  h.firmware_version = "28.39.1002";
  h.node_guid = "b8ce:f603:001a:0000";
  return h;
}

// The node core's view of `topo` with `flagged` as the early-warning rule's flags.
node::ViewPtr ViewOf(const topology::Topology& topo, hca::FlaggedHcas flagged = {}) {
  return node::View::Of(std::make_shared<const topology::Topology>(topo), std::move(flagged));
}

json One(const topology::Hca& hca, const DeviceOptions& opts = {},
         hca::FlaggedHcas flagged = {}) {
  const topology::Topology topo({0}, {hca}, {});
  const std::vector<json> devices = BuildDevices(*ViewOf(topo, std::move(flagged)), opts);
  EXPECT_EQ(devices.size(), 1u);
  return devices.empty() ? json() : devices[0];
}

std::string Own(const std::string& name) { return std::string(kDefaultDriverName) + "/" + name; }

TEST(DRADevicesTest, AHealthyHcasAttributes) {
  const json d = One(HealthyHca());
  EXPECT_EQ(d["name"], "hca-0000-1a-00-0");
  const json want = {
      {std::string(kStd) + "pcieRoot", {{"string", "pci0000:15"}}},
      {std::string(kStd) + "pciBusID", {{"string", "0000:1a:00.0"}}},
      {std::string(kStd) + "numaNode", {{"int", 0}}},
      {Own("hcaName"), {{"string", "mlx5_0"}}},
      {Own("pcieSwitch"), {{"string", "0000:16:00.0"}}},
      {Own("pcieTopSwitch"), {{"string", "0000:16:00.0"}}},
      {Own("linkLayer"), {{"string", "InfiniBand"}}},
      {Own("rateGbps"), {{"int", 400}}},
      {Own("uverbs"), {{"string", "uverbs0"}}},
      {Own("allPortsActive"), {{"bool", true}}},
      {Own("mode"), {{"string", "exclusive"}}},
      {Own("pciVendorID"), {{"string", "15b3"}}},
      {Own("pciDeviceID"), {{"string", "1021"}}},
      {Own("driver"), {{"string", "mlx5_core"}}},
      {Own("netdevs"), {{"string", "ibp26s0"}}},
      {Own("firmwareVersion"), {{"string", "28.39.1002"}}},
      {Own("nodeGUID"), {{"string", "b8ce:f603:001a:0000"}}},
      {Own("virtualFunction"), {{"bool", false}}},
  };
  EXPECT_EQ(d["attributes"], want) << d.dump(2);
  EXPECT_FALSE(d.contains("taints"));
  EXPECT_FALSE(d.contains("allowMultipleAllocations"));
  EXPECT_FALSE(d.contains("capacity")) << "an exclusive device has no capacity";
}

// A VF is published, marked, with its PF; a function's netdevs joined by commas.
TEST(DRADevicesTest, AVirtualFunctionIsMarkedWithItsPf) {
  topology::Hca vf = HealthyHca();
  vf.name = "mlx5_8";
  vf.place.pci = "0000:1a:00.1";
  vf.physfn = "0000:1a:00.0";
  vf.device = "101e";
  vf.netdevs = {"ibp26s0f1", "ibp26s0f1.8001"};
  const json d = One(vf);
  EXPECT_EQ(d["name"], "hca-0000-1a-00-1");
  const json& attrs = d["attributes"];
  EXPECT_EQ(attrs[Own("virtualFunction")], json({{"bool", true}}));
  EXPECT_EQ(attrs[Own("physicalFunction")], json({{"string", "0000:1a:00.0"}}));
  EXPECT_EQ(attrs[Own("pciDeviceID")], json({{"string", "101e"}}));
  EXPECT_EQ(attrs[Own("netdevs")], json({{"string", "ibp26s0f1,ibp26s0f1.8001"}}));
  EXPECT_FALSE(One(HealthyHca())["attributes"].contains(Own("physicalFunction")));
}

// An identity that is not known (an XML-only node, a file that could not be read) is left out,
// never published empty; virtualFunction is always there.
TEST(DRADevicesTest, UnknownIdentityIsLeftOut) {
  topology::Hca h = HealthyHca();
  h.vendor.clear();
  h.device.clear();
  h.driver.clear();
  h.firmware_version.clear();
  h.node_guid.clear();
  h.netdevs.clear();
  const json attrs = One(h)["attributes"];
  for (const char* name : {"pciVendorID", "pciDeviceID", "driver", "netdevs", "firmwareVersion",
                           "nodeGUID", "physicalFunction"}) {
    EXPECT_FALSE(attrs.contains(Own(name))) << name << " in " << attrs.dump();
  }
  EXPECT_EQ(attrs[Own("virtualFunction")], json({{"bool", false}}));
}

// The API allows 32 attributes and capacities per device: a device with every attribute known
// (a VF, GPUDirect known, under a switch) stays within it.
TEST(DRADevicesTest, EveryAttributeKnownStaysWithinTheApisLimit) {
  topology::Hca vf = HealthyHca();
  vf.physfn = "0000:1a:00.0";
  vf.place.pci = "0000:1a:00.1";
  DeviceOptions opts;
  opts.gpudirect_rdma = true;
  const json d = One(vf, opts);
  EXPECT_EQ(d["attributes"].size(), 20u) << d.dump(2);
  EXPECT_FALSE(d.contains("capacity"));
  EXPECT_LE(d["attributes"].size(), 32u);
}

TEST(DRADevicesTest, GpuDirectRdmaWhenKnown) {
  DeviceOptions opts;
  EXPECT_FALSE(One(HealthyHca(), opts)["attributes"].contains(Own("gpuDirectRDMA")));
  for (bool available : {true, false}) {
    opts.gpudirect_rdma = available;
    EXPECT_EQ(One(HealthyHca(), opts)["attributes"][Own("gpuDirectRDMA")],
              json({{"bool", available}}));
  }
}

TEST(DRADevicesTest, UnknownNumaSwitchLinkAndRateAreLeftOut) {
  topology::Hca h = HealthyHca();
  h.place.numa.reset();
  h.place.bridges = {{"0000:15:01.0", ""}};  // on a root port
  h.uverbs.clear();
  h.ports = {{1, "ACTIVE", "LinkUp", "", ""}};
  const json attrs = One(h)["attributes"];
  EXPECT_FALSE(attrs.contains(std::string(kStd) + "numaNode")) << attrs.dump();
  EXPECT_FALSE(attrs.contains(Own("pcieSwitch")));
  EXPECT_FALSE(attrs.contains(Own("pcieTopSwitch")));
  EXPECT_FALSE(attrs.contains(Own("linkLayer")));
  EXPECT_FALSE(attrs.contains(Own("rateGbps")));
  EXPECT_FALSE(attrs.contains(Own("uverbs")));
  EXPECT_TRUE(attrs.contains(std::string(kStd) + "pcieRoot"));
}

TEST(DRADevicesTest, TwoLevelsOfSwitchesGiveTheNearestAndTheTopSwitch) {
  topology::Hca h = HealthyHca();
  // root port, top switch (upstream, downstream), leaf switch (upstream, downstream)
  h.place.bridges = {{"0000:15:01.0", ""},
                     {"0000:16:00.0", "0000:16:00.0"},
                     {"0000:17:02.0", "0000:16:00.0"},
                     {"0000:18:00.0", "0000:18:00.0"},
                     {"0000:19:01.0", "0000:18:00.0"}};
  const json attrs = One(h)["attributes"];
  EXPECT_EQ(attrs[Own("pcieSwitch")]["string"], "0000:18:00.0");
  EXPECT_EQ(attrs[Own("pcieTopSwitch")]["string"], "0000:16:00.0");
}

TEST(DRADevicesTest, TheFirstPortGivesLinkLayerAndRate) {
  topology::Hca h = HealthyHca();
  h.ports = {{1, "ACTIVE", "LinkUp", "Ethernet", "2.5 Gb/sec (1X SDR)"},
             {2, "DOWN", "Disabled", "InfiniBand", "400 Gb/sec (4X NDR)"}};
  const json attrs = One(h)["attributes"];
  EXPECT_EQ(attrs[Own("linkLayer")]["string"], "Ethernet");
  EXPECT_EQ(attrs[Own("rateGbps")]["int"], 2);
  EXPECT_EQ(attrs[Own("allPortsActive")]["bool"], false);
}

TEST(DRADevicesTest, TheKernelsViewGivesTheStandardPlacement) {
  topology::Hca h = HealthyHca();  // hwloc said pci0000:15, NUMA 0
  DeviceOptions opts;
  opts.kernel[h.place.pci] = KernelPci{"pci0000:14", std::nullopt};  // numa_node -1
  const json attrs = One(h, opts)["attributes"];
  EXPECT_EQ(attrs[std::string(kStd) + "pcieRoot"]["string"], "pci0000:14");
  EXPECT_FALSE(attrs.contains(std::string(kStd) + "numaNode")) << attrs.dump();

  opts.kernel[h.place.pci] = KernelPci{"pci0000:15", 1};
  EXPECT_EQ(One(h, opts)["attributes"][std::string(kStd) + "numaNode"]["int"], 1);
}

TEST(DRADevicesTest, AnAddressTheHelpersRejectHasNoStandardAttribute) {
  topology::Hca h = HealthyHca();
  h.place.pci = "10000:01:00.0";  // a VMD domain
  const json d = One(h);
  EXPECT_EQ(d["name"], "hca-10000-01-00-0");
  for (const auto& [key, value] : d["attributes"].items()) {
    EXPECT_THAT(key, ::testing::Not(::testing::StartsWith(kStd)));
  }
}

TEST(DRADevicesTest, StringsOverTheApisLimitAreLeftOut) {
  topology::Hca h = HealthyHca();
  h.name = std::string(65, 'm');
  EXPECT_FALSE(One(h)["attributes"].contains(Own("hcaName")));
  h.name = std::string(64, 'm');
  EXPECT_EQ(One(h)["attributes"][Own("hcaName")]["string"], h.name);
}

TEST(DRADevicesTest, AnUnusableHcaIsTaintedWithItsReasonClass) {
  struct Case {
    std::string what;
    topology::Hca hca;
    std::string value;
  };
  std::vector<Case> cases;
  topology::Hca down = HealthyHca();
  for (topology::Port& port : down.ports) port.state = "DOWN";
  cases.push_back({"every port down", down, "PortNotActive"});
  topology::Hca init = HealthyHca();
  for (topology::Port& port : init.ports) port.state = "DOWN";
  init.ports[0].state = "INIT";
  cases.push_back({"port 1 init, the others down", init, "PortInit"});
  topology::Hca no_ports = HealthyHca();
  no_ports.ports.clear();
  cases.push_back({"no port", no_ports, "NoPortState"});
  topology::Hca no_uverbs = HealthyHca();
  no_uverbs.uverbs.clear();
  cases.push_back({"no uverbs", no_uverbs, "NoUverbsDevice"});
  topology::Hca missing = HealthyHca();
  missing.char_devices[0].second = false;
  cases.push_back({"uverbs0 missing", missing, "DeviceNodeMissing"});

  DeviceOptions opts;
  opts.driver_name = "rdma.example.com";
  for (const Case& c : cases) {
    ASSERT_FALSE(hca::Assess(c.hca).usable) << c.what;
    const json d = One(c.hca, opts);
    const json want = json::array(
        {{{"key", "rdma.example.com/unhealthy"}, {"value", c.value}, {"effect", "NoSchedule"}}});
    EXPECT_EQ(d["taints"], want) << c.what << ": " << hca::Assess(c.hca).reason;
  }
  // Healthy again: no taint at all.
  EXPECT_FALSE(One(HealthyHca(), opts).contains("taints"));
  // One ACTIVE port is enough: a dual-port card with one port uncabled is usable.
  topology::Hca one_down = HealthyHca();
  one_down.ports[1].state = "DOWN";
  const json d = One(one_down, opts);
  EXPECT_FALSE(d.contains("taints")) << d.dump();
  EXPECT_EQ(d["attributes"]["rdma.example.com/allPortsActive"]["bool"], false);
}

// A control plane that drops taints (DRADeviceTaints off): no device rather than an untainted one
// that the scheduler would allocate and Prepare would refuse.
TEST(DRADevicesTest, WithoutTaintsAnUnusableHcaIsLeftOut) {
  DeviceOptions opts;
  opts.taints = false;
  topology::Hca down = HealthyHca();
  down.place.pci = "0000:1b:00.0";
  down.name = "mlx5_1";
  down.uverbs.clear();
  const topology::Topology topo({0}, {HealthyHca(), down}, {});
  const std::vector<json> devices = BuildDevices(*ViewOf(topo), opts);
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0]["name"], "hca-0000-1a-00-0");
  EXPECT_FALSE(devices[0].contains("taints"));
}

// A name read from sysfs that is not UTF-8 cannot be a JSON string: left out, as an over-long
// one is, so that nothing downstream (the API client's dump()) meets it.
TEST(DRADevicesTest, StringsThatAreNotUtf8AreLeftOut) {
  topology::Hca h = HealthyHca();
  h.name = "mlx5_\xff";
  const json d = One(h);
  EXPECT_FALSE(d["attributes"].contains(Own("hcaName")));
  EXPECT_NO_THROW(d.dump());
}

TEST(DRADevicesTest, SharedModeAllowsMultipleAllocationsOfEveryDevice) {
  DeviceOptions opts;
  opts.mode = hca::Mode::kShared;
  topology::Hca down = HealthyHca();
  down.place.pci = "0000:1b:00.0";
  down.name = "mlx5_1";
  for (topology::Port& port : down.ports) port.state = "DOWN";
  const topology::Topology topo({0}, {HealthyHca(), down}, {});
  const std::vector<json> devices = BuildDevices(*ViewOf(topo), opts);
  ASSERT_EQ(devices.size(), 2u);
  for (const json& d : devices) {
    EXPECT_EQ(d["allowMultipleAllocations"], true) << d.dump();
    EXPECT_EQ(d["attributes"][Own("mode")]["string"], "shared");
  }
  EXPECT_FALSE(devices[0].contains("taints"));
  EXPECT_TRUE(devices[1].contains("taints")) << "a shared device is still tainted when unusable";
}

// Shared mode: each device's pods (claims) and bandwidthGbps (the first port's rate) are
// consumable, with the request policies a claim that asks nothing, or a fraction, is held to.
TEST(DRADevicesTest, SharedModeDevicesCarryPodsAndBandwidthCapacity) {
  DeviceOptions opts;
  opts.mode = hca::Mode::kShared;
  const json want = {
      {"pods",
       {{"value", "1k"},  // as the API server writes 1000 back
        {"requestPolicy", {{"default", "1"}, {"validRange", {{"min", "1"}, {"step", "1"}}}}}}},
      {"bandwidthGbps",
       {{"value", "400"},
        {"requestPolicy", {{"default", "0"}, {"validRange", {{"min", "0"}, {"step", "1"}}}}}}},
  };
  EXPECT_EQ(One(HealthyHca(), opts)["capacity"], want) << One(HealthyHca(), opts).dump(2);

  for (const auto& [units, quantity] : std::vector<std::pair<std::int64_t, std::string>>{
           {1500, "1500"}, {2000, "2k"}, {100000, "100k"}, {7, "7"}}) {
    opts.shared_units = units;
    EXPECT_EQ(One(HealthyHca(), opts)["capacity"]["pods"]["value"], quantity) << units;
  }
  opts.shared_units = 250;
  topology::Hca ethernet = HealthyHca();
  ethernet.ports = {{1, "ACTIVE", "LinkUp", "Ethernet", "100 Gb/sec (4X EDR)"}};
  const json capacity = One(ethernet, opts)["capacity"];
  EXPECT_EQ(capacity["pods"]["value"], "250");
  EXPECT_EQ(capacity["bandwidthGbps"]["value"], "100");
}

TEST(DRADevicesTest, SharedCapacityStaysValidAtItsEdges) {
  DeviceOptions opts;
  opts.mode = hca::Mode::kShared;
  topology::Hca h = HealthyHca();
  h.ports = {{1, "ACTIVE", "LinkUp", "InfiniBand", ""}};  // rate not known
  json capacity = One(h, opts)["capacity"];
  EXPECT_TRUE(capacity.contains("pods"));
  EXPECT_FALSE(capacity.contains("bandwidthGbps")) << capacity.dump();
  h.ports = {{1, "ACTIVE", "LinkUp", "InfiniBand", "0 Gb/sec"}};
  EXPECT_FALSE(One(h, opts)["capacity"].contains("bandwidthGbps"));
  h.ports.clear();
  EXPECT_FALSE(One(h, opts)["capacity"].contains("bandwidthGbps"));
  // One unit: min 1 plus a step of 1 would exceed the value, which the API refuses.
  opts.shared_units = 1;
  h = HealthyHca();
  capacity = One(h, opts)["capacity"];
  EXPECT_EQ(capacity["pods"],
            json({{"value", "1"},
                  {"requestPolicy", {{"default", "1"}, {"validRange", {{"min", "1"}}}}}}));
  // 1X SDR's 2.5 Gb/s is 2 whole Gb/s, as rateGbps says.
  h.ports = {{1, "ACTIVE", "LinkUp", "InfiniBand", "2.5 Gb/sec (1X SDR)"}};
  EXPECT_EQ(One(h, opts)["capacity"]["bandwidthGbps"]["value"], "2");
}

TEST(DRADevicesTest, OurAttributesLiveUnderTheDriversDomain) {
  DeviceOptions opts;
  opts.driver_name = "rdma.example.com";
  const nlohmann::json device = One(HealthyHca(), opts);  // the loop must not outlive it
  for (const auto& [key, value] : device["attributes"].items()) {
    if (key.rfind(kStd, 0) == 0) continue;
    EXPECT_EQ(key.rfind("rdma.example.com/", 0), 0u) << key;
    // The identifier after the domain: a C identifier of at most 32 characters.
    const std::string id = key.substr(key.find('/') + 1);
    EXPECT_LE(id.size(), 32u) << key;
    EXPECT_TRUE(std::all_of(id.begin(), id.end(),
                            [](char c) { return std::isalnum(c) || c == '_'; }))
        << key;
  }
}

bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

TEST(DRADeviceNameTest, RoundTripsOnEveryHcaAndIsADnsLabel) {
  const topology::TopologyPtr topo = rdp::testing::DgxH100Like();
  ASSERT_GT(topo->hcas().size(), 1u);
  std::set<std::string> names;
  for (std::size_t i = 0; i < topo->hcas().size(); ++i) {
    const std::string name = DeviceName(topo->hcas()[i]);
    EXPECT_TRUE(IsDnsLabel(name)) << name;
    EXPECT_EQ(FindHca(*topo, name), static_cast<int>(i)) << name;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), topo->hcas().size());
  EXPECT_EQ(FindHca(*topo, "hca-ffff-ff-1f-7"), -1);
  EXPECT_EQ(FindHca(*topo, ""), -1);
  const std::vector<json> devices = BuildDevices(*node::View::Of(topo), {});
  for (std::size_t i = 0; i < devices.size(); ++i) {
    EXPECT_EQ(FindHca(*topo, devices[i]["name"].get<std::string>()), static_cast<int>(i));
  }
}

TEST(DRADeviceNameTest, ARenamedHcaKeepsItsName) {
  topology::Hca h = HealthyHca();
  const std::string before = DeviceName(h);
  h.name = "mlx5_bond_0";
  h.uverbs = "uverbs7";
  EXPECT_EQ(DeviceName(h), before);
}

TEST(DRANamesTest, DriverAndNodeNames) {
  EXPECT_TRUE(ValidateDriverName(kDefaultDriverName).ok());
  EXPECT_TRUE(ValidateDriverName("gpu.example.com").ok());
  EXPECT_FALSE(ValidateDriverName("").ok());
  EXPECT_FALSE(ValidateDriverName("RDMA.example.com").ok());
  EXPECT_FALSE(ValidateDriverName("rdma..example.com").ok());
  EXPECT_FALSE(ValidateDriverName("-rdma.example.com").ok());
  EXPECT_FALSE(ValidateDriverName("rdma/example").ok());
  EXPECT_FALSE(ValidateDriverName(std::string(60, 'a') + ".com").ok());  // 64 characters
  EXPECT_TRUE(ValidateNodeName("node-a.zone-1").ok());
  EXPECT_TRUE(ValidateNodeName(std::string(253, 'n')).ok());
  EXPECT_FALSE(ValidateNodeName(std::string(254, 'n')).ok());
  EXPECT_FALSE(ValidateNodeName("Node-A").ok());
  EXPECT_FALSE(ValidateNodeName("node_a").ok());
}

// A sysfs tree as the kernel lays a PCI function out, with its /sys/bus/pci/devices link.
void LayOut(const std::string& root, const std::string& dev_path, const std::string& pci,
            const std::string& numa) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(root) / "sys/devices" / dev_path;
  fs::create_directories(dir);
  if (!numa.empty()) std::ofstream(dir / "numa_node") << numa << "\n";
  const fs::path link = fs::path(root) / "sys/bus/pci/devices" / pci;
  fs::create_directories(link.parent_path());
  fs::create_symlink(fs::path("../../../devices") / dev_path, link);
}

TEST(DRAKernelPciTest, ReadsAsDeviceattributeHelpersDo) {
  rdp::testing::TempDir dir;
  LayOut(dir.path(), "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:1a:00.0",
         "0000:1a:00.0", "1");
  LayOut(dir.path(), "pci0000:80/0000:80:02.2/0000:82:00.0", "0000:82:00.0", "-1");
  LayOut(dir.path(), "pci0000:00/0000:00:03.0", "0000:00:03.0", "");  // no numa_node file
  LayOut(dir.path(), "platform/foo/0000:05:00.0", "0000:05:00.0", "0");  // not under pci*
  LayOut(dir.path(), "pci0000:00/0000:00:04.0", "0000:06:00.0", "0");    // ends elsewhere
  auto env = NewNodeEnv({dir.path(), dir.path(), dir.path()});

  auto a = ReadKernelPci(*env, "0000:1a:00.0");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->pcie_root, "pci0000:15");
  EXPECT_EQ(a->numa, 1);
  auto b = ReadKernelPci(*env, "0000:82:00.0");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->pcie_root, "pci0000:80");
  EXPECT_FALSE(b->numa.has_value());
  auto c = ReadKernelPci(*env, "0000:00:03.0");
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->numa.has_value());
  EXPECT_FALSE(ReadKernelPci(*env, "0000:05:00.0").has_value());
  EXPECT_FALSE(ReadKernelPci(*env, "0000:06:00.0").has_value());
  EXPECT_FALSE(ReadKernelPci(*env, "0000:99:00.0").has_value());  // no link at all
  EXPECT_FALSE(ReadKernelPci(*env, "0000:1A:00.0").has_value());  // the helpers want lower case

  EXPECT_TRUE(IsStandardBdf("0123:45:1e.7"));
  EXPECT_FALSE(IsStandardBdf("10000:01:00.0"));
  EXPECT_FALSE(IsStandardBdf("45:1e.7"));
  EXPECT_FALSE(IsStandardBdf("0000:1a:00.8x"));
}

// Early-warning health (hca/early_warning.h): a degraded HCA stays usable and carries the
// degraded taint, naming the counter, with effect None (it informs); one held for flapping is
// unhealthy (class Flapping, NoSchedule).
// Without taints the degraded one is offered untainted and the held one left out.
TEST(DRADevicesTest, EarlyWarningTaints) {
  DeviceOptions opts;
  opts.driver_name = "rdma.example.com";
  hca::EarlyWarningStatus symbol_errors;
  symbol_errors.degraded = true;
  symbol_errors.degraded_counter = "symbol_error";
  hca::EarlyWarningStatus link_downed = symbol_errors;
  link_downed.degraded_counter = "link_downed";
  hca::EarlyWarningStatus held;
  held.held = true;
  held.held_reason = "its ports flapped 4 times within 10m (more than 3)";
  for (const auto& [status, key, value, effect] :
       {std::make_tuple(symbol_errors, "rdma.example.com/degraded", "SymbolErrors", "None"),
        std::make_tuple(link_downed, "rdma.example.com/degraded", "LinkDowned", "None"),
        std::make_tuple(held, "rdma.example.com/unhealthy", "Flapping", "NoSchedule")}) {
    const json want = json::array({{{"key", key}, {"value", value}, {"effect", effect}}});
    EXPECT_EQ(One(HealthyHca(), opts, {{"0000:1a:00.0", status}})["taints"], want) << value;
  }
  // A flag on another HCA changes nothing here.
  EXPECT_FALSE(One(HealthyHca(), opts, {{"0000:ff:00.0", held}}).contains("taints"));

  opts.taints = false;
  EXPECT_FALSE(One(HealthyHca(), opts, {{"0000:1a:00.0", symbol_errors}}).contains("taints"));
  const topology::Topology topo({0}, {HealthyHca()}, {});
  EXPECT_TRUE(BuildDevices(*ViewOf(topo, {{"0000:1a:00.0", held}}), opts).empty());
}

// While the node's health scan fails, every HCA is unusable (class ScanFailed): its last state is
// not known to hold. Without taints none is offered.
TEST(DRADevicesTest, AFailedHealthScanTaintsEveryHca) {
  topology::Hca other = HealthyHca();
  other.name = "mlx5_1";
  other.place.pci = "0000:1b:00.0";
  auto view = std::make_shared<node::View>(*ViewOf(topology::Topology({0}, {HealthyHca(), other}, {})));
  view->scan_error = "/sys/class/infiniband: not mounted";
  DeviceOptions opts;
  opts.driver_name = "rdma.example.com";
  const std::vector<json> devices = BuildDevices(*view, opts);
  ASSERT_EQ(devices.size(), 2u);
  const json want = json::array(
      {{{"key", "rdma.example.com/unhealthy"}, {"value", "ScanFailed"}, {"effect", "NoSchedule"}}});
  for (const json& d : devices) EXPECT_EQ(d["taints"], want) << d.dump();
  const std::vector<DeviceHealth> health = DeviceHealthOf(*view, "node-a");
  ASSERT_EQ(health.size(), 2u);
  EXPECT_EQ(health[1].state, DeviceHealth::State::kUnhealthy);
  EXPECT_EQ(health[1].message,
            "mlx5_1: the health scan failed: /sys/class/infiniband: not mounted");
  opts.taints = false;
  EXPECT_TRUE(BuildDevices(*view, opts).empty());
}

// An HCA whose RDMA driver is away (the node core keeps it under its PCI address, without device
// nodes) stays in the slice, tainted DriverNotBound; the others are not tainted. Without taints
// it is not offered.
TEST(DRADevicesTest, AnHcaWhoseDriverIsAwayStaysTaintedDriverNotBound) {
  topology::Hca away = HealthyHca();
  away.name = "mlx5_1";
  away.place.pci = "0000:1b:00.0";
  away.uverbs.clear();
  away.umad.clear();
  away.issm.clear();
  away.char_devices.clear();
  for (topology::Port& port : away.ports) port.state.clear();
  auto view =
      std::make_shared<node::View>(*ViewOf(topology::Topology({0}, {HealthyHca(), away}, {})));
  view->driver_away = {"0000:1b:00.0"};
  DeviceOptions opts;
  opts.driver_name = "rdma.example.com";
  const std::vector<json> devices = BuildDevices(*view, opts);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_FALSE(devices[0].contains("taints")) << devices[0].dump();
  const json want = json::array({{{"key", "rdma.example.com/unhealthy"},
                                  {"value", "DriverNotBound"},
                                  {"effect", "NoSchedule"}}});
  EXPECT_EQ(devices[1]["taints"], want) << devices[1].dump();
  const std::vector<DeviceHealth> health = DeviceHealthOf(*view, "node-a");
  ASSERT_EQ(health.size(), 2u);
  EXPECT_EQ(health[1].state, DeviceHealth::State::kUnhealthy);
  EXPECT_THAT(health[1].message, ::testing::HasSubstr("its RDMA driver is not bound"));
  opts.taints = false;
  EXPECT_EQ(BuildDevices(*view, opts).size(), 1u);
}

// The health stream says the same: a held HCA is Unhealthy with the rule's reason, a degraded one
// Healthy.
TEST(DRADevicesTest, EarlyWarningInTheHealthStream) {
  topology::Hca other = HealthyHca();
  other.name = "mlx5_1";
  other.place.pci = "0000:1b:00.0";
  const topology::Topology topo({0}, {HealthyHca(), other}, {});
  hca::EarlyWarningStatus held;
  held.held = true;
  held.held_reason = "its ports flapped 4 times within 10m (more than 3)";
  hca::EarlyWarningStatus degraded;
  degraded.degraded = true;
  const std::vector<DeviceHealth> got =
      DeviceHealthOf(*ViewOf(topo, {{"0000:1a:00.0", held}, {"0000:1b:00.0", degraded}}), "node-a");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].state, DeviceHealth::State::kUnhealthy);
  EXPECT_EQ(got[0].message,
            "mlx5_0: flapping: its ports flapped 4 times within 10m (more than 3)");
  EXPECT_EQ(got[1].state, DeviceHealth::State::kHealthy);
  EXPECT_EQ(DeviceHealthOf(*ViewOf(topo), "node-a")[0].state, DeviceHealth::State::kHealthy);
}

}  // namespace
}  // namespace rdp::dra
