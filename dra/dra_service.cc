#include "dra/dra_service.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"

namespace rdp::dra {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

template <typename Claims>
std::vector<ClaimRef> Refs(const Claims& claims) {
  std::vector<ClaimRef> out;
  out.reserve(claims.size());
  for (const auto& c : claims) out.push_back({c.namespace_(), c.uid(), c.name()});
  return out;
}

// v1beta1's Device has no share_id: a shared device is answered without it there.
void SetShareId(drapb::Device* device, const std::string& id) { device->set_share_id(id); }
void SetShareId(drapb_v1beta1::Device*, const std::string&) {}

}  // namespace

template <typename Service>
grpc::Status DraService<Service>::NodePrepareResources(grpc::ServerContext*,
                                                       const typename Service::Request* request,
                                                       typename Service::Response* response) {
  try {
    auto results = driver_->Prepare(Refs(request->claims()));
    auto& claims = *response->mutable_claims();
    for (auto& [uid, result] : results) {
      auto& entry = claims[uid];
      if (!result.ok()) {
        entry.set_error(result.status().ToString());
        continue;
      }
      for (const PreparedDevice& d : *result) {
        auto* device = entry.add_devices();
        for (const std::string& r : d.requests) device->add_request_names(r);
        device->set_pool_name(d.pool);
        device->set_device_name(d.device);
        for (const std::string& id : d.cdi_ids) device->add_cdi_device_ids(id);
        if (!d.share_id.empty()) SetShareId(device, d.share_id);
      }
    }
    return grpc::Status::OK;
  } catch (const std::exception& e) {
    Log()->error("NodePrepareResources failed: {}", e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

template <typename Service>
grpc::Status DraService<Service>::NodeUnprepareResources(
    grpc::ServerContext*, const typename Service::UnprepareRequest* request,
    typename Service::UnprepareResponse* response) {
  try {
    auto results = driver_->Unprepare(Refs(request->claims()));
    auto& claims = *response->mutable_claims();
    for (auto& [uid, status] : results) {
      auto& entry = claims[uid];
      if (!status.ok()) entry.set_error(status.ToString());
    }
    return grpc::Status::OK;
  } catch (const std::exception& e) {
    Log()->error("NodeUnprepareResources failed: {}", e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

template class DraService<DraServiceV1>;
template class DraService<DraServiceV1beta1>;

RegistrationService::RegistrationService(std::string driver_name, std::string endpoint,
                                         std::vector<std::string> services)
    : driver_name_(std::move(driver_name)),
      endpoint_(std::move(endpoint)),
      services_(std::move(services)) {}

grpc::Status RegistrationService::GetInfo(grpc::ServerContext*,
                                          const pluginregistration::InfoRequest*,
                                          pluginregistration::PluginInfo* response) {
  response->set_type(kDraPluginType);
  response->set_name(driver_name_);
  response->set_endpoint(endpoint_);
  for (const std::string& s : services_) response->add_supported_versions(s);
  return grpc::Status::OK;
}

grpc::Status RegistrationService::NotifyRegistrationStatus(
    grpc::ServerContext*, const pluginregistration::RegistrationStatus* request,
    pluginregistration::RegistrationStatusResponse*) {
  RegistrationState state;
  {
    absl::MutexLock lock(&mu_);
    state_.registered = request->plugin_registered();
    if (state_.registered) {
      ++state_.registrations;
      state_.error.clear();
    } else {
      ++state_.refusals;
      state_.error = request->error();
    }
    state = state_;
  }
  if (state.registered) {
    Log()->info("registered DRA driver {} with the kubelet (endpoint {})", driver_name_,
                endpoint_);
  } else {
    Log()->error(
        "the kubelet refused DRA driver {}: {} (we offer {}; DRAPlugin v1beta1 needs kubelet "
        "1.32, v1 1.34): its ResourceSlices are withdrawn until a kubelet registers it",
        driver_name_, request->error(), absl::StrJoin(services_, ", "));
  }
  if (on_status_) on_status_(state);
  return grpc::Status::OK;
}

RegistrationState RegistrationService::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

grpc::Status ReadinessService::Check(grpc::ServerContext*,
                                     const ::grpc::health::v1::HealthCheckRequest* request,
                                     ::grpc::health::v1::HealthCheckResponse* response) {
  if (!request->service().empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown service \"", request->service(),
                                     "\": ask for \"\" (the driver)"));
  }
  response->set_status(ready_() ? ::grpc::health::v1::HealthCheckResponse::SERVING
                                : ::grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status ReadinessService::List(grpc::ServerContext* context,
                                    const ::grpc::health::v1::HealthListRequest*,
                                    ::grpc::health::v1::HealthListResponse* response) {
  return Check(context, &::grpc::health::v1::HealthCheckRequest::default_instance(),
               &(*response->mutable_statuses())[""]);
}

}  // namespace rdp::dra
