#pragma once

// Starting a gRPC server on a unix socket path that a later server may reuse.
//
// gRPC unlinks a unix listener's path when the listener is destroyed, which can happen after
// grpc::Server::Shutdown() returns; a server started on the same path in the meantime would lose
// its socket. So the server binds a unique temporary name beside the path and renames it into
// place: the old listener's late unlink then hits its own (already renamed) name.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace rdp::server {

// Serves `services` (not owned; they must outlive the server) on the unix socket `path`,
// replacing whatever file is there. Unavailable naming the path when it cannot bind or rename.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartUnixServer(
    const std::string& path, const std::vector<grpc::Service*>& services);

}  // namespace rdp::server
