#pragma once

#include "CLI/CLI.hpp"

namespace rdp::cmd {

// `rdma-device-plugin dra [flags]`: run the DRA driver's kubelet side (the DRAPlugin and
// registration sockets) until SIGTERM/SIGINT (exit 0), when no sub-subcommand of `dra` (such as
// `dra slices`) was given. Also adds the hidden `dra prepare-local`. Bad flags: one message,
// exit 2; discovery, checkpoint or serving failure at start: exit 1.
void AddDraServeFlags(CLI::App* dra);

}  // namespace rdp::cmd
