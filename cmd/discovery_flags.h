#pragma once

// The discovery flags every subcommand that looks at the node shares (serve, topology, check):
// --sysfs-root, --dev-root, --topology-xml, --gpu-classes, --gpu-vendors, --log-level.
// Each also reads an environment variable (RDP_SYSFS_ROOT, ...), as DaemonSets set them.

#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "topology/discovery.h"

namespace rdp::cmd {

struct DiscoveryFlags {
  std::string sysfs_root;
  std::string dev_root = "/";
  std::string topology_xml;
  std::string gpu_classes = "0x0302,0x0300,0x0380,0x1200";
  std::string gpu_vendors = "10de,1002";
  std::string log_level = "info";

  // Registers the flags on a subcommand.
  void Register(CLI::App* app);
  // Validated options; InvalidArgument naming the flag on a bad value. Also applies --log-level
  // and sets hwloc's root for them (topology::PrepareHwloc): call it before starting threads.
  absl::StatusOr<topology::DiscoveryOptions> Options() const;
  // Options() then Discover(); on failure logs once and ends the subcommand (exit 2 for a bad
  // flag, 1 when discovery fails).
  topology::TopologyPtr DiscoverOrExit() const;
};

// Exit code for bad flags and configuration, as every subcommand uses it.
inline constexpr int kExitUsage = 2;

// Ends a subcommand's callback with an exit code (CLI11's idiom; main turns it into the code).
[[noreturn]] void Exit(int code);

}  // namespace rdp::cmd
