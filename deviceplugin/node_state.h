#pragma once

// NodeState: the node as the plugin knows it, independent of gRPC: the current topology
// snapshot, the health of every HCA advertised (vanished ones until forgotten), the kubelet's pod
// list, and the device list that ListAndWatch streams. Nothing here runs by itself: PluginServer's
// threads drive the health poll (Poll) and the pod-resources refresh (RefreshPods), the RPCs the
// rest.
// Thread-safe: state is under one mutex; discovery, file reads and kubelet calls run outside it.
//
// Fail closed: while a pod-resources source is configured and the kubelet's pod list is not
// known yet, every HCA is withheld (listed Unhealthy, refused by Allocate), because a container
// may still hold the other mode's IDs; an admission refused is better than an HCA shared by
// mistake.

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/allocator.h"
#include "base/env.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plugin_metrics.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/resource_model.h"
#include "hca/early_warning.h"
#include "hca/hca.h"
#include "metrics/metrics.h"
#include "metrics/node_metrics.h"
#include "serving/single_flight.h"
#include "topology/topology.h"

namespace rdp::deviceplugin {

// Where the plugin's knowledge of the node comes from. Tests replace any of these.
struct NodeSources {
  // Every read of the node outside discovery (device nodes at Allocate, /proc/driver/nvidia);
  // null: the filesystem under the config's roots.
  std::shared_ptr<Env> env;
  // Full discovery (sysfs + hwloc); called at Init and when a scan shows the HCAs changed.
  std::function<absl::StatusOr<topology::TopologyPtr>()> discover;
  // A cheap scan of the HCAs (sysfs only) for the periodic health poll. Unset: use discover.
  std::function<absl::StatusOr<std::vector<topology::Hca>>()> scan;
  // The kubelet's pod-resources API; null turns withholding and the GPU context off.
  std::unique_ptr<PodResourcesSource> pod_resources;
  std::function<absl::Time()> now = [] { return absl::Now(); };
  // poll(2) as PluginServer's background threads call it; tests inject failures.
  std::function<int(struct pollfd*, nfds_t, int)> poll = ::poll;
};

// The filesystem under the config's roots (one Env for discovery, the health scan and the rest),
// discovery from config (one topology::Discoverer: an XML is read once) and a gRPC pod-resources
// client when config.pod_resources_socket is set (it dials lazily: the socket may appear later).
NodeSources DefaultSources(const Config& config);

class NodeState {
 public:
  NodeState(Config config, NodeSources sources);
  ~NodeState();  // waits for a pod-resources List in flight (each has a deadline)
  NodeState(const NodeState&) = delete;
  NodeState& operator=(const NodeState&) = delete;

  // Discovers the node, logs the mode lines, computes the first device list. Errors when
  // discovery fails.
  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);

  // One health poll: scan the HCAs, re-discover when the set changed (hotplug), re-read the GPU
  // IDs, forget HCAs absent for config.forget_after_polls polls that no container holds,
  // recompute the device list. Returns true when the list changed (listeners have run).
  bool Poll() ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);

  // Refreshes the kubelet's pod list: `then` runs once a List that started after this call has
  // finished, successfully or not (on the thread that finished it, or on this one). At most one
  // List is in flight; the callers that ask meanwhile share the next one. Without a
  // pod-resources source, `then` runs at once.
  void RefreshPods(std::function<void()> then) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  // RefreshPods and wait for it, at most `at_most` (and never much past the List's deadline):
  // the List goes on after a wait that gave up. True when that List finished and succeeded
  // (always, without a pod-resources source).
  bool RefreshPodsAndWait(absl::Duration at_most = absl::InfiniteDuration())
      ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  // Shutdown: the List in flight fails at once, and so does every later one.
  void StopPodLists();
  // The latest List that ended failed. Not before the first one ends: an Allocate then waits for
  // it (within its deadline) rather than refusing every HCA as not known yet. False without a
  // pod-resources source.
  bool pod_list_failing() const {
    return sources_.pod_resources && last_list_ == ListEnd::kFailed;
  }
  bool pods_known() const ABSL_LOCKS_EXCLUDED(mu_);
  bool has_pod_resources() const { return sources_.pod_resources != nullptr; }
  // The latest List succeeded and began after the latest registration with the kubelet had
  // returned, and no registration is under way. The kubelet keeps one endpoint per resource: once
  // we are registered, every container that gets rdma/hca is admitted through us, so such a list
  // already shows every container another plugin (the other mode's, before a relabel) admitted.
  // Allocate reads a new List only when this is false: one List per admission, not two, against
  // the kubelet's pod-resources budget. The kubelet may call Allocate before its answer to our
  // Register reaches us, so a registration counts from the moment it is sent.
  bool list_since_registration() const {
    const std::uint64_t epoch = registration_epoch_;
    return has_pod_resources() && last_list_ == ListEnd::kOk && epoch % 2 == 0 &&
           last_list_epoch_ == epoch;
  }
  // The lifecycle thread calls these around each Register RPC, whatever its outcome.
  void RegistrationBegins() { ++registration_epoch_; }
  void RegistrationEnded() { ++registration_epoch_; }

  struct DeviceList {
    std::uint64_t version = 0;
    std::vector<DeviceState> devices;
  };
  DeviceList Devices() const ABSL_LOCKS_EXCLUDED(mu_);
  // `listener` runs after every change of the device list, on the thread that made the change,
  // outside the plugin's state lock (mu_) but inside listeners_mu_: it may call any method
  // here but AddListener and RemoveListener, and the locks it takes come after listeners_mu_
  // (the lock order). RemoveListener returns once no call of that listener is running.
  int AddListener(std::function<void()> listener) ABSL_LOCKS_EXCLUDED(listeners_mu_);
  void RemoveListener(int id) ABSL_LOCKS_EXCLUDED(listeners_mu_);
  // Called when an RPC finds the node changed since the last scan (a device node gone): the
  // owner of the health poll runs one soon.
  void SetRescanRequest(std::function<void()> request) ABSL_LOCKS_EXCLUDED(mu_);

  // What Allocate gives one container.
  struct Grant {
    // Its devices, envs and, with --allocation-dir, its allocation file.
    hca::ContainerAllocation allocation;
    // The host file mounted read-only at hca::kAllocationFile; "" for none (no --allocation-dir,
    // or the file could not be written).
    std::string file_mount;
  };
  // One container's allocation. InvalidArgument naming the ID when the request is empty, has a
  // duplicate (in any spelling) or an unknown ID. FailedPrecondition naming the HCA and why
  // when an HCA asked for (exclusive) or every HCA (shared) is withheld or unusable now; each
  // HCA's device nodes are checked at the call, so that no DeviceSpec names a missing node.
  absl::StatusOr<Grant> Allocate(const std::vector<std::string>& ids) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // GetPreferredAllocation for one container, on views of the request's own IDs: the
  // allocator's one path per mode (allocator::ExclusiveAllocator::Answer, with the GPU context of
  // the pod list as last refreshed and the HCAs the early-warning rule finds degraded taken only
  // to complete the answer; allocator::AnswerShared below config.shared_devices). The caller
  // refreshes the pod list first (RefreshPods). InvalidArgument only for a malformed request:
  // IDs not offered now are left to the kubelet, must_include is kept as given.
  absl::StatusOr<std::vector<std::string>> Prefer(const std::vector<std::string_view>& available,
                                                  const std::vector<std::string_view>& must_include,
                                                  int size) const ABSL_LOCKS_EXCLUDED(mu_);

  const Config& config() const { return config_; }
  topology::TopologyPtr topology() const ABSL_LOCKS_EXCLUDED(mu_);

  // The plugin's instruments (thread-safe): the RPC handlers and PluginServer's threads update
  // them, and so does this class (discovery, pod-resources errors, each allocation's alignment).
  PluginMetrics& metrics() const { return metrics_; }
  // One scrape: the instruments, then the node's state as of now (a copy taken under the lock,
  // then the port counters read from sysfs outside it). Thread-safe.
  void WriteMetrics(metrics::Exposition& out) const ABSL_LOCKS_EXCLUDED(mu_);
  metrics::NodeMetricsInput MetricsInput() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void StartList(std::function<void()> finished) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  void OnPods(absl::StatusOr<PodList> pods) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  // Swaps in a new snapshot and its allocator.
  void SwapSnapshot(topology::TopologyPtr snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recomputes devices_ from advertised_, the snapshot and the pods; bumps version_ and logs
  // withholding decisions when different. True when the list or the withheld set changed.
  bool Recompute() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the listeners.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  void RequestRescan() const ABSL_LOCKS_EXCLUDED(mu_);
  // sources_.discover(), timed into metrics_.discovery.
  absl::StatusOr<topology::TopologyPtr> Discover() ABSL_LOCKS_EXCLUDED(mu_);
  // Counts one exclusive allocation of `pcis` by its alignment with the GPUs of the container
  // being admitted, as the last pod list shows it.
  // Counts the allocation's alignment; returns the GPUs of the container being admitted (empty
  // when unknown).
  std::vector<std::string> CountAlignment(const std::vector<std::string>& pcis) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // With --allocation-dir: writes allocation.file there (unless a file of that content is there
  // already) and gives the path to mount at hca::kAllocationFile; a failure is logged and the
  // container gets no file ("").
  std::string AllocationFileMount(const hca::ContainerAllocation& allocation) const;

  const Config config_;
  NodeSources sources_;
  std::atomic<bool> scan_failing_{false};  // the failure was logged; log again after a success
  // How the latest pod-resources List ended: none has yet, it succeeded, it failed.
  enum class ListEnd : char { kNone, kOk, kFailed };
  std::atomic<ListEnd> last_list_{ListEnd::kNone};
  // Odd while a Register RPC is under way: incremented as each begins and as it ends.
  std::atomic<std::uint64_t> registration_epoch_{0};
  // registration_epoch_ when the latest successful List began.
  std::atomic<std::uint64_t> last_list_epoch_{0};
  mutable PluginMetrics metrics_;
  mutable metrics::PortCounterCache port_counters_;  // scrapes' reads of sysfs counters
  // Early-warning health: the health poll updates it; Prefer and scrapes read it.
  hca::EarlyWarningMonitor early_warning_;

  // Lock order: listeners_mu_ (held while listeners run), then mu_.
  mutable absl::Mutex listeners_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<int, std::function<void()>> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  int next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 0;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(listeners_mu_);
  topology::TopologyPtr snapshot_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const allocator::ExclusiveAllocator> allocator_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, hca::AdvertisedHca> advertised_ ABSL_GUARDED_BY(mu_);  // by PCI address
  PodList pods_ ABSL_GUARDED_BY(mu_);
  bool pods_known_ ABSL_GUARDED_BY(mu_) = false;
  bool pods_failing_ ABSL_GUARDED_BY(mu_) = false;  // the failure was logged
  absl::Time failure_logged_ ABSL_GUARDED_BY(mu_);  // when; logged again a minute on
  std::map<std::string, absl::Time> gpu_first_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> gpu_ids_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> withheld_ ABSL_GUARDED_BY(mu_);  // PCI -> why
  bool withholding_pending_ ABSL_GUARDED_BY(mu_) = false;  // withheld_ is "pods not known yet"
  std::vector<DeviceState> devices_ ABSL_GUARDED_BY(mu_);
  std::uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;

  std::function<void()> rescan_request_ ABSL_GUARDED_BY(mu_);

  // Last: destroyed first, so that a List in flight finishes while the rest is still alive.
  serving::SingleFlight pod_refresh_;
};

}  // namespace rdp::deviceplugin
