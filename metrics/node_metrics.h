#pragma once

// The node's families, which both front doors export (every name and label here is a contract,
// listed in docs/metrics.md): the node's state, written at scrape time from a snapshot the door
// takes under its own lock (NodeMetricsInput), plus the port counters read from sysfs then,
// outside any lock, so that a scrape never holds up a kubelet RPC.

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "base/env.h"
#include "hca/early_warning.h"
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
  hca::FlaggedHcas early_warning;        // degraded or flapping HCAs (hca/early_warning.h)
  bool pods_known = false;
  // Containers ("<namespace>/<pod>/<container>") holding IDs of one of our resources, with the
  // resource and those IDs, one entry per container and resource (the device plugin knows them
  // from pod-resources; DRA knows claims, not pods: none).
  struct Holder {
    std::string container;
    std::string resource;
    std::vector<std::string> ids;
  };
  std::vector<Holder> holders;
};

// The port counters of the node's HCAs as scrapes read them (sysfs ports/<n>/counters/, 4 KiB
// at most a file, through an Env). An HCA's files are read at most once per `max_age`: on mlx5
// each file is a firmware query, and a scraper polling back to back must not make one a
// request. A scrape stops reading once its `budget` is spent: an HCA it did not reach is written
// from its last read (no series before its first), and the next scrape begins with the HCAs
// read longest ago. Thread-safe: two scrapes at once read an HCA once; only scrapes use it.
class PortCounterCache {
 public:
  struct Options {
    absl::Duration max_age = absl::Seconds(1);
    absl::Duration budget = absl::Milliseconds(500);
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };
  static constexpr std::size_t kCounters = 7;  // the counter files of each port
  // Per port number, the scaled value of each counter file (nullopt: not provided or unreadable).
  using PortValues = std::vector<std::pair<int, std::array<std::optional<std::uint64_t>, kCounters>>>;

  PortCounterCache() : PortCounterCache(Options()) {}
  explicit PortCounterCache(Options options) : options_(std::move(options)) {}

  // The counters of every HCA of `topology` by name, read as the class comment says; HCAs no
  // longer in it are forgotten.
  std::map<std::string, PortValues> Read(const topology::Topology& topology, Env& env);

 private:
  struct Entry {
    absl::Time read = absl::InfinitePast();
    PortValues ports;
  };
  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, Entry> by_hca_ ABSL_GUARDED_BY(mu_);  // by "<pci> <name>"
};

// Writes the node's families: health, withholding, info, allocation (hca_allocated for PCI
// IDs, shared_allocated for shared units: see docs/metrics.md), the port counters of every
// present HCA, through `counters` (a counter the driver does not provide has no series), and
// GPUDirect RDMA's state, read now through `env` (topology::ReadGpuDirect: a module loaded after
// the start shows at the next scrape).
void WriteNodeMetrics(const NodeMetricsInput& node, Env& env, PortCounterCache& counters,
                      Exposition& out);

}  // namespace rdp::metrics
