#pragma once

// The error counters of an HCA's ports that early-warning health watches (hca/early_warning.h):
// sysfs ports/<n>/counters/symbol_error (minor link errors on the physical lanes) and link_downed
// (times the link went down after failing to recover), read through rdp::Env.

#include <cstdint>
#include <map>
#include <optional>

#include "base/env.h"
#include "topology/topology.h"

namespace rdp::topology {

struct PortErrors {
  std::optional<std::uint64_t> symbol_error;  // nullopt: the driver provides none (or garbage)
  std::optional<std::uint64_t> link_downed;
};

// The counters of each of `hca`'s ports, by port number, read now from
// /sys/class/infiniband/<name>/ports/<n>/counters/.
std::map<int, PortErrors> ReadPortErrors(Env& env, const Hca& hca);

}  // namespace rdp::topology
