#include "server/service.h"

#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "topology/log.h"

namespace rdp::server {
namespace {

constexpr char kHealthy[] = "Healthy";
constexpr char kUnhealthy[] = "Unhealthy";
// How often an idle ListAndWatch re-checks whether its client went away.
constexpr absl::Duration kStreamRecheck = absl::Milliseconds(500);

// Runs a handler body; turns an escaping exception into INTERNAL, logged once here.
template <typename F>
grpc::Status Guard(const char* rpc, F&& body) {
  try {
    return ToGrpc(body());
  } catch (const std::exception& e) {
    rdp::Logger("server")->error("{} failed: {}", rpc, e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat(rpc, ": ", e.what()));
  } catch (...) {
    rdp::Logger("server")->error("{} failed with an unknown exception", rpc);
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat(rpc, ": unknown error"));
  }
}

std::vector<std::string> Ids(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  return {ids.begin(), ids.end()};
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

void ToProto(const std::vector<DeviceState>& devices, v1beta1::ListAndWatchResponse* out) {
  for (const DeviceState& d : devices) {
    v1beta1::Device* device = out->add_devices();
    device->set_id(d.id);
    device->set_health(d.healthy ? kHealthy : kUnhealthy);
    if (d.numa) device->mutable_topology()->add_nodes()->set_id(*d.numa);
  }
}

void DevicePluginService::Stop() {
  stop_ = true;
  plugin_->WakeAll();
}

grpc::Status DevicePluginService::GetDevicePluginOptions(grpc::ServerContext*,
                                                         const v1beta1::Empty*,
                                                         v1beta1::DevicePluginOptions* response) {
  response->set_pre_start_required(false);
  response->set_get_preferred_allocation_available(true);
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::ListAndWatch(
    grpc::ServerContext* context, const v1beta1::Empty*,
    grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
  return Guard("ListAndWatch", [&]() -> absl::Status {
    Plugin::DeviceList list = plugin_->Devices();
    std::uint64_t sent = 0;
    while (!stop_ && !context->IsCancelled()) {
      if (list.version != sent) {
        v1beta1::ListAndWatchResponse response;
        ToProto(list.devices, &response);
        if (!writer->Write(response)) return absl::OkStatus();  // the client went away
        sent = list.version;
      }
      list = plugin_->WaitForChange(sent, absl::Now() + kStreamRecheck, stop_);
    }
    return absl::OkStatus();
  });
}

grpc::Status DevicePluginService::GetPreferredAllocation(
    grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* request,
    v1beta1::PreferredAllocationResponse* response) {
  return Guard("GetPreferredAllocation", [&]() -> absl::Status {
    if (request->container_requests().empty()) {
      return absl::InvalidArgumentError("empty request: no container_requests");
    }
    for (const auto& c : request->container_requests()) {
      absl::StatusOr<std::vector<std::string>> ids =
          plugin_->Prefer(Ids(c.available_deviceids()), Ids(c.must_include_deviceids()),
                          c.allocation_size());
      if (!ids.ok()) return ids.status();
      auto* out = response->add_container_responses();
      for (std::string& id : *ids) out->add_deviceids(std::move(id));
    }
    return absl::OkStatus();
  });
}

grpc::Status DevicePluginService::Allocate(grpc::ServerContext*,
                                           const v1beta1::AllocateRequest* request,
                                           v1beta1::AllocateResponse* response) {
  return Guard("Allocate", [&]() -> absl::Status {
    if (request->container_requests().empty()) {
      return absl::InvalidArgumentError("empty request: no container_requests");
    }
    for (const auto& c : request->container_requests()) {
      absl::StatusOr<ContainerAllocation> a = plugin_->Allocate(Ids(c.devices_ids()));
      if (!a.ok()) return a.status();
      auto* out = response->add_container_responses();
      for (const auto& spec : a->devices) {
        auto* d = out->add_devices();
        d->set_container_path(spec.container_path);
        d->set_host_path(spec.host_path);
        d->set_permissions(spec.permissions);
      }
      for (const auto& [k, v] : a->envs) (*out->mutable_envs())[k] = v;
    }
    return absl::OkStatus();
  });
}

grpc::Status DevicePluginService::PreStartContainer(grpc::ServerContext*,
                                                    const v1beta1::PreStartContainerRequest*,
                                                    v1beta1::PreStartContainerResponse*) {
  return grpc::Status::OK;
}

}  // namespace rdp::server
