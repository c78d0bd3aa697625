#pragma once

// `rdma-device-plugin nri`: the NRI plugin that raises RLIMIT_MEMLOCK for containers holding one
// of our devices (nri/plugin.h). Exit 2 for a bad flag (the message names it), 1 when it cannot
// start, 0 after SIGTERM/SIGINT.

#include "CLI/CLI.hpp"

namespace rdp::cmd {

void AddNriCommand(CLI::App& app);

}  // namespace rdp::cmd
