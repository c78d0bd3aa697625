#pragma once

// The node as the DRA driver sees it: a topology snapshot from a discovery at start, kept
// current by the health poll's sysfs scans (Apply) and discovered again when a claim names a
// device it lacks (Rediscover: an HCA hot-plugged since). Thread-safe.

#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "topology/topology.h"

namespace rdp::dra {

class NodeSnapshot {
 public:
  // A full discovery of the node (hwloc: placement, GPUs); the seam tests count calls through.
  using Discover = std::function<absl::StatusOr<topology::TopologyPtr>()>;
  // Rediscover runs `discover` at most once per `rediscover_interval`.
  explicit NodeSnapshot(Discover discover,
                        absl::Duration rediscover_interval = absl::Seconds(2));

  // The first discovery; its error when it fails.
  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_);
  topology::TopologyPtr Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // The health poll: takes a sysfs scan of the HCAs (topology::ReadSysfsHcas). The same PCI
  // functions in another state (a flapping link) are patched into the snapshot
  // (hca::WithScannedState); only a change of the set of PCI functions (a hotplug) runs a
  // discovery. True when the snapshot changed (the pool is to be published again); false when
  // the scan matches it, or when the discovery failed (logged; the snapshot stays, the next
  // scan tries again).
  bool Apply(const std::vector<topology::Hca>& scanned) ABSL_LOCKS_EXCLUDED(mu_);
  // A fresh snapshot, or null when the last try was too recent or discovery failed.
  topology::TopologyPtr Rediscover() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Discover discover_;
  const absl::Duration rediscover_interval_;
  mutable absl::Mutex mu_;
  topology::TopologyPtr current_ ABSL_GUARDED_BY(mu_);
  absl::Time last_try_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace rdp::dra
