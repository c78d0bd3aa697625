#pragma once

// The DRA driver's shared vocabulary: what the node side (devices, ResourceSlices,
// CDI, checkpoint, the kubelet's gRPC services) and the API side (client, slice publisher, claim
// reader) exchange. Plain data and two interfaces; no I/O here.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace rdp::dra {

// The default driver name (flag --driver-name).
inline constexpr char kDefaultDriverName[] = "rdma.network.alibabacloud.com";

// A claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources.
struct ClaimRef {
  std::string ns;
  std::string uid;
  std::string name;
};

// One entry of a claim's status.allocation.devices.results[] whose driver is ours.
struct AllocatedDevice {
  std::string request;  // results[].request ("hca", or "hca/sub" for a subrequest)
  std::string pool;     // results[].pool
  std::string device;   // results[].device: a device name of our ResourceSlices
  // results[].shareID: set by the allocator for a device that allows multiple allocations
  // (shared mode); "" when none.
  std::string share_id;
  // results[].adminAccess: true (KEP-5018; the claim's namespace carries
  // resource.kubernetes.io/admin-access: "true"). The scheduler allocates such a device beside
  // its holders; the driver gives it the HCA's device nodes and never counts it as a holder (it
  // takes no part in the common variables nor in HeldHcas). false when absent or false: a
  // control plane that drops the field allocated the device as any other.
  bool admin_access = false;
  // results[].consumedCapacity: what the allocation consumes of each capacity of a device that
  // allows multiple allocations (shared mode: "pods", "bandwidthGbps"), quantities as the API
  // server wrote them ("100"); empty when none (exclusive mode, or a control plane without
  // DRAConsumableCapacity).
  std::map<std::string, std::string> consumed_capacity;
  bool operator==(const AllocatedDevice& o) const {
    return request == o.request && pool == o.pool && device == o.device &&
           share_id == o.share_id && consumed_capacity == o.consumed_capacity &&
           admin_access == o.admin_access;
  }
};

// "hca/sub" -> "hca": the request a container names (pod.spec.containers[].resources.claims[].
// request) for the result of one of its subrequests.
inline std::string BaseRequest(const std::string& request) {
  return request.substr(0, request.find('/'));
}

// A pod as a claim's status.reservedFor names it (in the claim's namespace).
struct PodRef {
  std::string ns;
  std::string name;
  std::string uid;
};

// The annotation a claim made from a ResourceClaimTemplate carries: the pod's name for it
// (pod.spec.resourceClaims[].name).
inline constexpr char kPodClaimNameAnnotation[] = "resource.kubernetes.io/pod-claim-name";

// What Read knows of a claim: its uid, the results of our driver, the pods it is reserved for,
// and the pod's name for it when it was made from a template (kPodClaimNameAnnotation).
struct ClaimAllocation {
  std::string uid;
  std::vector<AllocatedDevice> devices;
  std::vector<PodRef> reserved_for;
  std::optional<std::string> pod_claim_name;
};

// A container's use of a claim: the ResourceClaim's name (in the pod's namespace) and the request
// it names; "" = every request of the claim.
struct ClaimUse {
  std::string claim;
  std::string request;
  bool operator==(const ClaimUse& o) const { return claim == o.claim && request == o.request; }
};

// The claims each container of a pod uses (init containers included): its resources.claims
// resolved to ResourceClaim names (a template's claim through status.resourceClaimStatuses), and
// the requests of the scheduler-made claim of an extended resource (status.
// extendedResourceClaimStatus.requestMappings), and the names of the variables its spec sets.
struct PodClaims {
  struct Container {
    std::string name;
    std::vector<ClaimUse> uses;
    // env[].name, whatever the value's source (value, valueFrom): the variables the pod spec
    // sets, which a CDI device must not set over (the runtime applies CDI's env last). envFrom's
    // names are not here: they are in ConfigMaps and Secrets the driver does not read.
    std::vector<std::string> env;
  };
  PodRef pod;
  std::vector<Container> containers;
};

// Reads claims and their consumers from the API server.
class ClaimReader {
 public:
  virtual ~ClaimReader() = default;
  // The claim `ref` names (namespace and name; its uid checked when ref.uid is not empty): the
  // results of its allocation whose driver is `driver`, in the order the API server lists them,
  // and the pods it is reserved for, read by GET within `deadline` (retries included).
  //   NotFound: no such claim, or one whose metadata.uid is not ref.uid (deleted and re-created);
  //   FailedPrecondition: the claim is not allocated;
  //   InvalidArgument: status.allocation is malformed (a result without pool or device, ...);
  //   Unavailable / DeadlineExceeded: the API server could not be reached in time.
  // No devices: allocated, with no result for `driver`.
  virtual absl::StatusOr<ClaimAllocation> Read(const ClaimRef& ref, const std::string& driver,
                                               absl::Time deadline) = 0;
  // Which claims each container of the pod uses. NotFound: no such pod, or another uid.
  virtual absl::StatusOr<PodClaims> ReadPod(const PodRef& pod, absl::Time deadline) = 0;
};

// Keeps our driver's entries of a claim's status.devices (resource.k8s.io/v1
// AllocatedDeviceStatus) in the API server.
class ClaimStatusWriter {
 public:
  virtual ~ClaimStatusWriter() = default;
  // Makes our driver's entries of the claim's status.devices `devices` (objects as
  // AllocatedDeviceStatus makes them; none: ours are removed), other drivers' entries kept.
  // Asynchronous: never waits on the API server; a failure is logged and retried by the writer.
  virtual void Set(const ClaimRef& ref, std::vector<nlohmann::json> devices) = 0;
};

// Keeps this node's pool in the API server.
class SlicePublisher {
 public:
  virtual ~SlicePublisher() = default;
  // Makes the API server hold exactly `slices` (objects as BuildResourceSlices makes them) as this
  // node's pool for the driver: creates and updates them, deletes this node's other slices of
  // the driver, bumps spec.pool.generation above what the server holds when any device
  // changed, sets the Node as owner. Within `deadline`; retries with back-off inside it.
  virtual absl::Status Publish(const std::vector<nlohmann::json>& slices,
                               absl::Time deadline) = 0;

  // Follows the server's changes to the node's pool from where the last successful Publish saw
  // it, and calls `changed` when the pool is no longer what Publish made it (someone edited or
  // deleted a slice, or the Node was re-created): publish again. `on_open` is called once the
  // server accepted the watch. Blocks until the server ends the watch (OK: start another),
  // `cancelled` returns true (Cancelled; polled about once a second), the watch cannot go on from
  // that point (Aborted: publish, which lists afresh, then watch again), or it fails (the
  // API client's statuses: Unavailable, PermissionDenied, ...). FailedPrecondition before any
  // Publish succeeded. Unimplemented: this publisher cannot watch (the caller resyncs by timer).
  // Runs on a thread of its own, concurrently with Publish.
  virtual absl::Status Watch(const std::function<bool()>& cancelled,
                             const std::function<void()>& on_open,
                             const std::function<void()>& changed) {
    (void)cancelled, (void)on_open, (void)changed;
    return absl::UnimplementedError("this publisher does not watch");
  }
};

}  // namespace rdp::dra
