// The device-taint table (dra/taints.h): each state of an HCA, built as the node core sees it,
// to the key, value and effect its device carries in the slice (BuildDevices), and the
// effect None left out where the control plane refuses it.

#include "dra/taints.h"

#include <memory>
#include <string>
#include <vector>

#include "dra/devices.h"
#include "gtest/gtest.h"
#include "hca/early_warning.h"
#include "node/node.h"

namespace rdp::dra {
namespace {

using nlohmann::json;

constexpr char kDriver[] = "rdma.example.com";
constexpr char kPci[] = "0000:1a:00.0";

// Two ACTIVE ports, uverbs0 and its device node present.
topology::Hca HealthyHca() {
  topology::Hca h;
  h.name = "mlx5_0";
  h.place.pci = kPci;
  h.place.numa = 0;
  h.place.pcie_root = "pci0000:15";
  h.uverbs = "uverbs0";
  h.ports = {{1, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)"},
             {2, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)"}};
  h.char_devices = {{"/dev/infiniband/uverbs0", true}};
  return h;
}

topology::Hca WithPorts(const std::string& first, const std::string& second) {
  topology::Hca h = HealthyHca();
  h.ports[0].state = first;
  h.ports[1].state = second;
  return h;
}

// One HCA in one state, as the node core's view holds it.
struct Case {
  std::string what;
  topology::Hca hca = HealthyHca();
  hca::FlaggedHcas flagged;
  std::string scan_error;
  bool driver_away = false;
  // What its device carries: "" for no taint.
  std::string key, value, effect;
};

hca::EarlyWarningStatus Degraded(const std::string& counter) {
  hca::EarlyWarningStatus s;
  s.degraded = true;
  s.degraded_counter = counter;
  s.degraded_reason = "port 1's " + counter + " grew by 25 within 10m (more than 10)";
  return s;
}

std::vector<Case> Cases() {
  const std::string unhealthy = std::string(kDriver) + "/unhealthy";
  const std::string degraded = std::string(kDriver) + "/degraded";
  std::vector<Case> cases;
  cases.push_back({"healthy", HealthyHca(), {}, "", false, "", "", ""});
  cases.push_back({"both ports INIT after boot", WithPorts("INIT", "INIT"), {}, "", false,
                   unhealthy, "PortInit", "NoSchedule"});
  cases.push_back({"port 1 ARMED, port 2 DOWN", WithPorts("ARMED", "DOWN"), {}, "", false,
                   unhealthy, "PortInit", "NoSchedule"});
  cases.push_back({"port 1 DOWN, port 2 INIT", WithPorts("DOWN", "INIT"), {}, "", false,
                   unhealthy, "PortInit", "NoSchedule"});
  cases.push_back({"both ports DOWN", WithPorts("DOWN", "DOWN"), {}, "", false, unhealthy,
                   "PortNotActive", "NoSchedule"});
  cases.push_back({"port states unknown", WithPorts("", ""), {}, "", false, unhealthy,
                   "PortNotActive", "NoSchedule"});
  cases.push_back({"one port ACTIVE, the other INIT: usable", WithPorts("ACTIVE", "INIT"), {}, "",
                   false, "", "", ""});
  topology::Hca no_ports = HealthyHca();
  no_ports.ports.clear();
  cases.push_back({"no port state", no_ports, {}, "", false, unhealthy, "NoPortState",
                   "NoSchedule"});
  topology::Hca no_uverbs = HealthyHca();
  no_uverbs.uverbs.clear();
  cases.push_back({"no uverbs device", no_uverbs, {}, "", false, unhealthy, "NoUverbsDevice",
                   "NoSchedule"});
  topology::Hca missing = HealthyHca();
  missing.char_devices[0].second = false;
  cases.push_back({"uverbs0 missing", missing, {}, "", false, unhealthy, "DeviceNodeMissing",
                   "NoSchedule"});
  topology::Hca away = HealthyHca();
  away.uverbs.clear();
  away.char_devices.clear();
  for (topology::Port& p : away.ports) p.state.clear();
  cases.push_back({"driver away", away, {}, "", true, unhealthy, "DriverNotBound", "NoSchedule"});
  cases.push_back({"health scan failing", HealthyHca(), {}, "/sys/class/infiniband: gone", false,
                   unhealthy, "ScanFailed", "NoSchedule"});
  hca::EarlyWarningStatus held;
  held.held = true;
  held.held_reason = "its ports flapped 4 times within 10m (more than 3)";
  cases.push_back({"flapping", HealthyHca(), {{kPci, held}}, "", false, unhealthy, "Flapping",
                   "NoSchedule"});
  cases.push_back({"degraded by symbol errors", HealthyHca(), {{kPci, Degraded("symbol_error")}},
                   "", false, degraded, "SymbolErrors", "None"});
  cases.push_back({"degraded by link downs", HealthyHca(), {{kPci, Degraded("link_downed")}}, "",
                   false, degraded, "LinkDowned", "None"});
  // Unusable wins over degraded: the port state is what keeps new claims off.
  cases.push_back({"INIT and degraded", WithPorts("INIT", "INIT"),
                   {{kPci, Degraded("symbol_error")}}, "", false, unhealthy, "PortInit",
                   "NoSchedule"});
  return cases;
}

std::shared_ptr<const node::View> ViewOf(const Case& c) {
  auto view = std::make_shared<node::View>(*node::View::Of(
      std::make_shared<const topology::Topology>(topology::Topology({0}, {c.hca}, {})),
      c.flagged));
  view->scan_error = c.scan_error;
  if (c.driver_away) view->driver_away = {kPci};
  return view;
}

std::vector<json> Devices(const Case& c, const DeviceOptions& opts) {
  return BuildDevices(*ViewOf(c), opts);
}

TEST(DRATaintsTest, EachStateGetsItsKeyValueAndEffect) {
  DeviceOptions opts;
  opts.driver_name = kDriver;
  for (const Case& c : Cases()) {
    const std::vector<json> devices = Devices(c, opts);
    ASSERT_EQ(devices.size(), 1u) << c.what;
    if (c.key.empty()) {
      EXPECT_FALSE(devices[0].contains("taints")) << c.what << ": " << devices[0].dump();
      continue;
    }
    const json want =
        json::array({{{"key", c.key}, {"value", c.value}, {"effect", c.effect}}});
    EXPECT_EQ(devices[0]["taints"], want) << c.what;
  }
}

// The table itself: NoSchedule for every unusable state, None for the degraded ones, and
// NoExecute for none (every state can be transient; NoExecute evicts running pods).
TEST(DRATaintsTest, NoStateEvictsAndOnlyDegradedInforms) {
  for (int i = 0; i <= static_cast<int>(TaintedState::kLinkDowned); ++i) {
    const auto state = static_cast<TaintedState>(i);
    const DeviceTaint t = TaintOf(state, kDriver);
    EXPECT_NE(t.effect, "NoExecute") << t.value;
    EXPECT_FALSE(t.value.empty()) << i;
    const bool degraded =
        state == TaintedState::kSymbolErrors || state == TaintedState::kLinkDowned;
    EXPECT_EQ(t.effect, degraded ? kEffectNone : kEffectNoSchedule) << t.value;
    EXPECT_EQ(t.key, std::string(kDriver) + (degraded ? "/degraded" : "/unhealthy")) << t.value;
  }
}

// A control plane that refuses the effect None (older than 1.35): a degraded HCA is offered
// untainted; the NoSchedule taints are kept.
TEST(DRATaintsTest, WithoutEffectNoneTheInformingTaintIsLeftOut) {
  DeviceOptions opts;
  opts.driver_name = kDriver;
  opts.taint_effect_none = false;
  for (const Case& c : Cases()) {
    const std::vector<json> devices = Devices(c, opts);
    ASSERT_EQ(devices.size(), 1u) << c.what;
    if (c.effect == "NoSchedule") {
      EXPECT_EQ(devices[0]["taints"][0]["value"], c.value) << c.what;
    } else {
      EXPECT_FALSE(devices[0].contains("taints")) << c.what << ": " << devices[0].dump();
    }
  }
}

// A control plane that drops taints altogether: the unusable HCAs are left out, the degraded
// ones offered untainted.
TEST(DRATaintsTest, WithoutTaintsUnusableHcasAreLeftOut) {
  DeviceOptions opts;
  opts.driver_name = kDriver;
  opts.taints = false;
  for (const Case& c : Cases()) {
    const std::vector<json> devices = Devices(c, opts);
    if (c.effect == "NoSchedule") {
      EXPECT_TRUE(devices.empty()) << c.what;
    } else {
      ASSERT_EQ(devices.size(), 1u) << c.what;
      EXPECT_FALSE(devices[0].contains("taints")) << c.what;
    }
  }
}

}  // namespace
}  // namespace rdp::dra
