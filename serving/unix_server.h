#pragma once

// gRPC on unix sockets: starting a server on a path that a later server may reuse, and a client
// channel to a path.
//
// gRPC unlinks a unix listener's path when the listener is destroyed, which can happen after
// grpc::Server::Shutdown() returns; a server started on the same path in the meantime would lose
// its socket. So the server binds a unique temporary name beside the path and renames it into
// place: the old listener's late unlink then hits its own (already renamed) name.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace rdp::serving {

// The served socket's mode: the owner alone (the plugin runs as root, as the kubelet does).
inline constexpr unsigned kSocketMode = 0600;
// Concurrent calls one connection may have open (the kubelet has one or two).
inline constexpr int kMaxCallsPerConnection = 32;
// Memory gRPC may use for the server's connections and calls.
inline constexpr std::size_t kMaxServerMemory = 64u << 20;

// Serves `services` (not owned; they must outlive the server) on the unix socket `path`, mode
// kSocketMode, replacing whatever file is there. Unavailable naming the path when it cannot bind,
// chmod or rename.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartUnixServer(
    const std::string& path, const std::vector<grpc::Service*>& services);

// A client channel on a unix socket path that never shares subchannels (no reconnect backoff
// inherited from an earlier connection to the same path).
std::shared_ptr<grpc::Channel> UnixChannel(const std::string& path);

}  // namespace rdp::serving
