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

// hwloc reads its environment at every load, and writing the environment while other threads
// run is unsafe. So every variable is written before threads start: before main(), in every
// program that links this file, dynamic plugins go off (the same XML parser and PCI discovery
// whether or not libhwloc-plugins is installed) and inherited variables that would replace the
// source of topology are removed; UseHwlocRoot sets the one that depends on flags.

// Sets HWLOC_FSROOT to a gathered tree's root (fsroot non-empty and not "/"), or removes it.
// Writes the environment: call it before threads start. NotFound naming the root when it has no
// sys/ directory.
absl::Status UseHwlocRoot(const std::string& fsroot);

// Loads from an XML file when xml is non-empty (checked first in a child process: a crash or
// hang of hwloc there is an error naming the file); else from the live machine, or from a
// gathered tree when fsroot is non-empty and not "/" (FailedPrecondition unless UseHwlocRoot
// set that root). Never writes the environment. Errors name the file or root.
absl::StatusOr<HwlocTree> LoadHwlocTree(const std::string& xml, const std::string& fsroot);

}  // namespace rdp::topology
