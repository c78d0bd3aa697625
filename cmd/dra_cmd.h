#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

#include "CLI/CLI.hpp"

namespace rdp::cmd {

// Registers `rdma-device-plugin dra` and its `slices` subcommand:
//   dra slices [discovery flags] [--node-name N] [--driver-name D] [--mode exclusive|shared]
//              [--shared-devices U]
// prints this node's ResourceSlices (generation 1, no owner) as a JSON v1 List, without an API
// server: what the driver would publish. Exit 2 for a bad flag (the message names it), 1 when
// discovery fails.
// Returns the `dra` App, which has no callback of its own and requires a subcommand: the DRA
// driver's serving mode adds its flags and callback there (and relaxes that requirement).
CLI::App* AddDraCommand(CLI::App& app);

// The node name the kubelet takes by default: the host name, lower-cased (a Node's name is a
// DNS subdomain); "" when the host name cannot be read. `dra`, `dra slices` and `dra
// prepare-local` use it when neither --node-name nor NODE_NAME is given.
std::string HostNodeName();

// The value of --shared-devices for `dra` and `dra slices` (the claims one shared-mode HCA serves
// at most: its `pods` capacity): `units` when it is 1..resources::kMaxSharedDevices, as the
// device plugin's flag of that name; else InvalidArgument naming the flag.
absl::StatusOr<std::int64_t> SharedUnitsFlag(int units);

}  // namespace rdp::cmd
