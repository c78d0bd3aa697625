#pragma once

#include "CLI/CLI.hpp"

namespace rdp::cmd {

// `rdma-device-plugin topology [--json|--dot]`: the node's HCA x GPU matrix.
void AddTopologyCommand(CLI::App& app);

}  // namespace rdp::cmd
