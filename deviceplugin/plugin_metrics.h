#pragma once

// What the device plugin exports to Prometheus beside the node's families (metrics/node_metrics.h;
// every name and label is a contract listed in docs/metrics.md): the instruments each resource's
// server and RPC handlers update, written labelled `resource`.

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "metrics/metrics.h"
#include "topology/topology.h"

namespace rdp::deviceplugin {

// The unary kubelet RPCs whose latency is measured (ListAndWatch is a stream: no latency).
enum class Rpc : int {
  kGetDevicePluginOptions = 0,
  kGetPreferredAllocation,
  kAllocate,
  kPreStartContainer,
};
inline constexpr int kRpcCount = 4;
const char* RpcName(Rpc rpc);

// One resource's instruments. Thread-safe; every update is lock-free and allocation-free.
class PluginMetrics {
 public:
  PluginMetrics();

  // One finished RPC: its latency, and its status code when not OK (grpc::StatusCode's value).
  void ObserveRpc(Rpc rpc, absl::Duration latency, int code);
  // One exclusive-mode allocation (a container of an Allocate call) and the path class between
  // its HCAs and the container's GPUs (AllocationAlignment); nullopt: unknown (no GPU context).
  void CountAllocation(std::optional<topology::PathClass> alignment);

  metrics::Counter registrations;         // successful Register calls to the kubelet
  metrics::Counter kubelet_restarts;      // kubelet restarts the resource's server detected

 private:
  friend void WritePluginMetrics(
      const std::vector<std::pair<std::string, const PluginMetrics*>>& by_resource,
      metrics::Exposition& out);
  static constexpr int kCodes = 17;  // grpc::StatusCode OK..UNAUTHENTICATED
  std::array<metrics::Histogram, kRpcCount> rpc_latency_;
  std::array<std::array<metrics::Counter, kCodes>, kRpcCount> rpc_errors_;
  std::array<metrics::Counter, 6> alignment_;  // PIX, PXB, PHB, NODE, SYS, unknown
};

// Writes the families of PluginMetrics, one series set per resource (labelled `resource`, by the
// resource's name), all series zeros included so that rate() sees them start.
void WritePluginMetrics(
    const std::vector<std::pair<std::string, const PluginMetrics*>>& by_resource,
    metrics::Exposition& out);

// The allocation's alignment with the container's GPUs: for each HCA, the class of the path to
// its nearest GPU of `gpus`; the worst of those (an allocation is PIX only when every HCA shares
// a switch with one of the GPUs). nullopt when no GPU of `gpus` (PCI addresses) and no HCA of
// `hcas` is in the topology.
std::optional<topology::PathClass> AllocationAlignment(const topology::Topology& topology,
                                                       const std::vector<std::string>& hcas,
                                                       const std::vector<std::string>& gpus);

}  // namespace rdp::deviceplugin
