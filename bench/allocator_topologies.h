#pragma once

// Synthetic nodes for the allocator benchmarks and the quality simulator, built by hand as plain
// Topology values (no discovery).

#include <string>
#include <vector>

#include "topology/topology.h"

namespace rdp::bench {

// One PCIe switch: how many GPUs and HCAs hang under it.
struct SwitchSpec {
  int gpus = 2;
  int hcas = 2;
};

// One host bridge. With `top_switch`, all of its switches sit below one shared top-level switch
// (two-level switching, as in DGX-2-like trees); otherwise each hangs off the root port.
struct RootSpec {
  int numa = 0;
  bool top_switch = false;
  std::vector<SwitchSpec> switches;
  int lone_hcas = 0;  // HCAs on the root port itself, under no switch (storage / frontend NICs)
};

// Builds the node; addresses ascend in spec order.
topology::TopologyPtr BuildNode(const std::vector<RootSpec>& roots);

// dgx-h100-like.xml by hand: 2 NUMA nodes, 4 roots with one switch of 2 GPUs + 2 HCAs each, and
// one lone HCA on a fifth root (NUMA 1).
topology::TopologyPtr DgxH100Like();
// The same shape scaled to `hcas` HCAs (hcas / 2 switches, 2 GPUs + 2 HCAs each, 2 NUMA nodes).
topology::TopologyPtr ScaledDgx(int hcas);
// Every HCA alone on its own switch with one GPU: no two HCAs interchangeable (the search's
// worst case).
topology::TopologyPtr DistinctHcas(int hcas);
// Two NUMA nodes, two roots each with a top switch over two leaf switches of 2 GPUs + 1 HCA
// (PIX within a leaf, PXB across leaves of one top switch, NODE across roots).
topology::TopologyPtr TwoLevelSwitches();
// Four NUMA nodes, one root each with 2 switches of 2 GPUs + 1 HCA.
topology::TopologyPtr FourNuma();
// Eight GPUs, four HCAs: per NUMA node, one root with a switch of 2 GPUs + 1 HCA and one root
// with a switch of 2 GPUs and an HCA on the root port beside it.
topology::TopologyPtr FewerHcasThanGpus();

std::vector<std::string> HcaIds(const topology::Topology& t);
std::vector<std::string> GpuIds(const topology::Topology& t);

}  // namespace rdp::bench
