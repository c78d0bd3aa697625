#include "dra/probe.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "proto/dra.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/pluginregistration.grpc.pb.h"
#include "serving/unix_server.h"

namespace rdp::dra {

namespace drapb = k8s::io::kubelet::pkg::apis::dra::v1;

namespace {

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

}  // namespace

std::string RegistrationSocket(const std::string& kubelet_dir, const std::string& driver) {
  return (std::filesystem::path(kubelet_dir) / "plugins_registry" / (driver + "-reg.sock"))
      .string();
}

absl::Status Probe(const std::string& kubelet_dir, const std::string& driver,
                   absl::Duration timeout, bool registered) {
  const std::string registration = RegistrationSocket(kubelet_dir, driver);
  pluginregistration::PluginInfo info;
  {
    auto stub = pluginregistration::Registration::NewStub(serving::UnixChannel(registration));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    grpc::Status status = stub->GetInfo(&context, pluginregistration::InfoRequest(), &info);
    if (!status.ok()) return FromGrpc(status, absl::StrCat("no answer on ", registration));
  }
  if (info.type() != "DRAPlugin" || info.name() != driver) {
    return absl::FailedPreconditionError(
        absl::StrCat(registration, " registers a ", info.type(), " named '", info.name(),
                     "', not the DRAPlugin '", driver, "'"));
  }
  std::shared_ptr<grpc::Channel> channel = serving::UnixChannel(info.endpoint());
  {
    auto stub = drapb::DRAPlugin::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    drapb::NodeUnprepareResourcesResponse response;
    grpc::Status status =
        stub->NodeUnprepareResources(&context, drapb::NodeUnprepareResourcesRequest(), &response);
    if (!status.ok()) return FromGrpc(status, absl::StrCat("no answer on ", info.endpoint()));
  }
  if (!registered) return absl::OkStatus();
  auto health = ::grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ::grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = health->Check(&context, ::grpc::health::v1::HealthCheckRequest(), &response);
  if (!status.ok()) {
    return FromGrpc(status, absl::StrCat("no readiness answer on ", info.endpoint()));
  }
  if (response.status() != ::grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "driver ", driver, " answers on ", info.endpoint(),
        ", but the kubelet has not registered it (or refused it: see the driver's log)"));
  }
  return absl::OkStatus();
}

}  // namespace rdp::dra
