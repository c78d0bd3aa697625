#pragma once

#include "CLI/CLI.hpp"

namespace rdp::cmd {

// `rdma-device-plugin demo ...` and `rdma-device-plugin fixture ...` (hidden from --help): the
// development tools, which are not in this binary. Each runs rdma-device-plugin-sim from this
// binary's directory (where the build puts it) with the same subcommand and arguments, in place
// of this process (exec: its output and exit code are the command's). Where it is absent, as in
// the image, exits kExitUsage saying that these tools are not shipped.
void AddDevToolCommands(CLI::App& app);

}  // namespace rdp::cmd
