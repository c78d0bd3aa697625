#pragma once

#include "CLI/CLI.hpp"

namespace rdp::cmd {

// `rdma-device-plugin fixture --topology-xml X --out DIR`: lays out fake sysfs and /dev trees
// for every HCA of a node export under DIR (as topology/sysfs_fixture.h documents), so the
// plugin, its tests and the kubelet conformance harness can run against a node that is not this
// machine: pass DIR as --sysfs-root and --dev-root. Hidden from --help: a testing aid.
void AddFixtureCommand(CLI::App& app);

}  // namespace rdp::cmd
