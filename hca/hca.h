#pragma once

// The plugin's resource model, as pure functions: which devices ListAndWatch advertises and
// what Allocate gives a container. No I/O, no locks, no protobuf.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace rdp::server {

// One advertised device.
struct DeviceState {
  std::string id;
  bool healthy = false;
  std::optional<int> numa;  // TopologyInfo; nullopt: none reported
  bool operator==(const DeviceState& o) const {
    return id == o.id && healthy == o.healthy && numa == o.numa;
  }
};

// What the plugin knows of an HCA it has ever advertised (vanished ones included, until
// forgotten).
struct HcaHealth {
  std::string pci;
  std::string name;
  std::optional<int> numa;
  bool present = false;  // in the latest scan
  bool healthy = false;  // Assess(...).usable in the latest scan
  int absent_polls = 0;  // consecutive scans without it
};

// Whether an HCA can be handed to a container, and if not, why. The one definition of a healthy
// HCA: at least one port and every port ACTIVE, a uverbs device, and every device node it has
// (uverbsN, and umadN/issmN where the node has them) present, as the scan saw them.
struct Verdict {
  bool usable = false;
  std::string reason;  // "" when usable; else e.g. "port 1 is DOWN"
};
Verdict Assess(const topology::Hca& hca);
inline bool HcaUsable(const topology::Hca& hca) { return Assess(hca).usable; }

// Exclusive mode: one device per HCA, ID = PCI address, in PCI order. Healthy iff present,
// healthy and not withheld. NUMA is reported for every device or, when any is unknown, for none.
std::vector<DeviceState> ExclusiveDevices(const std::vector<HcaHealth>& hcas,
                                          const std::set<std::string>& withheld);

// Shared mode: `count` interchangeable IDs "shared-0".."shared-<count-1>", all Healthy iff at
// least one HCA is present, healthy and not withheld; no TopologyInfo. No device at all when the
// node has no HCA (a CPU-only node advertises no rdma/hca).
std::vector<DeviceState> SharedDevices(int count, const std::vector<HcaHealth>& hcas,
                                       const std::set<std::string>& withheld);

std::string SharedId(int index);
// True for "shared-<n>" with 0 <= n < count, written canonically (no sign, no leading zeros).
bool IsSharedId(const std::string& id, int count);

// What Allocate returns for one container, before it becomes protobuf.
struct ContainerAllocation {
  struct Spec {
    std::string container_path;
    std::string host_path;
    std::string permissions;
  };
  std::vector<Spec> devices;
  std::map<std::string, std::string> envs;
};

// DeviceSpecs ("rw", host path = container path) for each of the HCA's device nodes that is
// present in its char_devices (uverbsN, umadN, issmN, in that order), then
// /dev/infiniband/rdma_cm when with_rdma_cm; envs NCCL_IB_HCA ("=a,b": NCCL's exact-match form),
// RDMA_HCA_NAMES ("a,b") and RDMA_HCA_PCI, in the order given.
ContainerAllocation BuildAllocation(const std::vector<const topology::Hca*>& hcas,
                                    bool with_rdma_cm);

}  // namespace rdp::server
