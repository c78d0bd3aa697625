#include "dra/node_snapshot.h"

#include <utility>

#include "base/log.h"
#include "hca/scan_change.h"

namespace rdp::dra {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

}  // namespace

NodeSnapshot::NodeSnapshot(Discover discover, absl::Duration rediscover_interval)
    : discover_(std::move(discover)), rediscover_interval_(rediscover_interval) {}

absl::Status NodeSnapshot::Init() {
  absl::StatusOr<topology::TopologyPtr> t = discover_();
  if (!t.ok()) return t.status();
  absl::MutexLock lock(&mu_);
  current_ = *t;
  return absl::OkStatus();
}

topology::TopologyPtr NodeSnapshot::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

bool NodeSnapshot::Apply(const std::vector<topology::Hca>& scanned) {
  {
    absl::MutexLock lock(&mu_);
    switch (hca::CompareScan(current_->hcas(), scanned)) {
      case hca::ScanChange::kNone:
        return false;
      case hca::ScanChange::kState:
        // A port going DOWN or ACTIVE, a device node: patched in, under the lock (a Prepare's
        // Rediscover may replace the snapshot meanwhile). Before (issue 25), every flap ran a
        // discovery of the whole node.
        current_ = hca::WithScannedState(*current_, scanned);
        return true;
      case hca::ScanChange::kFunctions:
        break;
    }
  }
  // A hotplug: only a discovery places the new PCI functions (outside the lock: it takes
  // hwloc's time, and Current() must not wait for it).
  absl::StatusOr<topology::TopologyPtr> t = discover_();
  absl::MutexLock lock(&mu_);
  last_try_ = absl::Now();
  if (!t.ok()) {
    Log()->warn("discovering the node again failed: {}", t.status().ToString());
    return false;
  }
  current_ = *t;
  return true;
}

topology::TopologyPtr NodeSnapshot::Rediscover() {
  absl::MutexLock lock(&mu_);
  if (absl::Now() - last_try_ < rediscover_interval_) return nullptr;
  last_try_ = absl::Now();
  absl::StatusOr<topology::TopologyPtr> t = discover_();
  if (!t.ok()) {
    Log()->warn("discovering the node again failed: {}", t.status().ToString());
    return nullptr;
  }
  current_ = *t;
  return current_;
}

}  // namespace rdp::dra
