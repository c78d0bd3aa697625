#pragma once

// The plugin's state and domain logic, independent of gRPC: the current topology snapshot, the
// health of every HCA ever advertised, the pod-resources cache, and the device list that
// ListAndWatch streams. Thread-safe: every method may be called from any thread; state is under
// one mutex and heavy work (discovery, kubelet calls, scoring) runs outside it.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/allocator.h"
#include "server/config.h"
#include "server/devices.h"
#include "server/pod_resources.h"
#include "topology/topology.h"

namespace rdp::server {

// Where the plugin's knowledge of the node comes from. Tests replace any of these.
struct PluginDeps {
  // Full discovery (sysfs + hwloc); called at Init and when a scan shows the HCAs changed.
  std::function<absl::StatusOr<topology::TopologyPtr>()> discover;
  // A cheap scan of the HCAs (sysfs only) for the periodic health poll. Unset: use discover.
  std::function<absl::StatusOr<std::vector<topology::Hca>>()> scan;
  // The kubelet's pod-resources API; null turns the feature off.
  std::unique_ptr<PodResourcesSource> pod_resources;
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

// Discovery from config (topology::Discover / ReadSysfsHcas) and a gRPC pod-resources client
// when the socket exists (else one info line and the feature off).
PluginDeps DefaultDeps(const Config& config);

class Plugin {
 public:
  Plugin(Config config, PluginDeps deps);
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  // Discovers the node, logs the mode lines, computes the first device list. Errors when
  // discovery fails.
  absl::Status Init();

  // One health poll: scan the HCAs, re-discover when the set changed (hotplug), refresh the
  // pod-resources cache, recompute the device list. Wakes watchers and returns true when the
  // list changed.
  bool Poll();

  struct DeviceList {
    std::uint64_t version = 0;
    std::vector<DeviceState> devices;
  };
  DeviceList Devices() const;
  // Blocks until the version differs from `seen`, `deadline` passes or `stop` is set (checked
  // whenever WakeAll() is called); returns the current list.
  DeviceList WaitForChange(std::uint64_t seen, absl::Time deadline,
                           const std::atomic<bool>& stop) const;
  // Wakes every WaitForChange so that it re-checks its stop flag.
  void WakeAll() const;

  // One container's allocation. InvalidArgument naming the ID when the request is empty, has a
  // duplicate or an unknown ID, or names an HCA that is not present.
  absl::StatusOr<ContainerAllocation> Allocate(const std::vector<std::string>& ids) const;

  // GetPreferredAllocation for one container, through the allocator. Refreshes the
  // pod-resources cache first with a deadline of config.pod_resources_timeout (falls back to the
  // cached copy). InvalidArgument for invalid requests.
  absl::StatusOr<std::vector<std::string>> Prefer(const std::vector<std::string>& available,
                                                  const std::vector<std::string>& must_include,
                                                  int size);

  const Config& config() const { return config_; }
  topology::TopologyPtr topology() const;

 private:
  // Refreshes the pod-resources cache; false when unavailable or another refresh is running.
  bool RefreshPods(absl::Duration timeout);
  // Swaps in a new snapshot and its allocator. Caller holds mu_.
  void SwapSnapshot(topology::TopologyPtr snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recomputes devices_ from known_, the snapshot and the pods; bumps version_ and logs
  // withholding changes when different.
  bool Recompute() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  PluginDeps deps_;
  std::atomic<bool> refreshing_pods_{false};
  std::atomic<bool> scan_failing_{false};  // the failure was logged; log again after a success

  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;
  topology::TopologyPtr snapshot_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const allocator::ExclusiveAllocator> allocator_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, HcaHealth> known_ ABSL_GUARDED_BY(mu_);  // by PCI address
  PodList pods_ ABSL_GUARDED_BY(mu_);
  bool pods_known_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, absl::Time> gpu_first_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> gpu_ids_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> withheld_ ABSL_GUARDED_BY(mu_);
  std::vector<DeviceState> devices_ ABSL_GUARDED_BY(mu_);
  std::uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rdp::server
