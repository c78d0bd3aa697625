#pragma once

// `rdma-device-plugin probe`: is the plugin answering on its socket? Used by the Helm chart as
// the liveness/readiness exec probe.

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace rdp::deviceplugin {

// Calls GetDevicePluginOptions on the unix socket at socket_path with the given deadline. OK when
// it answers; Unavailable / DeadlineExceeded naming the socket otherwise.
absl::Status Probe(const std::string& socket_path, absl::Duration timeout);

}  // namespace rdp::deviceplugin
