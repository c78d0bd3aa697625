#pragma once

// `rdma-device-plugin check`: its flags. What it does is check/container_check.h.

#include "CLI/CLI.hpp"

namespace rdp::cmd {

void AddCheckCommand(CLI::App& app);

}  // namespace rdp::cmd
