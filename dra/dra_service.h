#pragma once

// The kubelet's gRPC services of the DRA driver, thin: each validates the request, calls the
// Driver and translates its answer. No exception escapes a handler.
//  - DraService: k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin on
//    <kubelet-dir>/plugins/<driver>/dra.sock.
//  - RegistrationService: pluginregistration.Registration on the registration socket, which the
//    kubelet's plugin watcher finds in <kubelet-dir>/plugins_registry/.

#include <atomic>
#include <functional>
#include <string>

#include "dra/driver.h"
#include "proto/dra.grpc.pb.h"
#include "proto/pluginregistration.grpc.pb.h"

namespace rdp::dra {

namespace drapb = ::k8s::io::kubelet::pkg::apis::dra::v1;

// PluginInfo.type for a DRA driver (k8s.io/kubelet pluginregistration/v1 constants.go).
inline constexpr char kDraPluginType[] = "DRAPlugin";
// The gRPC services we serve, as the kubelet names them in supported_versions: "<gRPC package's
// last component>.<service>" (k8s.io/kubelet pkg/apis/dra/v1 types.go, DRAPluginService). The
// kubelet picks the first it knows, and dials that service's methods.
inline constexpr char kDraPluginService[] = "v1.DRAPlugin";

class DraService final : public drapb::DRAPlugin::Service {
 public:
  explicit DraService(Driver* driver) : driver_(driver) {}

  // Every claim of the request gets an entry, keyed by UID: its devices, or its error. A request
  // without claims gets an empty answer. INTERNAL only when the driver itself failed.
  grpc::Status NodePrepareResources(grpc::ServerContext* context,
                                    const drapb::NodePrepareResourcesRequest* request,
                                    drapb::NodePrepareResourcesResponse* response) override;
  grpc::Status NodeUnprepareResources(grpc::ServerContext* context,
                                      const drapb::NodeUnprepareResourcesRequest* request,
                                      drapb::NodeUnprepareResourcesResponse* response) override;

 private:
  Driver* const driver_;
};

class RegistrationService final : public pluginregistration::Registration::Service {
 public:
  // `endpoint`: the absolute path of the DRAPlugin socket (the kubelet dials "unix:" + it).
  RegistrationService(std::string driver_name, std::string endpoint);

  // {type "DRAPlugin", name <driver>, endpoint, supported_versions ["v1.DRAPlugin"]}.
  grpc::Status GetInfo(grpc::ServerContext* context, const pluginregistration::InfoRequest* request,
                       pluginregistration::PluginInfo* response) override;
  // Logs the kubelet's verdict (info when registered, error with the kubelet's message when not)
  // and counts it.
  grpc::Status NotifyRegistrationStatus(
      grpc::ServerContext* context, const pluginregistration::RegistrationStatus* request,
      pluginregistration::RegistrationStatusResponse* response) override;

  int registrations() const { return registrations_.load(); }  // successful ones so far
  int refusals() const { return refusals_.load(); }
  // Runs after each NotifyRegistrationStatus (tests wait on it). Set before serving.
  void SetOnStatus(std::function<void()> on_status) { on_status_ = std::move(on_status); }

 private:
  const std::string driver_name_;
  const std::string endpoint_;
  std::atomic<int> registrations_{0};
  std::atomic<int> refusals_{0};
  std::function<void()> on_status_;
};

}  // namespace rdp::dra
