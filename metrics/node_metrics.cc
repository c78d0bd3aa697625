#include "server/plugin_metrics.h"

#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rdp::server {
namespace {

constexpr char kPrefix[] = "rdma_device_plugin_";

// 50 us is an empty RPC on a unix socket; a GetPreferredAllocation that waits for the pod list
// takes up to its deadline (100 ms by default).
constexpr double kRpcBounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                 0.01,    0.025,  0.05,    0.1,    0.25,  1};
// Discovery: sysfs alone takes milliseconds, hwloc's PCI tree tens to hundreds.
constexpr double kDiscoveryBounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                       0.25,  0.5,   1,    2.5,   5,    10};

constexpr const char* kCodeNames[] = {
    "OK",        "CANCELLED",          "UNKNOWN",       "INVALID_ARGUMENT",  "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS",     "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",  "UNIMPLEMENTED",     "INTERNAL",
    "UNAVAILABLE", "DATA_LOSS",        "UNAUTHENTICATED"};

constexpr const char* kAlignmentNames[] = {"PIX", "PXB", "PHB", "NODE", "SYS", "unknown"};

std::string Name(std::string_view suffix) { return kPrefix + std::string(suffix); }

void WriteCounter(Exposition& out, std::string_view name, std::string_view help,
                  const Counter& c) {
  out.Family(Name(name), help, Exposition::Type::kCounter);
  out.Sample({}, static_cast<double>(c.value()));
}

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

void WritePortCounters(const NodeMetricsInput& node, Env& env, Exposition& out) {
  if (!node.topology) return;
  // Read every file once, then write family by family (the format groups a family's samples).
  struct Read {
    const topology::Hca* hca;
    std::string port;
    std::array<std::optional<std::uint64_t>, std::size(kPortCounters)> values;
  };
  std::vector<Read> reads;
  for (const topology::Hca& hca : node.topology->hcas()) {
    for (const topology::Port& port : hca.ports) {
      Read r{&hca, std::to_string(port.number), {}};
      const std::string dir = absl::StrCat("/sys/class/infiniband/", hca.name, "/ports/",
                                           port.number, "/counters/");
      for (std::size_t i = 0; i < std::size(kPortCounters); ++i) {
        std::optional<std::string> text = ReadAttribute(env, dir + kPortCounters[i].file);
        std::uint64_t v = 0;
        if (text && absl::SimpleAtoi(*text, &v)) r.values[i] = v * kPortCounters[i].scale;
      }
      reads.push_back(std::move(r));
    }
  }
  for (std::size_t i = 0; i < std::size(kPortCounters); ++i) {
    bool opened = false;
    for (const Read& r : reads) {
      if (!r.values[i]) continue;
      if (!opened) {
        out.Family(Name(kPortCounters[i].metric), kPortCounters[i].help,
                   Exposition::Type::kCounter);
        opened = true;
      }
      out.Sample({{"hca", r.hca->name}, {"port", r.port}}, static_cast<double>(*r.values[i]));
    }
  }
}

void WriteAllocations(const NodeMetricsInput& node, Exposition& out) {
  std::map<std::string, std::string> names;  // PCI -> HCA name
  for (const HcaHealth& h : node.hcas) names[h.pci] = h.name;
  struct Held {
    std::array<std::string, 3> who;
    std::string pci;
  };
  std::vector<Held> exclusive;
  std::vector<std::pair<std::array<std::string, 3>, int>> shared;
  for (const auto& [key, ids] : node.holders) {
    int units = 0;
    for (const std::string& id : ids) {
      if (std::optional<std::string> pci = topology::NormalizePci(id)) {
        if (names.count(*pci)) exclusive.push_back({SplitKey(key), *pci});
      } else {
        ++units;
      }
    }
    if (units > 0) shared.emplace_back(SplitKey(key), units);
  }
  out.Family(Name("hca_allocated"),
             "1 for each container that holds the HCA as an exclusive device (pod-resources).",
             Exposition::Type::kGauge);
  for (const Held& h : exclusive) {
    out.Sample({{"hca", names[h.pci]},
                {"pci", h.pci},
                {"namespace", h.who[0]},
                {"pod", h.who[1]},
                {"container", h.who[2]}},
               1);
  }
  out.Family(Name("shared_allocated"),
             "Shared-mode units each container holds; such a container sees every HCA "
             "(pod-resources).",
             Exposition::Type::kGauge);
  for (const auto& [who, units] : shared) {
    out.Sample({{"namespace", who[0]}, {"pod", who[1]}, {"container", who[2]}}, units);
  }
}

}  // namespace

const char* RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kGetDevicePluginOptions: return "GetDevicePluginOptions";
    case Rpc::kGetPreferredAllocation: return "GetPreferredAllocation";
    case Rpc::kAllocate: return "Allocate";
    case Rpc::kPreStartContainer: return "PreStartContainer";
  }
  return "unknown";
}

PluginMetrics::PluginMetrics()
    : discovery(kDiscoveryBounds, std::size(kDiscoveryBounds)),
      rpc_latency_{Histogram(kRpcBounds, std::size(kRpcBounds)),
                   Histogram(kRpcBounds, std::size(kRpcBounds)),
                   Histogram(kRpcBounds, std::size(kRpcBounds)),
                   Histogram(kRpcBounds, std::size(kRpcBounds))} {}

void PluginMetrics::ObserveRpc(Rpc rpc, absl::Duration latency, int code) {
  const int i = static_cast<int>(rpc);
  rpc_latency_[i].Observe(latency);
  if (code > 0 && code < kCodes) rpc_errors_[i][code].Add();
}

void PluginMetrics::CountAllocation(std::optional<topology::PathClass> alignment) {
  alignment_[alignment ? static_cast<int>(*alignment) : 5].Add();
}

void PluginMetrics::Write(Exposition& out) const {
  out.Family(Name("rpc_duration_seconds"), "Latency of the kubelet's unary RPCs, by method.",
             Exposition::Type::kHistogram);
  for (int i = 0; i < kRpcCount; ++i) {
    out.Histogram({{"method", RpcName(static_cast<Rpc>(i))}}, rpc_latency_[i].Read());
  }
  out.Family(Name("rpc_errors_total"),
             "Kubelet RPCs that ended with an error, by method and gRPC status code.",
             Exposition::Type::kCounter);
  for (int i = 0; i < kRpcCount; ++i) {
    for (int code = 1; code < kCodes; ++code) {
      const std::uint64_t n = rpc_errors_[i][code].value();
      if (n > 0) {
        out.Sample({{"method", RpcName(static_cast<Rpc>(i))}, {"code", kCodeNames[code]}},
                   static_cast<double>(n));
      }
    }
  }
  out.Family(Name("allocation_alignment_total"),
             "Exclusive-mode container allocations by the PCIe path class between their HCAs "
             "and the container's GPUs (the worst HCA's path to its nearest GPU); unknown when "
             "the GPU context was not known.",
             Exposition::Type::kCounter);
  for (int i = 0; i < 6; ++i) {
    out.Sample({{"path_class", kAlignmentNames[i]}}, static_cast<double>(alignment_[i].value()));
  }
  WriteCounter(out, "registrations_total", "Successful registrations with the kubelet.",
               registrations);
  WriteCounter(out, "kubelet_restarts_total",
               "Kubelet restarts detected (our socket removed or kubelet.sock re-created).",
               kubelet_restarts);
  WriteCounter(out, "pod_resources_errors_total",
               "Calls to the kubelet's pod-resources List that failed.", pod_resources_errors);
  WriteCounter(out, "rediscoveries_total",
               "Full discoveries of the node after the first one: the health scan found the HCAs, "
               "their device nodes or their port states changed (hotplug, a link going down).",
               rediscoveries);
  out.Family(Name("discovery_duration_seconds"),
             "Duration of each full discovery of the node (sysfs and the PCI tree).",
             Exposition::Type::kHistogram);
  out.Histogram({}, discovery.Read());
}

std::optional<topology::PathClass> AllocationAlignment(const topology::Topology& topology,
                                                       const std::vector<std::string>& hcas,
                                                       const std::vector<std::string>& gpus) {
  std::vector<int> g;
  for (const std::string& pci : gpus) {
    if (const int i = topology.GpuIndex(pci); i >= 0) g.push_back(i);
  }
  if (g.empty()) return std::nullopt;
  std::optional<topology::PathClass> worst;
  for (const std::string& pci : hcas) {
    const int h = topology.HcaIndex(pci);
    if (h < 0) continue;
    topology::PathClass best = topology::PathClass::kSYS;
    for (int i : g) best = std::min(best, topology.Path(h, i));
    worst = worst ? std::max(*worst, best) : best;
  }
  return worst;
}

void WriteNodeMetrics(const NodeMetricsInput& node, Env& env, Exposition& out) {
  out.Family(Name("hca_healthy"),
             "1 when the HCA is present, every port is ACTIVE and its device nodes exist; 0 "
             "otherwise (a vanished HCA stays listed until forgotten).",
             Exposition::Type::kGauge);
  for (const HcaHealth& h : node.hcas) {
    out.Sample({{"hca", h.name}, {"pci", h.pci}}, h.present && h.healthy ? 1 : 0);
  }
  out.Family(Name("hca_withheld"),
             "1 when the HCA is not offered because containers may still hold it under the "
             "other mode, or the kubelet's pod list is not known yet.",
             Exposition::Type::kGauge);
  for (const HcaHealth& h : node.hcas) {
    out.Sample({{"hca", h.name}, {"pci", h.pci}}, node.withheld.count(h.pci) ? 1 : 0);
  }
  out.Family(Name("hca_info"),
             "Where each present HCA sits: NUMA node, PCIe root and switch, link layer of its "
             "first port, and the plugin's mode. Always 1.",
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
                  {"mode", ModeName(node.mode)}},
                 1);
    }
  }
  out.Family(Name("pod_resources_known"),
             "1 once the kubelet's pod list has been read; until then no allocation is shown.",
             Exposition::Type::kGauge);
  out.Sample({}, node.pods_known ? 1 : 0);
  WriteAllocations(node, out);
  WritePortCounters(node, env, out);
}

}  // namespace rdp::server
