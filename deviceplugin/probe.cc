#include "deviceplugin/probe.h"

#include "absl/strings/str_cat.h"
#include "proto/deviceplugin.grpc.pb.h"
#include "serving/unix_server.h"

namespace rdp::deviceplugin {

absl::Status Probe(const std::string& socket_path, absl::Duration timeout) {
  auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(socket_path));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1beta1::DevicePluginOptions options;
  grpc::Status status = stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options);
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("no answer on ", socket_path, ": ", status.error_message()));
}

}  // namespace rdp::deviceplugin
