#pragma once

// The device plugin's resource model, as pure functions: which devices ListAndWatch advertises.
// No I/O, no locks, no protobuf.

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hca/hca.h"

namespace rdp::deviceplugin {

// One advertised device.
struct DeviceState {
  std::string id;
  bool healthy = false;
  std::optional<int> numa;  // TopologyInfo; nullopt: none reported
  bool operator==(const DeviceState& o) const {
    return id == o.id && healthy == o.healthy && numa == o.numa;
  }
};

// Exclusive mode: one device per HCA, ID = PCI address, in PCI order. Healthy iff present,
// healthy and not withheld. NUMA is reported for every device or, when any is unknown, for none.
std::vector<DeviceState> ExclusiveDevices(const std::vector<hca::AdvertisedHca>& hcas,
                                          const std::set<std::string>& withheld);

// Shared mode: `count` interchangeable IDs "shared-0".."shared-<count-1>", all Healthy iff at
// least one HCA is present, healthy and not withheld; no TopologyInfo. No device at all when the
// node has no HCA (a CPU-only node advertises no rdma/hca).
std::vector<DeviceState> SharedDevices(int count, const std::vector<hca::AdvertisedHca>& hcas,
                                       const std::set<std::string>& withheld);

// The shared-mode IDs, as allocator::SharedId and SharedIndex define them.
std::string SharedId(int index);
// True for "shared-<n>" with 0 <= n < count, written canonically (allocator::SharedIndex).
bool IsSharedId(std::string_view id, int count);

}  // namespace rdp::deviceplugin
