#pragma once

#include "CLI/CLI.hpp"

namespace rdp::cmd {

// `rdma-device-plugin [serve]`: run the device plugin until SIGTERM/SIGINT (exit 0). Bad flags:
// one message, exit 2. Discovery or serving failure at start: exit 1.
void AddServeCommand(CLI::App& app);

}  // namespace rdp::cmd
