#pragma once

// NodeState: the device plugin's adapter over the node core (node/node.h), independent of gRPC:
// the kubelet's pod list, the HCAs withheld across a mode switch, the GPU context of an
// admission, and the device list that ListAndWatch streams, computed from the core's view. The
// snapshot, health, HCAs known, device-node check and what a container gets are the core's.
// Nothing here runs by itself: PluginServer's threads drive the health poll (Poll) and the
// pod-resources refresh (RefreshPods), the RPCs the rest.
// Thread-safe: state is under mu_ and the listeners under listeners_mu_; discovery, file reads and
// kubelet calls run outside both.
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
#include "hca/hca.h"
#include "node/node.h"
#include "metrics/metrics.h"
#include "serving/single_flight.h"
#include "topology/topology.h"

namespace rdp::deviceplugin {

// Where the plugin's knowledge of the node comes from. Tests replace any of these.
struct NodeSources {
  // The node core's (node::Sources): every read of the node outside discovery (null: the
  // filesystem under the config's roots), full discovery, the health poll's scan (null: none).
  std::shared_ptr<Env> env;
  std::function<absl::StatusOr<topology::TopologyPtr>()> discover;
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

  // Logs the mode lines, discovers the node (node::Node::Init), reads the GPU IDs and computes
  // the first device list. Errors when discovery fails.
  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);

  // One health poll: the core's (node::Node::Poll, with the HCAs the pod list shows held), the
  // GPU IDs read again, the device list recomputed. Returns true when the list changed
  // (listeners have run).
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
  bool pods_known() const ABSL_LOCKS_EXCLUDED(mu_);
  // The latest List that ended succeeded. A RefreshPods callback reads that List's outcome (the
  // callbacks of one List run after it ended and before the next one starts).
  bool last_list_ok() const { return last_list_ok_; }

  // An exclusive admission's two calls share one List. The kubelet admits containers one at a
  // time and, for each resource, calls Allocate right after the GetPreferredAllocation that chose
  // its IDs (the device manager's devicesToAllocate, then allocate), so nothing is admitted
  // between the two: the List that answered the GetPreferredAllocation is as new as its Allocate
  // for withholding. KeepPreferred keeps one container's answer when it was computed from a
  // successful List begun after the call; nullopt forgets it (any other answer, a registration:
  // the other mode's plugin may admit containers before ours is the kubelet's endpoint again).
  void KeepPreferred(std::optional<std::vector<std::string>> answer) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `ids` (one container's, any order) are the answer kept, which is forgotten either way:
  // then the Allocate needs no List of its own.
  bool TakePreferred(std::vector<std::string> ids) ABSL_LOCKS_EXCLUDED(mu_);
  bool has_pod_resources() const { return sources_.pod_resources != nullptr; }

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

  // What Allocate gives one container: its devices, envs and, with --allocation-dir, the host
  // file mounted read-only at hca::kAllocationFile.
  using Grant = node::Grant;
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
  // them, and so does this class (pod-resources errors, each allocation's alignment).
  PluginMetrics& metrics() const { return metrics_; }
  // One scrape: the instruments, then the node's (node::Node::WriteMetrics) with the plugin's
  // part: withholding and the containers holding HCAs. Thread-safe.
  void WriteMetrics(metrics::Exposition& out) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void StartList(std::function<void()> finished) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  void OnPods(absl::StatusOr<PodList> pods) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  // Takes the core's view now (a new snapshot gets its allocator) and recomputes devices_ from its
  // HCAs and the pods; bumps version_ and logs withholding decisions when different. True when
  // the list or the withheld set changed.
  bool Recompute() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the listeners.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  // Counts the allocation of `pcis` by its alignment with the GPUs of the container being
  // admitted, as the last pod list shows it; returns those GPUs (empty when unknown).
  std::vector<std::string> CountAlignment(const std::vector<std::string>& pcis) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The HCAs the pod list shows held through our resource; nullopt while it is not known.
  std::optional<std::set<std::string>> HeldNow() const ABSL_LOCKS_EXCLUDED(mu_);

  const Config config_;
  NodeSources sources_;
  node::Node core_;
  std::atomic<bool> last_list_ok_{false};  // the latest pod-resources List succeeded
  mutable PluginMetrics metrics_;

  // Lock order: listeners_mu_ (held while listeners run), then mu_.
  mutable absl::Mutex listeners_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<int, std::function<void()>> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  int next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 0;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(listeners_mu_);
  node::ViewPtr view_ ABSL_GUARDED_BY(mu_);  // the core's, as of the last Recompute
  std::shared_ptr<const allocator::ExclusiveAllocator> allocator_ ABSL_GUARDED_BY(mu_);
  PodList pods_ ABSL_GUARDED_BY(mu_);
  bool pods_known_ ABSL_GUARDED_BY(mu_) = false;
  bool pods_failing_ ABSL_GUARDED_BY(mu_) = false;  // the failure was logged
  absl::Time failure_logged_ ABSL_GUARDED_BY(mu_);  // when; logged again a minute on
  std::map<std::string, absl::Time> gpu_first_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> gpu_ids_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> withheld_ ABSL_GUARDED_BY(mu_);  // PCI -> why
  bool withholding_pending_ ABSL_GUARDED_BY(mu_) = false;  // withheld_ is "pods not known yet"
  std::vector<DeviceState> devices_ ABSL_GUARDED_BY(mu_);
  std::optional<std::vector<std::string>> preferred_ ABSL_GUARDED_BY(mu_);  // sorted
  std::uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;

  // Last: destroyed first, so that a List in flight finishes while the rest is still alive.
  serving::SingleFlight pod_refresh_;
};

}  // namespace rdp::deviceplugin
