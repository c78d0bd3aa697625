#pragma once

// What the plugin exports to Prometheus (every name and label here is a contract, listed in
// docs/metrics.md): the instruments its threads and RPC handlers update (PluginMetrics), and the
// node's state written at scrape time from a snapshot NodeState takes under its lock
// (NodeMetricsInput) plus the port counters read from sysfs then, outside any lock, so that a
// scrape never holds up a kubelet RPC.

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "base/env.h"
#include "server/config.h"
#include "server/devices.h"
#include "server/metrics.h"
#include "topology/topology.h"

namespace rdp::server {

// The unary kubelet RPCs whose latency is measured (ListAndWatch is a stream: no latency).
enum class Rpc : int {
  kGetDevicePluginOptions = 0,
  kGetPreferredAllocation,
  kAllocate,
  kPreStartContainer,
};
inline constexpr int kRpcCount = 4;
const char* RpcName(Rpc rpc);

// The instruments. Thread-safe; every update is lock-free and allocation-free.
class PluginMetrics {
 public:
  PluginMetrics();

  // One finished RPC: its latency, and its status code when not OK (grpc::StatusCode's value).
  void ObserveRpc(Rpc rpc, absl::Duration latency, int code);
  // One exclusive-mode allocation (a container of an Allocate call) and the path class between
  // its HCAs and the container's GPUs (AllocationAlignment); nullopt: unknown (no GPU context).
  void CountAllocation(std::optional<topology::PathClass> alignment);

  Counter registrations;         // successful Register calls to the kubelet
  Counter kubelet_restarts;      // kubelet restarts the lifecycle thread detected
  Counter pod_resources_errors;  // pod-resources List calls that failed
  Counter rediscoveries;         // full discoveries after the first (hotplug)
  Histogram discovery;           // every full discovery's duration, the first included

  // Writes the families above (all series, zeros included, so that rate() sees them start).
  void Write(Exposition& out) const;

 private:
  static constexpr int kCodes = 17;  // grpc::StatusCode OK..UNAUTHENTICATED
  std::array<Histogram, kRpcCount> rpc_latency_;
  std::array<std::array<Counter, kCodes>, kRpcCount> rpc_errors_;
  std::array<Counter, 6> alignment_;  // PIX, PXB, PHB, NODE, SYS, unknown
};

// The allocation's alignment with the container's GPUs: for each HCA, the class of the path to
// its nearest GPU of `gpus`; the worst of those (an allocation is PIX only when every HCA shares
// a switch with one of the GPUs). nullopt when no GPU of `gpus` (PCI addresses) and no HCA of
// `hcas` is in the topology.
std::optional<topology::PathClass> AllocationAlignment(const topology::Topology& topology,
                                                       const std::vector<std::string>& hcas,
                                                       const std::vector<std::string>& gpus);

// What a scrape needs of NodeState, copied under its lock (NodeState::MetricsInput).
struct NodeMetricsInput {
  Mode mode = Mode::kShared;
  topology::TopologyPtr topology;        // the current snapshot (present HCAs, placement)
  std::vector<HcaHealth> hcas;           // every HCA advertised, vanished ones included
  std::set<std::string> withheld;        // PCI addresses
  bool pods_known = false;
  // Containers ("<namespace>/<pod>/<container>") holding IDs of our resource, with those IDs.
  std::vector<std::pair<std::string, std::vector<std::string>>> holders;
};

// Writes the node's families: health, withholding, info, allocation (hca_allocated for PCI
// IDs, shared_allocated for shared units: see docs/metrics.md) and the port counters of every
// present HCA, read now through `env` (sysfs ports/<n>/counters/, 4 KiB at most per file; a
// counter the driver does not provide has no series).
void WriteNodeMetrics(const NodeMetricsInput& node, Env& env, Exposition& out);

}  // namespace rdp::server
