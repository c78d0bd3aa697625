#pragma once

// Reads where the kernel places a PCI function, exactly as the upstream helpers of
// k8s.io/dynamic-resource-allocation/deviceattribute (v0.37.2) do, so that the standard
// attributes we publish equal those of a driver built on them for the same device.
//
// Why not the snapshot's placement: discovery takes pcie_root from hwloc's host bridge and, when
// the kernel's numa_node is -1, a NUMA node inferred by hwloc from the device's local CPUs. The
// helpers read only the kernel: the first component under /sys/devices of the device's
// /sys/bus/pci/devices link, and numa_node (no attribute when -1, as on most single-socket
// machines). On a machine where the two differ, a claim pairing our HCA with a GPU by
// matchAttribute would be unsatisfiable.

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "base/env.h"
#include "dra/devices.h"
#include "topology/topology.h"

namespace rdp::dra {

// Whether the helpers accept `pci` as a bus ID: ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$.
// They refuse every standard attribute otherwise (a 5-digit VMD domain, upper case).
bool IsStandardBdf(std::string_view pci);

// The kernel's placement of `pci`, read through `env`:
//   pcie_root: the first component under /sys/devices of /sys/bus/pci/devices/<pci> resolved
//              (GetPCIeRootAttributeByPCIBusID);
//   numa: /sys/bus/pci/devices/<pci>/numa_node when it is an integer >= 0
//         (GetNUMANodeAttributeByPCIBusID, scalar form).
// nullopt when IsStandardBdf(pci) is false or the link is missing or does not resolve to
// /sys/devices/pci*/.../<pci> (the helpers then fail and a driver publishes no pcieRoot).
std::optional<KernelPci> ReadKernelPci(Env& env, std::string_view pci);

// ReadKernelPci for every HCA of `topo` that has a kernel placement, by PCI address: what
// DeviceOptions::kernel wants.
std::map<std::string, KernelPci> ReadKernelPci(Env& env, const topology::Topology& topo);

}  // namespace rdp::dra
