#pragma once

#include "CLI/CLI.hpp"

namespace rdp::cmd {

// `rdma-device-plugin probe`: exit 0 when the plugin answers GetDevicePluginOptions on
// <kubelet-dir>/<socket-name> within --timeout (1s), 1 otherwise. The Helm chart's exec probe.
void AddProbeCommand(CLI::App& app);

}  // namespace rdp::cmd
