#pragma once

// The DRA driver's shared vocabulary (issue 16): what the node side (devices, ResourceSlices,
// CDI, checkpoint, the kubelet's gRPC services) and the API side (client, slice publisher, claim
// reader) exchange. Plain data and two interfaces; no I/O here.

#include <cstdint>
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
  bool operator==(const AllocatedDevice& o) const {
    return request == o.request && pool == o.pool && device == o.device;
  }
};

// Reads claims from the API server.
class ClaimReader {
 public:
  virtual ~ClaimReader() = default;
  // The results of the claim's allocation whose driver is `driver`, in the order the API server
  // lists them, read by GET within `deadline` (retries included).
  //   NotFound: no such claim, or one whose metadata.uid is not ref.uid (deleted and re-created);
  //   FailedPrecondition: the claim is not allocated;
  //   InvalidArgument: status.allocation is malformed (a result without pool or device, ...);
  //   Unavailable / DeadlineExceeded: the API server could not be reached in time.
  // An empty vector: allocated, with no result for `driver`.
  virtual absl::StatusOr<std::vector<AllocatedDevice>> Read(const ClaimRef& ref,
                                                            const std::string& driver,
                                                            absl::Time deadline) = 0;
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
};

}  // namespace rdp::dra
