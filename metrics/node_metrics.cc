#include "metrics/node_metrics.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "topology/gpudirect.h"

namespace rdp::metrics {
namespace {


// The port counters read from ports/<n>/counters/<file>: (file, metric, help, scale). The data
// counters count 4-octet words (the InfiniBand PortCounters attribute), hence the 4.
struct PortCounter {
  const char* file;
  const char* metric;
  const char* help;
  std::uint64_t scale;
};
constexpr PortCounter kPortCounters[] = {
    {"port_rcv_data", "port_data_received_bytes_total",
     "Bytes received on the port (sysfs counters/port_rcv_data x 4).", 4},
    {"port_xmit_data", "port_data_transmitted_bytes_total",
     "Bytes transmitted on the port (sysfs counters/port_xmit_data x 4).", 4},
    {"port_rcv_packets", "port_packets_received_total",
     "Packets received on the port (sysfs counters/port_rcv_packets).", 1},
    {"port_xmit_packets", "port_packets_transmitted_total",
     "Packets transmitted on the port (sysfs counters/port_xmit_packets).", 1},
    {"symbol_error", "port_symbol_errors_total",
     "Minor link errors detected on the port's physical lanes (sysfs counters/symbol_error).", 1},
    {"link_downed", "port_link_downed_total",
     "Times the port's link went down after failing to recover (sysfs counters/link_downed).", 1},
    {"port_rcv_errors", "port_receive_errors_total",
     "Packets with errors received on the port (sysfs counters/port_rcv_errors).", 1},
};

std::string NumaLabel(const std::optional<int>& numa) {
  return numa ? std::to_string(*numa) : "unknown";
}

// "<namespace>/<pod>/<container>" split; the names cannot hold '/'.
std::array<std::string, 3> SplitKey(const std::string& key) {
  std::array<std::string, 3> parts;
  std::size_t start = 0;
  for (int i = 0; i < 3; ++i) {
    const std::size_t slash = i < 2 ? key.find('/', start) : std::string::npos;
    parts[i] = key.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return parts;
}

static_assert(std::size(kPortCounters) == PortCounterCache::kCounters);

PortCounterCache::PortValues ReadPorts(const topology::Hca& hca, Env& env) {
  PortCounterCache::PortValues out;
  for (const topology::Port& port : hca.ports) {
    auto& [number, values] = out.emplace_back(port.number, decltype(out)::value_type::second_type{});
    const std::string dir = absl::StrCat("/sys/class/infiniband/", hca.name, "/ports/",
                                         port.number, "/counters/");
    for (std::size_t i = 0; i < std::size(kPortCounters); ++i) {
      std::optional<std::string> text = ReadAttribute(env, dir + kPortCounters[i].file);
      std::uint64_t v = 0;
      if (text && absl::SimpleAtoi(*text, &v)) values[i] = v * kPortCounters[i].scale;
    }
  }
  return out;
}

void WritePortCounters(const NodeMetricsInput& node, Env& env, PortCounterCache& counters,
                       Exposition& out) {
  if (!node.topology) return;
  const std::map<std::string, PortCounterCache::PortValues> read =
      counters.Read(*node.topology, env);
  // Family by family (the format groups a family's samples), HCAs in the snapshot's order.
  for (std::size_t i = 0; i < std::size(kPortCounters); ++i) {
    bool opened = false;
    for (const topology::Hca& hca : node.topology->hcas()) {
      auto it = read.find(hca.name);
      if (it == read.end()) continue;
      for (const auto& [port, values] : it->second) {
        if (!values[i]) continue;
        if (!opened) {
          out.Family(Name(kPortCounters[i].metric), kPortCounters[i].help,
                     Exposition::Type::kCounter);
          opened = true;
        }
        out.Sample({{"hca", hca.name}, {"port", std::to_string(port)}},
                   static_cast<double>(*values[i]));
      }
    }
  }
}

void WriteAllocations(const NodeMetricsInput& node, Exposition& out) {
  std::map<std::string, std::string> names;  // PCI -> HCA name
  for (const hca::AdvertisedHca& h : node.hcas) names[h.pci] = h.name;
  struct Held {
    std::array<std::string, 3> who;
    std::string resource;
    std::string pci;
  };
  struct Units {
    std::array<std::string, 3> who;
    std::string resource;
    int units = 0;
  };
  std::vector<Held> exclusive;
  std::vector<Units> shared;
  for (const NodeMetricsInput::Holder& h : node.holders) {
    int units = 0;
    for (const std::string& id : h.ids) {
      if (std::optional<std::string> pci = topology::NormalizePci(id)) {
        if (names.count(*pci)) exclusive.push_back({SplitKey(h.container), h.resource, *pci});
      } else {
        ++units;
      }
    }
    if (units > 0) shared.push_back({SplitKey(h.container), h.resource, units});
  }
  out.Family(Name("hca_allocated"),
             "1 for each container that holds the HCA as an exclusive device (pod-resources).",
             Exposition::Type::kGauge);
  for (const Held& h : exclusive) {
    out.Sample({{"hca", names[h.pci]},
                {"pci", h.pci},
                {"namespace", h.who[0]},
                {"pod", h.who[1]},
                {"container", h.who[2]},
                {"resource", h.resource}},
               1);
  }
  out.Family(Name("shared_allocated"),
             "Shared-mode units each container holds; such a container sees every HCA "
             "(pod-resources).",
             Exposition::Type::kGauge);
  for (const Units& u : shared) {
    out.Sample({{"namespace", u.who[0]},
                {"pod", u.who[1]},
                {"container", u.who[2]},
                {"resource", u.resource}},
               u.units);
  }
}

}  // namespace

std::map<std::string, PortCounterCache::PortValues> PortCounterCache::Read(
    const topology::Topology& topology, Env& env) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, Entry> kept;
  std::vector<std::pair<absl::Time, const topology::Hca*>> order;
  for (const topology::Hca& hca : topology.hcas()) {
    const std::string key = absl::StrCat(hca.place.pci, " ", hca.name);
    auto it = by_hca_.find(key);
    Entry& e = kept[key];
    if (it != by_hca_.end()) e = std::move(it->second);
    order.emplace_back(e.read, &hca);
  }
  by_hca_.swap(kept);
  // The HCAs read longest ago first, so that a budget too small for all still reaches each.
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const absl::Time deadline = options_.now() + options_.budget;
  for (const auto& [when, hca] : order) {
    const absl::Time now = options_.now();
    if (now - when < options_.max_age) continue;
    if (now >= deadline) break;
    Entry& e = by_hca_[absl::StrCat(hca->place.pci, " ", hca->name)];
    e.ports = ReadPorts(*hca, env);
    e.read = options_.now();
  }
  std::map<std::string, PortValues> out;
  for (const topology::Hca& hca : topology.hcas()) {
    const Entry& e = by_hca_[absl::StrCat(hca.place.pci, " ", hca.name)];
    if (e.read != absl::InfinitePast()) out[hca.name] = e.ports;
  }
  return out;
}

void WriteNodeMetrics(const NodeMetricsInput& node, Env& env, PortCounterCache& counters,
                      Exposition& out) {
  out.Family(Name("hca_healthy"),
             "1 when the HCA is present, at least one port is ACTIVE and its device nodes "
             "exist; 0 otherwise (a vanished HCA stays listed until forgotten).",
             Exposition::Type::kGauge);
  for (const hca::AdvertisedHca& h : node.hcas) {
    out.Sample({{"hca", h.name}, {"pci", h.pci}}, h.present && h.healthy ? 1 : 0);
  }
  out.Family(Name("hca_withheld"),
             "1 when the HCA is not offered because containers may still hold it under the "
             "other mode, or the kubelet's pod list is not known yet.",
             Exposition::Type::kGauge);
  for (const hca::AdvertisedHca& h : node.hcas) {
    out.Sample({{"hca", h.name}, {"pci", h.pci}}, node.withheld.count(h.pci) ? 1 : 0);
  }
  // Early-warning health: one series per HCA, so that an alert on "== 1" also sees it clear.
  auto write_flag = [&node, &out](const std::string& family, const char* help,
                                  bool hca::EarlyWarningStatus::*flag) {
    out.Family(family, help, Exposition::Type::kGauge);
    for (const hca::AdvertisedHca& h : node.hcas) {
      const auto it = node.early_warning.find(h.pci);
      out.Sample({{"hca", h.name}, {"pci", h.pci}},
                 it != node.early_warning.end() && it->second.*flag ? 1 : 0);
    }
  };
  write_flag(Name("hca_degraded"),
             "1 while the HCA's symbol_error or link_downed counters grow faster than the "
             "early-warning thresholds: still served, new pods get other HCAs.",
             &hca::EarlyWarningStatus::degraded);
  write_flag(Name("hca_flapping"),
             "1 while the HCA is held unhealthy because its ports flapped more often than the "
             "early-warning rule allows, until they have been stable long enough.",
             &hca::EarlyWarningStatus::held);
  out.Family(Name("hca_info"),
             "Where each present HCA sits: NUMA node, PCIe root and switch, link layer of its "
             "first port, and the plugin's mode; vf \"true\" and pf its PF's address for an "
             "SR-IOV virtual function. Always 1.",
             Exposition::Type::kInfo);
  if (node.topology) {
    for (const topology::Hca& h : node.topology->hcas()) {
      const std::string numa = NumaLabel(h.place.numa);
      out.Sample({{"hca", h.name},
                  {"pci", h.place.pci},
                  {"numa_node", numa},
                  {"pcie_root", h.place.pcie_root},
                  {"pcie_switch", h.place.Switch()},
                  {"link_layer", h.ports.empty() ? "" : h.ports.front().link_layer},
                  {"mode", hca::ModeName(node.mode)},
                  {"vf", h.IsVirtualFunction() ? "true" : "false"},
                  {"pf", h.physfn}},
                 1);
    }
  }
  out.Family(Name("port_active"),
             "1 when the port is ACTIVE, per port of each present HCA; an HCA is usable while at "
             "least one of its ports is, and containers are pointed at those ports.",
             Exposition::Type::kGauge);
  if (node.topology) {
    for (const topology::Hca& h : node.topology->hcas()) {
      for (const topology::Port& port : h.ports) {
        out.Sample({{"hca", h.name}, {"pci", h.place.pci}, {"port", std::to_string(port.number)}},
                   port.Active() ? 1 : 0);
      }
    }
  }
  out.Family(Name("pod_resources_known"),
             "1 once the kubelet's pod list has been read; until then no allocation is shown.",
             Exposition::Type::kGauge);
  out.Sample({}, node.pods_known ? 1 : 0);
  WriteAllocations(node, out);
  WritePortCounters(node, env, counters, out);
  const topology::GpuDirectState gpudirect = topology::ReadGpuDirect(env);
  out.Family(Name("gpudirect_rdma"),
             "1 when GPUDirect RDMA (an HCA reading and writing GPU memory directly) can work on "
             "the node by the mechanism: nvidia-peermem loaded (and registered where the RDMA "
             "core has memory peers), or dma-buf (the open NVIDIA kernel module on kernel 5.12 "
             "or later).",
             Exposition::Type::kGauge);
  out.Sample({{"mechanism", topology::kPeermemMechanism}}, gpudirect.peermem.available ? 1 : 0);
  out.Sample({{"mechanism", topology::kDmaBufMechanism}}, gpudirect.dmabuf.available ? 1 : 0);
}

}  // namespace rdp::metrics
