#pragma once

// NodeState: the device plugin's adapter over the node core (node/node.h), independent of gRPC,
// shared by every resource the process serves: the node (one health poll), the kubelet's pod list
// (one List for all resources), the GPU IDs and the GPU context of an admission, and the
// resources themselves (ResourceState: each one's HCAs, withholding, device list, Allocate and
// GetPreferredAllocation), recomputed from the core's view on every change. The snapshot,
// health, HCAs known, device-node check and what a container gets are the core's. Nothing here
// runs by itself: PluginServer's threads drive the health poll (Poll) and the pod-resources
// refresh (RefreshPods), the RPCs the rest.
// Thread-safe: state is under mu_ and the listeners under listeners_mu_; discovery, file reads and
// kubelet calls run outside both.
//
// Fail closed: while a pod-resources source is configured and the kubelet's pod list is not
// known yet, every HCA is withheld (listed Unhealthy, refused by Allocate), because a container
// may still hold the other mode's IDs; an admission refused is better than an HCA shared by
// mistake.
//
// An exclusive admission's two calls share one List. The kubelet admits containers one at a
// time and, for each resource, calls Allocate right after the GetPreferredAllocation that chose
// its IDs (the device manager's devicesToAllocate, then allocate), so nothing is admitted between
// the two: the List that answered the GetPreferredAllocation is as new as its Allocate for
// withholding (ResourceState::KeepPreferred).

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
#include "base/env.h"
#include "deviceplugin/config.h"
#include "deviceplugin/gpu_context.h"
#include "deviceplugin/plugin_metrics.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/resource_model.h"
#include "deviceplugin/resource_state.h"
#include "hca/hca.h"
#include "node/node.h"
#include "resources/resources.h"
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

// The resource a Config alone describes (no --config): config.resource_name with an empty
// selector (the node's physical functions) and config.shared_devices units.
resources::Resource DefaultResource(const Config& config);

class NodeState {
 public:
  // `served`: the resources, in order; empty: DefaultResource(config) alone.
  NodeState(Config config, NodeSources sources, std::vector<resources::Resource> served = {});
  ~NodeState();  // waits for a pod-resources List in flight (each has a deadline)
  NodeState(const NodeState&) = delete;
  NodeState& operator=(const NodeState&) = delete;

  // Logs the mode lines, discovers the node (node::Node::Init), reads the GPU IDs and computes
  // every resource's first device list (a resource that holds no HCA of the node is logged as a
  // warning naming it). Errors when discovery fails.
  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);

  // One health poll: the core's (node::Node::Poll, with the HCAs the pod list shows held through
  // any of the resources), the GPU IDs read again, every resource recomputed. Returns true when a
  // resource's list changed (listeners have run).
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
  bool has_pod_resources() const { return sources_.pod_resources != nullptr; }

  // The resources served, in the order given; never empty, fixed for the object's life.
  const std::vector<std::unique_ptr<ResourceState>>& resources() const { return resources_; }
  // resources()[i]: the only one when no resources were given.
  ResourceState& resource(std::size_t i = 0) const { return *resources_.at(i); }

  // `listener` runs after every change of a resource's device list, on the thread that made the
  // change, outside the plugin's state lock (mu_) but inside listeners_mu_: it may call any method
  // here but AddListener and RemoveListener, and the locks it takes come after listeners_mu_
  // (the lock order). RemoveListener returns once no call of that listener is running.
  int AddListener(std::function<void()> listener) ABSL_LOCKS_EXCLUDED(listeners_mu_);
  void RemoveListener(int id) ABSL_LOCKS_EXCLUDED(listeners_mu_);
  // Called when an RPC finds the node changed since the last scan (a device node gone): the
  // owner of the health poll runs one soon.
  void SetRescanRequest(std::function<void()> request) ABSL_LOCKS_EXCLUDED(mu_);

  const Config& config() const { return config_; }
  topology::TopologyPtr topology() const ABSL_LOCKS_EXCLUDED(mu_);
  // The node core, whose view, device-node check and grants the resources read.
  const node::Node& core() const { return core_; }
  // The GPU context of the container being admitted for `resource` (gpu_context.h), from the
  // pod list as last refreshed; nullopt while the pod list is not known or the node has no GPUs.
  std::optional<GpuSelection> GpuContext(const std::string& resource) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The node's instruments (thread-safe): pod-resources errors.
  metrics::Counter& pod_resources_errors() const { return pod_resources_errors_; }
  // One scrape: every resource's instruments (labelled `resource`), the node's, then the core's
  // (node::Node::WriteMetrics) with the plugin's part: withholding and the containers holding
  // HCAs. Thread-safe.
  void WriteMetrics(metrics::Exposition& out) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void StartList(std::function<void()> finished) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  void OnPods(absl::StatusOr<PodList> pods) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  // Takes the core's view now and recomputes every resource from it and the pods; logs the
  // pod list becoming known. True when a resource's list or withheld set changed.
  bool Recompute() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the listeners.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  // The HCAs the pod list shows held through any resource; nullopt while it is not known.
  std::optional<std::set<std::string>> HeldNow() const ABSL_LOCKS_EXCLUDED(mu_);

  const Config config_;
  NodeSources sources_;
  node::Node core_;
  std::vector<std::unique_ptr<ResourceState>> resources_;
  std::atomic<bool> last_list_ok_{false};  // the latest pod-resources List succeeded
  mutable metrics::Counter pod_resources_errors_;

  // Lock order: listeners_mu_ (held while listeners run), then mu_, then a resource's.
  mutable absl::Mutex listeners_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<int, std::function<void()>> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  int next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 0;

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(listeners_mu_);
  node::ViewPtr view_ ABSL_GUARDED_BY(mu_);  // the core's, as of the last Recompute
  PodList pods_ ABSL_GUARDED_BY(mu_);
  bool pods_known_ ABSL_GUARDED_BY(mu_) = false;
  bool pods_failing_ ABSL_GUARDED_BY(mu_) = false;  // the failure was logged
  bool pods_pending_logged_ ABSL_GUARDED_BY(mu_) = false;  // "pod list not known" logged
  absl::Time failure_logged_ ABSL_GUARDED_BY(mu_);  // when; logged again a minute on
  std::map<std::string, absl::Time> gpu_first_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> gpu_ids_ ABSL_GUARDED_BY(mu_);

  // Last: destroyed first, so that a List in flight finishes while the rest is still alive.
  serving::SingleFlight pod_refresh_;
};

}  // namespace rdp::deviceplugin
