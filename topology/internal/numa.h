#pragma once

// Internal to topology/: which NUMA nodes have CPUs, and which one a device sits on.
//
// A node of memory alone (a GPU's memory on Grace, the empty nodes its driver keeps for MIG
// partitions, CXL or HBM memory) never has a device on it and is never told to the kubelet: a
// device's NUMA node is the node with CPUs that its locality names.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "topology/topology.h"

namespace rdp::topology {

// Whether hwloc's subtype of a NUMA node names memory that has no CPUs: GPUMemory (NVIDIA GPU
// memory over NVLink-C2C), MCDRAM, HBM, NVM, SPM and every CXL-* kind. ("DRAM" is not one.)
bool IsMemoryOnlyKind(std::string_view subtype);

// The kernel's NUMA nodes, read through `env`: node<N> of /sys/devices/system/node with its
// cpulist ("" for a node without CPUs). Empty when the directory is not there (an XML alone).
std::map<int, std::string> ReadKernelNumaNodes(Env& env);

// /sys/bus/pci/devices/<pci>/numa_node when it is an integer >= 0.
std::optional<int> ReadKernelPciNuma(Env& env, const std::string& pci);

// hwloc's NUMA nodes, corrected by the kernel's where it lists them: a node the kernel lists has
// CPUs exactly when its cpulist is not empty, and the kernel's cpulist replaces hwloc's. Nodes
// only the kernel lists are added. By id.
std::vector<NumaNode> MergeNumaNodes(std::vector<NumaNode> hwloc,
                                     const std::map<int, std::string>& kernel);

// The ids of the nodes without CPUs, ascending.
std::vector<int> CpulessIds(const std::vector<NumaNode>& nodes);

// A device's NUMA node: the kernel's numa_node when it is not a node without CPUs, else the one
// node of its locality (the nodes hwloc finds local to it) that is not in `cpuless` (sorted);
// nullopt when there is none or several.
std::optional<int> DeviceNuma(std::optional<int> kernel, const std::vector<int>& locality,
                              const std::vector<int>& cpuless);

}  // namespace rdp::topology
