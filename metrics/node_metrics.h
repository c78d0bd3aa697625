#pragma once

// The node's families, which both front doors export (every name and label here is a contract,
// listed in docs/metrics.md): the node's state, written at scrape time from a snapshot the door
// takes under its own lock (NodeMetricsInput), plus the port counters read from sysfs then,
// outside any lock, so that a scrape never holds up a kubelet RPC.

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/env.h"
#include "hca/hca.h"
#include "metrics/metrics.h"
#include "topology/topology.h"

namespace rdp::metrics {

// What a scrape needs of a front door's state, copied under its lock.
struct NodeMetricsInput {
  hca::Mode mode = hca::Mode::kShared;
  topology::TopologyPtr topology;        // the current snapshot (present HCAs, placement)
  std::vector<hca::AdvertisedHca> hcas;  // every HCA advertised, vanished ones included
  std::set<std::string> withheld;        // PCI addresses
  bool pods_known = false;
  // Containers ("<namespace>/<pod>/<container>") holding IDs of our resource, with those IDs
  // (the device plugin knows them from pod-resources; DRA knows claims, not pods: none).
  std::vector<std::pair<std::string, std::vector<std::string>>> holders;
};

// Writes the node's families: health, withholding, info, allocation (hca_allocated for PCI
// IDs, shared_allocated for shared units: see docs/metrics.md), the port counters of every
// present HCA, read now through `env` (sysfs ports/<n>/counters/, 4 KiB at most per file; a
// counter the driver does not provide has no series), and GPUDirect RDMA's state, read now too
// (topology::ReadGpuDirect: a module loaded after the start shows at the next scrape).
void WriteNodeMetrics(const NodeMetricsInput& node, Env& env, Exposition& out);

}  // namespace rdp::metrics
