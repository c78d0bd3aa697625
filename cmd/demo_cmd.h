#pragma once

#include "CLI/CLI.hpp"

namespace rdp::cmd {

// `rdma-device-plugin demo`: the plugin against the bundled node fixture and a built-in kubelet
// simulator in a temporary directory; prints registration, devices and allocations; exit 0.
void AddDemoCommand(CLI::App& app);

}  // namespace rdp::cmd
