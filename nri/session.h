#pragma once

// One connection to the runtime, as bytes in and bytes out (no socket here: nri/plugin.h owns
// it). The plugin is a ttrpc client on kRuntimeServiceConn, where it calls RegisterPlugin, and a
// ttrpc server on kPluginServiceConn, where the runtime calls the Plugin service (PluginService).
// Not thread-safe: one connection thread drives it.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "nri/service.h"
#include "nri/wire.h"

namespace rdp::nri {

// How the plugin introduces itself to the runtime.
struct Registration {
  std::string name = "rdma-device-plugin";  // [a-zA-Z0-9_.+-]+
  std::string index = "50";                 // two digits: the order among plugins
};

// InvalidArgument naming --nri-plugin-name or --nri-plugin-index when the runtime would refuse
// them (its own checks: a non-empty name of [a-zA-Z0-9_.+-], an index of exactly two digits).
absl::Status ValidateRegistration(const Registration& r);

class Session {
 public:
  // `service` must outlive the session.
  Session(Registration registration, PluginService& service)
      : registration_(std::move(registration)), service_(service) {}

  // The bytes that open the connection: the RegisterPlugin call.
  std::string Open();

  // Takes bytes read from the trunk and appends what to send back to `out` (answers to the
  // runtime's calls). An error means the connection cannot go on (a protocol violation, or the
  // runtime refused the registration) and must be closed; `out` may still hold answers.
  absl::Status OnBytes(std::string_view in, std::string* out);

  bool registered() const { return registered_; }

 private:
  absl::Status OnMessage(std::uint32_t conn, const TtrpcMessage& m, std::string* out);
  void Answer(std::uint32_t stream_id, const CallResult& result, std::string* out);

  const Registration registration_;
  PluginService& service_;
  TrunkDecoder decoder_;
  bool registered_ = false;
  std::uint32_t last_stream_ = 0;  // the runtime's last request stream ID (they must increase)
};

}  // namespace rdp::nri
