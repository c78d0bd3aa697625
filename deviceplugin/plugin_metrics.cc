#include "deviceplugin/plugin_metrics.h"

#include <algorithm>

namespace rdp::deviceplugin {
namespace {

using metrics::Name;

// 50 us is an empty RPC on a unix socket; a GetPreferredAllocation that waits for the pod list
// takes up to its deadline (100 ms by default).
constexpr double kRpcBounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                 0.01,    0.025,  0.05,    0.1,    0.25,  1};

constexpr const char* kCodeNames[] = {
    "OK",        "CANCELLED",          "UNKNOWN",       "INVALID_ARGUMENT",  "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS",     "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",  "UNIMPLEMENTED",     "INTERNAL",
    "UNAVAILABLE", "DATA_LOSS",        "UNAUTHENTICATED"};

constexpr const char* kAlignmentNames[] = {"PIX", "PXB", "PHB", "NODE", "SYS", "unknown"};

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
    : rpc_latency_{metrics::Histogram(kRpcBounds, std::size(kRpcBounds)),
                   metrics::Histogram(kRpcBounds, std::size(kRpcBounds)),
                   metrics::Histogram(kRpcBounds, std::size(kRpcBounds)),
                   metrics::Histogram(kRpcBounds, std::size(kRpcBounds))} {}

void PluginMetrics::ObserveRpc(Rpc rpc, absl::Duration latency, int code) {
  const int i = static_cast<int>(rpc);
  rpc_latency_[i].Observe(latency);
  if (code > 0 && code < kCodes) rpc_errors_[i][code].Add();
}

void PluginMetrics::CountAllocation(std::optional<topology::PathClass> alignment) {
  alignment_[alignment ? static_cast<int>(*alignment) : 5].Add();
}

void WritePluginMetrics(
    const std::vector<std::pair<std::string, const PluginMetrics*>>& by_resource,
    metrics::Exposition& out) {
  out.Family(Name("rpc_duration_seconds"),
             "Latency of the kubelet's unary RPCs, by resource and method.",
             metrics::Exposition::Type::kHistogram);
  for (const auto& [resource, m] : by_resource) {
    for (int i = 0; i < kRpcCount; ++i) {
      out.HistogramSamples({{"resource", resource}, {"method", RpcName(static_cast<Rpc>(i))}},
                           m->rpc_latency_[i].Read());
    }
  }
  out.Family(Name("rpc_errors_total"),
             "Kubelet RPCs that ended with an error, by resource, method and gRPC status code.",
             metrics::Exposition::Type::kCounter);
  for (const auto& [resource, m] : by_resource) {
    for (int i = 0; i < kRpcCount; ++i) {
      for (int code = 1; code < PluginMetrics::kCodes; ++code) {
        // Every series from the start, zeros included: rate() and increase() see the first
        // error of a series that already exists.
        out.Sample({{"resource", resource},
                    {"method", RpcName(static_cast<Rpc>(i))},
                    {"code", kCodeNames[code]}},
                   static_cast<double>(m->rpc_errors_[i][code].value()));
      }
    }
  }
  out.Family(Name("allocation_alignment_total"),
             "Exclusive-mode container allocations by resource and the PCIe path class between "
             "their HCAs and the container's GPUs (the worst HCA's path to its nearest GPU); "
             "unknown when the GPU context was not known.",
             metrics::Exposition::Type::kCounter);
  for (const auto& [resource, m] : by_resource) {
    for (int i = 0; i < 6; ++i) {
      out.Sample({{"resource", resource}, {"path_class", kAlignmentNames[i]}},
                 static_cast<double>(m->alignment_[i].value()));
    }
  }
  out.Family(Name("registrations_total"), "Successful registrations with the kubelet, by resource.",
             metrics::Exposition::Type::kCounter);
  for (const auto& [resource, m] : by_resource) {
    out.Sample({{"resource", resource}}, static_cast<double>(m->registrations.value()));
  }
  out.Family(Name("kubelet_restarts_total"),
             "Kubelet restarts detected (our socket removed or kubelet.sock re-created), by the "
             "resource whose server detected them.",
             metrics::Exposition::Type::kCounter);
  for (const auto& [resource, m] : by_resource) {
    out.Sample({{"resource", resource}}, static_cast<double>(m->kubelet_restarts.value()));
  }
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

}  // namespace rdp::deviceplugin
