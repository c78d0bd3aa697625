#pragma once

// ResourceState: one resource (resources::Resource) as the device plugin serves it, over the one
// NodeState every resource of the process shares: which of the node's HCAs it holds (its selector
// on every view of the node; a member that vanished stays, unhealthy, until the node forgets it),
// its mode (the node's, or shared for an always-shared resource), the HCAs withheld from it across
// a mode switch, the device list its ListAndWatch streams, and what its Allocate and
// GetPreferredAllocation answer. NodeState owns it and recomputes it on every change of the node
// or of the kubelet's pod list.
// Thread-safe: its state is under mu_, which is taken after NodeState's lock and never held
// while it calls NodeState.

#include <cstdint>
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
#include "allocator/allocator.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plugin_metrics.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/resource_model.h"
#include "hca/hca.h"
#include "node/node.h"
#include "resources/resources.h"

namespace rdp::deviceplugin {

class NodeState;

class ResourceState {
 public:
  // `node_mode`: the mode the node label chose; an always-shared resource is shared whatever it
  // says. `naming`: the names its Allocate answers set (AllocationNamings).
  ResourceState(NodeState& node, resources::Resource resource, hca::Mode node_mode,
                AllocationNaming naming);
  ResourceState(const ResourceState&) = delete;
  ResourceState& operator=(const ResourceState&) = delete;

  const resources::Resource& resource() const { return resource_; }
  const std::string& name() const { return resource_.name; }
  hca::Mode mode() const { return mode_; }
  const AllocationNaming& naming() const { return naming_; }
  // The node it is a resource of (its owner).
  NodeState& node() const { return node_; }

  struct DeviceList {
    std::uint64_t version = 0;
    std::vector<DeviceState> devices;
  };
  DeviceList Devices() const ABSL_LOCKS_EXCLUDED(mu_);
  // The PCI addresses of the HCAs the resource holds now (vanished members included).
  std::set<std::string> Members() const ABSL_LOCKS_EXCLUDED(mu_);

  // One container's allocation. InvalidArgument naming the ID and the resource when the request
  // is empty, has a duplicate (in any spelling), an unknown ID or an HCA of the node that this
  // resource does not hold. FailedPrecondition naming the HCA and why when an HCA asked for
  // (exclusive) or every HCA of the resource (shared) is withheld or unusable now; each HCA's
  // device nodes are checked at the call, so that no DeviceSpec names a missing node. Shared: the
  // grant mounts every usable HCA of the resource.
  absl::StatusOr<node::Grant> Allocate(const std::vector<std::string>& ids) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // GetPreferredAllocation for one container, on views of the request's own IDs: the
  // allocator's one path per mode (allocator::ExclusiveAllocator::Answer over the resource's
  // HCAs, with the GPU context of the pod list as last refreshed and the HCAs the early-warning
  // rule finds degraded taken only to complete the answer; allocator::AnswerShared below the
  // resource's shared_devices). The caller refreshes the pod list first (NodeState::RefreshPods).
  // InvalidArgument only for a malformed request: IDs not offered now are left to the kubelet,
  // must_include is kept as given.
  absl::StatusOr<std::vector<std::string>> Prefer(const std::vector<std::string_view>& available,
                                                  const std::vector<std::string_view>& must_include,
                                                  int size) const ABSL_LOCKS_EXCLUDED(mu_);

  // An exclusive admission's two calls share one List (NodeState's class comment has why):
  // KeepPreferred keeps one container's answer when it was computed from a successful List
  // begun after the call; nullopt forgets it (any other answer, a registration).
  void KeepPreferred(std::optional<std::vector<std::string>> answer) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `ids` (one container's, any order) are the answer kept, which is forgotten either way.
  bool TakePreferred(std::vector<std::string> ids) ABSL_LOCKS_EXCLUDED(mu_);

  // The resource's instruments (thread-safe): its RPC handlers and registrations update them.
  PluginMetrics& metrics() const { return metrics_; }
  // The PCI addresses withheld from the resource now.
  std::set<std::string> Withheld() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class NodeState;
  // The pod list as NodeState knows it: null while not known.
  struct Pods {
    const PodList* list = nullptr;
    bool pending = false;  // a pod-resources source is set and no List has answered yet
    std::string pending_reason;
  };
  // Recomputes the members, the withheld set and the device list from `view` and `pods`; bumps
  // the version and logs withholding decisions when they differ. True when the list or the
  // withheld set changed. NodeState calls it under its own lock.
  bool Recompute(const node::ViewPtr& view, const Pods& pods) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts the allocation of `pcis` by its alignment with the GPUs of the container being
  // admitted; returns those GPUs (empty when unknown).
  std::vector<std::string> CountAlignment(const std::vector<std::string>& pcis) const
      ABSL_LOCKS_EXCLUDED(mu_);

  NodeState& node_;
  const resources::Resource resource_;
  const hca::Mode mode_;
  const AllocationNaming naming_;
  mutable PluginMetrics metrics_;

  mutable absl::Mutex mu_;
  node::ViewPtr view_ ABSL_GUARDED_BY(mu_);  // the node's, as of the last Recompute
  std::shared_ptr<const allocator::ExclusiveAllocator> allocator_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> members_ ABSL_GUARDED_BY(mu_);  // PCI addresses
  bool members_known_ ABSL_GUARDED_BY(mu_) = false;     // a first Recompute ran
  std::map<std::string, std::string> withheld_ ABSL_GUARDED_BY(mu_);  // PCI -> why
  bool withholding_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<DeviceState> devices_ ABSL_GUARDED_BY(mu_);
  std::optional<std::vector<std::string>> preferred_ ABSL_GUARDED_BY(mu_);  // sorted
  std::uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rdp::deviceplugin
