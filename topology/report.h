#pragma once

// Human and machine renderings of a snapshot, for `rdma-device-plugin topology`.

#include <string>

#include "nlohmann/json.hpp"
#include "topology/topology.h"

namespace rdp::topology {

// The snapshot in the documented JSON schema (keys in schema order, null where unknown, arrays
// in PCI-address order):
// {"numa_nodes":[..] (those with CPUs), "gpus":[{pci,vendor,numa,pcie_root,switch}],
//  "hcas":[{name,pci,numa,pcie_root,switch,uverbs,ports:[{port,state,link_layer}],healthy,
//           vendor,device,driver,firmware_version,node_guid,vf (bool),pf (the PF's address on a
//           VF, null otherwise)}],
//  "paths":{"<hca name>":{"<gpu pci>":"PIX"}}}
nlohmann::ordered_json ToJson(const Topology& topology);

// A matrix like `nvidia-smi topo -m`: rows HCAs (a VF's row ends "(VF of <PF address>)"),
// columns GPUs, then NUMA and PCIe-root columns,
// a GPU index, the NUMA nodes (with their CPUs, and those without) and a legend.
std::string RenderMatrix(const Topology& topology);

// Graphviz: NUMA nodes contain PCIe roots, roots contain switches, devices hang below.
std::string RenderDot(const Topology& topology);

}  // namespace rdp::topology
