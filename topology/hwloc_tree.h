#pragma once

// The PCI tree as hwloc sees it, reduced to plain data. The only place that includes hwloc.h is
// hwloc_tree.cc; nothing hwloc leaves topology/.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/topology.h"

namespace rdp::topology {

struct HwlocPciDevice {
  PciPlacement place;
  std::uint32_t class_id = 0;  // 0x0302
  std::uint32_t vendor = 0;
  std::uint32_t device = 0;
};

struct HwlocTree {
  std::vector<int> numa_nodes;
  std::vector<HwlocPciDevice> pci;  // every PCI function, with its placement
  std::vector<Hca> openfabrics;     // HCAs from OpenFabrics OS devices (XML exports)
};

// Loads from an XML file when xml is non-empty; else from the live machine, or from a gathered
// tree when fsroot is non-empty and not "/". Errors name the file or root.
absl::StatusOr<HwlocTree> LoadHwlocTree(const std::string& xml, const std::string& fsroot);

}  // namespace rdp::topology
