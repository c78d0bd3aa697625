#pragma once

// The kubelet's gRPC services of the DRA driver, thin: each validates the request, calls the
// Driver and translates its answer. No exception escapes a handler.
//  - DraService<V>: DRAPlugin on <kubelet-dir>/plugins/<driver>/dra.sock, in the two versions
//    kubelets speak: k8s.io.kubelet.pkg.apis.dra.v1 (1.34 and later) and v1beta1 (1.32 and
//    later; the same messages without Device.share_id).
//  - RegistrationService: pluginregistration.Registration on the registration socket, which the
//    kubelet's plugin watcher finds in <kubelet-dir>/plugins_registry/; it knows whether the
//    kubelet has registered the driver.
//  - ReadinessService: grpc.health.v1.Health on the DRA socket, SERVING while the kubelet has
//    the driver registered (`rdma-device-plugin probe --dra --ready`).

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "dra/driver.h"
#include "proto/dra.grpc.pb.h"
#include "proto/dra_v1beta1.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/pluginregistration.grpc.pb.h"

namespace rdp::dra {

namespace drapb = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drapb_v1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

// PluginInfo.type for a DRA driver (k8s.io/kubelet pluginregistration/v1 constants.go).
inline constexpr char kDraPluginType[] = "DRAPlugin";
// The gRPC services we serve, as the kubelet names them in supported_versions: "<gRPC package's
// last component>.<service>" (k8s.io/kubelet pkg/apis/dra/*/types.go, DRAPluginService). The
// kubelet takes the first of our list that it knows and dials that service's methods.
inline constexpr char kDraPluginService[] = "v1.DRAPlugin";
inline constexpr char kDraPluginServiceV1beta1[] = "v1beta1.DRAPlugin";

// DRAPlugin of one API version: Service is drapb::DRAPlugin::Service or drapb_v1beta1's.
template <typename Service>
class DraService final : public Service {
 public:
  explicit DraService(Driver* driver) : driver_(driver) {}

  // Every claim of the request gets an entry, keyed by UID: its devices, or its error. A request
  // without claims gets an empty answer. INTERNAL only when the driver itself failed.
  grpc::Status NodePrepareResources(grpc::ServerContext* context,
                                    const typename Service::Request* request,
                                    typename Service::Response* response) override;
  grpc::Status NodeUnprepareResources(grpc::ServerContext* context,
                                      const typename Service::UnprepareRequest* request,
                                      typename Service::UnprepareResponse* response) override;

 private:
  Driver* const driver_;
};

// The message types of each version, for DraService.
struct DraServiceV1 : drapb::DRAPlugin::Service {
  using Request = drapb::NodePrepareResourcesRequest;
  using Response = drapb::NodePrepareResourcesResponse;
  using UnprepareRequest = drapb::NodeUnprepareResourcesRequest;
  using UnprepareResponse = drapb::NodeUnprepareResourcesResponse;
};
struct DraServiceV1beta1 : drapb_v1beta1::DRAPlugin::Service {
  using Request = drapb_v1beta1::NodePrepareResourcesRequest;
  using Response = drapb_v1beta1::NodePrepareResourcesResponse;
  using UnprepareRequest = drapb_v1beta1::NodeUnprepareResourcesRequest;
  using UnprepareResponse = drapb_v1beta1::NodeUnprepareResourcesResponse;
};

// The kubelet's verdict on a registration, as NotifyRegistrationStatus told it.
struct RegistrationState {
  bool registered = false;  // the last verdict accepted the driver
  int registrations = 0;    // accepted so far
  int refusals = 0;         // refused so far
  std::string error;        // the last refusal's message
};

class RegistrationService final : public pluginregistration::Registration::Service {
 public:
  // `endpoint`: the absolute path of the DRA socket (the kubelet dials "unix:" + it);
  // `services`: supported_versions, most preferred first.
  RegistrationService(std::string driver_name, std::string endpoint,
                      std::vector<std::string> services);

  // {type "DRAPlugin", name <driver>, endpoint, supported_versions <services>}.
  grpc::Status GetInfo(grpc::ServerContext* context, const pluginregistration::InfoRequest* request,
                       pluginregistration::PluginInfo* response) override;
  // Logs the kubelet's verdict (info when registered, error with the kubelet's message when not),
  // records it and runs the callback.
  grpc::Status NotifyRegistrationStatus(
      grpc::ServerContext* context, const pluginregistration::RegistrationStatus* request,
      pluginregistration::RegistrationStatusResponse* response) override;

  // The verdicts so far (DraServer::registered, for /metrics, /healthz and readiness).
  RegistrationState state() const;
  // Runs after each NotifyRegistrationStatus with the new state (dra::Plugin sets the slice
  // sync's role from it). Set before serving.
  void SetOnStatus(std::function<void(const RegistrationState&)> on_status) {
    on_status_ = std::move(on_status);
  }

 private:
  const std::string driver_name_;
  const std::string endpoint_;
  const std::vector<std::string> services_;
  mutable absl::Mutex mu_;
  RegistrationState state_ ABSL_GUARDED_BY(mu_);
  std::function<void(const RegistrationState&)> on_status_;
};

// grpc.health.v1.Health: SERVING while `ready` says so, NOT_SERVING otherwise, for the service
// "" (the driver as a whole); any other name is NOT_FOUND. Check and List; Watch is UNIMPLEMENTED.
class ReadinessService final : public ::grpc::health::v1::Health::Service {
 public:
  explicit ReadinessService(std::function<bool()> ready) : ready_(std::move(ready)) {}
  grpc::Status Check(grpc::ServerContext* context,
                     const ::grpc::health::v1::HealthCheckRequest* request,
                     ::grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status List(grpc::ServerContext* context,
                    const ::grpc::health::v1::HealthListRequest* request,
                    ::grpc::health::v1::HealthListResponse* response) override;

 private:
  const std::function<bool()> ready_;
};

}  // namespace rdp::dra
