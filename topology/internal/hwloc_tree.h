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
  PciPlacement place;          // numa: DeviceNuma of locality, by the tree's nodes alone
  std::vector<int> locality;   // the NUMA nodes local to it (its first non-I/O ancestor's
                               // nodeset), those without CPUs included; ascending
  std::uint32_t class_id = 0;  // 0x0302
  std::uint32_t vendor = 0;
  std::uint32_t device = 0;
};

struct HwlocTree {
  // Every NUMANode object. hwloc has no flag for a node without CPUs: a node's cpuset is its
  // locality (its parent's), the same for a Grace socket's CPU node and for the GPU memory beside
  // it. So a node has none when its complete cpuset is empty, when its subtype names memory
  // alone (IsMemoryOnlyKind), or when every CPU of its cpuset belongs to nodes with CPUs attached
  // below its parent: hwloc attaches a node with CPUs to the smallest object that holds them and
  // the CPUs of nodes never overlap on Linux, so a node attached above the others' CPUs was
  // attached by something else (the Machine, for the nodes a Grace GPU's driver keeps for MIG
  // partitions, or for CXL memory). cpus: hwloc_bitmap_list of the cpuset of a node with CPUs.
  std::vector<NumaNode> numa_nodes;
  std::vector<HwlocPciDevice> pci;  // every PCI function, with its placement
  std::vector<Hca> openfabrics;     // HCAs from OpenFabrics OS devices (XML exports)
  // The locality of each of openfabrics' PCI functions (HwlocPciDevice::locality), in its order:
  // an export may hold two functions with one address (test/data's 32em64t-2n8c2t-pci-normalio).
  std::vector<std::vector<int>> openfabrics_locality;
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
