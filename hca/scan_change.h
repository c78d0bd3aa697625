#pragma once

// What a health scan (topology::ReadSysfsHcas) says about a snapshot of the node, for both
// doors' health polls: nothing, a change of state that is patched into the snapshot, or a
// change of the set of PCI functions that only a full discovery can place. A flapping link
// costs a patch, never a hwloc discovery. Pure functions.

#include <string>
#include <vector>

#include "topology/topology.h"

namespace rdp::hca {

enum class ScanChange {
  kNone,       // the same HCAs in the same state (topology::HcaFingerprint equal)
  kState,      // the same PCI functions in another state (a port going DOWN or ACTIVE, a device
               // node, a name after a driver rebind): WithScannedState
  kFunctions,  // PCI functions came or went (a hotplug): discover the node again
};
ScanChange CompareScan(const std::vector<topology::Hca>& known,
                       const std::vector<topology::Hca>& scanned);

// The HCAs' PCI addresses, sorted and joined: equal for two lists of the same PCI functions.
std::string PciFunctions(const std::vector<topology::Hca>& hcas);

// `snapshot` with each HCA's scanned state (name, uverbs, umad, issm, netdevs, ports, device
// nodes) in place of its own; the placement (NUMA node, PCIe tree), the NUMA nodes (those
// without CPUs too) and the GPUs kept. HCAs matched by PCI address; a scanned HCA the snapshot
// lacks is left out.
topology::TopologyPtr WithScannedState(const topology::Topology& snapshot,
                                       const std::vector<topology::Hca>& scanned);

}  // namespace rdp::hca
