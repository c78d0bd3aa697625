#pragma once

// ResourceSlice objects (resource.k8s.io/v1) for one node's pool, from device objects. Pure.

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace rdp::dra {

// resource.k8s.io/v1 allows 128 devices per slice, 64 when any device has taints or consumes
// counters (ResourceSliceMaxDevicesWithTaintsOrConsumesCounters); ours may carry taints.
inline constexpr std::size_t kMaxDevicesPerSlice = 64;

struct PoolMeta {
  std::string driver;     // spec.driver
  std::string node_name;  // spec.nodeName; also the pool's name
  std::string node_uid;   // the Node's metadata.uid for the ownerReference; "" = none
  std::int64_t generation = 1;
};

// The pool's slices: `devices` (resource.k8s.io/v1 Device objects) in order, at most
// kMaxDevicesPerSlice per slice, named "<node>-<driver>-<index>" (shortened to 253 characters),
// spec.pool {name: node, generation, resourceSliceCount}. No device: no slice.
std::vector<nlohmann::json> BuildResourceSlices(const std::vector<nlohmann::json>& devices,
                                                const PoolMeta& meta);

}  // namespace rdp::dra
