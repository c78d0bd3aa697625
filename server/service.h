#pragma once

// The v1beta1.DevicePlugin service: validates each request, calls Plugin and maps absl::Status to
// grpc::Status. No exception escapes a handler. One instance per served socket; Stop() ends its
// ListAndWatch streams so that the gRPC server can shut down.

#include <atomic>

#include "grpcpp/grpcpp.h"
#include "proto/deviceplugin.grpc.pb.h"
#include "server/plugin.h"

namespace rdp::server {

// The one mapping from absl::Status to grpc::Status (codes are numerically equal).
grpc::Status ToGrpc(const absl::Status& status);

class DevicePluginService final : public v1beta1::DevicePlugin::Service {
 public:
  explicit DevicePluginService(Plugin* plugin) : plugin_(plugin) {}

  // Makes every ListAndWatch return OK promptly; new streams return at once. Thread-safe.
  void Stop();

  grpc::Status GetDevicePluginOptions(grpc::ServerContext* context, const v1beta1::Empty* request,
                                      v1beta1::DevicePluginOptions* response) override;
  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty* request,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override;
  grpc::Status GetPreferredAllocation(grpc::ServerContext* context,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override;
  grpc::Status Allocate(grpc::ServerContext* context, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override;
  grpc::Status PreStartContainer(grpc::ServerContext* context,
                                 const v1beta1::PreStartContainerRequest* request,
                                 v1beta1::PreStartContainerResponse* response) override;

 private:
  Plugin* const plugin_;  // not owned; outlives the service
  std::atomic<bool> stop_{false};
};

// Fills a ListAndWatchResponse from a device list.
void ToProto(const std::vector<DeviceState>& devices, v1beta1::ListAndWatchResponse* out);

}  // namespace rdp::server
