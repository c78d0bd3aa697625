#pragma once

// The health of the node's HCAs for the kubelet (DRAResourceHealth.NodeWatchResources, v1 and
// v1alpha1, on the DRA socket; the kubelet's ResourceHealthStatus, beta and on by default since
// 1.36): what the kubelet puts in status.containerStatuses[].allocatedResourcesStatus of the pods
// holding them.
//  - DeviceHealthOf: each HCA of a snapshot as (pool, device, HEALTHY/UNHEALTHY, why), by the same
//    verdict as Prepare and the slices' taints (hca::Assess).
//  - HealthFeed: the current list; the health poll publishes it, the streams wait on it.
//  - HealthService<V>: the stream. It sends the whole list at once, then again whenever it
//    changes, and at least every config.heartbeat: each device says health_check_timeout_seconds
//    (config.timeout), after which the kubelet takes a device it has heard nothing of for UNKNOWN
//    (a driver that hangs or is gone). A stream ends (OK) when the kubelet cancels it or the feed
//    is stopped.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/dra_health.grpc.pb.h"
#include "proto/dra_health_v1alpha1.grpc.pb.h"
#include "hca/early_warning.h"
#include "node/node.h"
#include "topology/topology.h"

namespace rdp::dra {

namespace healthpb = ::v1;
namespace healthpb_v1alpha1 = ::v1alpha1;

// The health services as the kubelet names them in supported_versions (k8s.io/kubelet
// pkg/apis/dra-health/*/types.go); optional for it: listed after DRAPlugin.
inline constexpr char kDraHealthService[] = "v1.DRAResourceHealth";
inline constexpr char kDraHealthServiceV1alpha1[] = "v1alpha1.DRAResourceHealth";

struct DeviceHealth {
  enum class State { kUnknown, kHealthy, kUnhealthy };
  std::string pool;
  std::string device;  // DeviceName(hca)
  State state = State::kUnknown;
  std::string message;  // "" when healthy; else hca::Assess's reason ("port 1 is DOWN")
  bool operator==(const DeviceHealth& o) const {
    return pool == o.pool && device == o.device && state == o.state && message == o.message;
  }
};

// Every HCA of `node.topology`, in its order, in the pool `pool` (the node's name), healthy as
// node.Verdict says.
std::vector<DeviceHealth> DeviceHealthOf(const node::View& node, const std::string& pool);

struct HealthFeedConfig {
  // The longest a stream goes without sending the list (the health poll's interval is a good
  // value: what the kubelet holds is then never older than one poll and one heartbeat).
  absl::Duration heartbeat = absl::Seconds(5);
  // health_check_timeout_seconds of each device: how long the kubelet keeps a status without a
  // new message, rounded up to whole seconds; several heartbeats, so that one late message does
  // not make a device UNKNOWN (`dra` uses three polls, at least the kubelet's default 30 s).
  absl::Duration timeout = absl::Seconds(30);
};

class HealthFeed {
 public:
  explicit HealthFeed(HealthFeedConfig config = {});

  // The list now. Streams are woken when it differs from the last one.
  void Publish(std::vector<DeviceHealth> devices);
  // Ends every stream, now and later (the driver stops or hands over).
  void Stop();

  struct Snapshot {
    std::uint64_t generation = 0;  // bumped by each Publish that changed the list
    std::vector<DeviceHealth> devices;
    bool stopped = false;
  };
  Snapshot Current() const;
  // Blocks until the generation differs from `seen`, the feed is stopped, or `deadline`.
  Snapshot WaitChange(std::uint64_t seen, absl::Time deadline) const;
  const HealthFeedConfig& config() const { return config_; }

 private:
  const HealthFeedConfig config_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;  // signalled on Publish and Stop
  std::uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<DeviceHealth> devices_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// DRAResourceHealth of one API version: Service is healthpb::DRAResourceHealth::Service or
// healthpb_v1alpha1's.
template <typename Service>
class HealthService final : public Service {
 public:
  // `feed` is not owned and must outlive the service.
  explicit HealthService(HealthFeed* feed) : feed_(feed) {}

  grpc::Status NodeWatchResources(
      grpc::ServerContext* context, const typename Service::Request* request,
      grpc::ServerWriter<typename Service::Response>* writer) override;

 private:
  HealthFeed* const feed_;
};

struct HealthServiceV1 : healthpb::DRAResourceHealth::Service {
  using Request = healthpb::NodeWatchResourcesRequest;
  using Response = healthpb::NodeWatchResourcesResponse;
};
struct HealthServiceV1alpha1 : healthpb_v1alpha1::DRAResourceHealth::Service {
  using Request = healthpb_v1alpha1::NodeWatchResourcesRequest;
  using Response = healthpb_v1alpha1::NodeWatchResourcesResponse;
};

}  // namespace rdp::dra
