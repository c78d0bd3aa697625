#include "dra/dra_service.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace rdp::dra {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

std::vector<ClaimRef> Refs(const google::protobuf::RepeatedPtrField<drapb::Claim>& claims) {
  std::vector<ClaimRef> out;
  out.reserve(claims.size());
  for (const drapb::Claim& c : claims) out.push_back({c.namespace_(), c.uid(), c.name()});
  return out;
}

}  // namespace

grpc::Status DraService::NodePrepareResources(grpc::ServerContext*,
                                              const drapb::NodePrepareResourcesRequest* request,
                                              drapb::NodePrepareResourcesResponse* response) {
  try {
    auto results = driver_->Prepare(Refs(request->claims()));
    auto& claims = *response->mutable_claims();
    for (auto& [uid, result] : results) {
      drapb::NodePrepareResourceResponse& entry = claims[uid];
      if (!result.ok()) {
        entry.set_error(result.status().ToString());
        continue;
      }
      for (const PreparedDevice& d : *result) {
        drapb::Device* device = entry.add_devices();
        for (const std::string& r : d.requests) device->add_request_names(r);
        device->set_pool_name(d.pool);
        device->set_device_name(d.device);
        for (const std::string& id : d.cdi_ids) device->add_cdi_device_ids(id);
        if (!d.share_id.empty()) device->set_share_id(d.share_id);
      }
    }
    return grpc::Status::OK;
  } catch (const std::exception& e) {
    Log()->error("NodePrepareResources failed: {}", e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

grpc::Status DraService::NodeUnprepareResources(
    grpc::ServerContext*, const drapb::NodeUnprepareResourcesRequest* request,
    drapb::NodeUnprepareResourcesResponse* response) {
  try {
    auto results = driver_->Unprepare(Refs(request->claims()));
    auto& claims = *response->mutable_claims();
    for (auto& [uid, status] : results) {
      drapb::NodeUnprepareResourceResponse& entry = claims[uid];
      if (!status.ok()) entry.set_error(status.ToString());
    }
    return grpc::Status::OK;
  } catch (const std::exception& e) {
    Log()->error("NodeUnprepareResources failed: {}", e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

RegistrationService::RegistrationService(std::string driver_name, std::string endpoint)
    : driver_name_(std::move(driver_name)), endpoint_(std::move(endpoint)) {}

grpc::Status RegistrationService::GetInfo(grpc::ServerContext*,
                                          const pluginregistration::InfoRequest*,
                                          pluginregistration::PluginInfo* response) {
  response->set_type(kDraPluginType);
  response->set_name(driver_name_);
  response->set_endpoint(endpoint_);
  response->add_supported_versions(kDraPluginService);
  return grpc::Status::OK;
}

grpc::Status RegistrationService::NotifyRegistrationStatus(
    grpc::ServerContext*, const pluginregistration::RegistrationStatus* request,
    pluginregistration::RegistrationStatusResponse*) {
  if (request->plugin_registered()) {
    ++registrations_;
    Log()->info("registered DRA driver {} with the kubelet (endpoint {})", driver_name_,
                endpoint_);
  } else {
    ++refusals_;
    Log()->error("the kubelet refused DRA driver {}: {}", driver_name_, request->error());
  }
  if (on_status_) on_status_();
  return grpc::Status::OK;
}

}  // namespace rdp::dra
