#pragma once

// Hand-built nodes as plain Topology values (no discovery), for the tests and the benchmarks.
//
// NodeBuilder builds a node device by device; BuildNode builds one from a spec of roots and
// switches; the named shapes below are the ones the allocator's tests, benchmarks and quality
// simulator share. Addresses are "dddd:bb:00.0", one bus per bridge or device, ascending in the
// order things are added (past bus ff, the next domain), so that the lowest-PCI-address
// tie-break follows the order of construction.

#include <optional>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace rdp::testing {

class NodeBuilder {
 public:
  // A host bridge with its root port; returns the root's index for the calls below.
  int Root(std::optional<int> numa);
  // A PCIe switch below a root's port (parent_switch -1) or below a downstream port of another
  // switch; returns its index.
  int Switch(int root, int parent_switch = -1);
  // An HCA under a switch's downstream port (sw >= 0) or directly on the root's port (sw -1),
  // with `ports` ports of which the first `active_ports` are ACTIVE.
  std::string Hca(int root, int sw, std::string rate = "400 Gb/sec (4X NDR)", int ports = 1,
                  int active_ports = 1);
  std::string Gpu(int root, int sw);
  topology::TopologyPtr Build() const;

 private:
  struct RootInfo {
    std::optional<int> numa;
    std::string name;  // "pci0000:10"
    topology::Bridge port;
  };
  struct SwitchInfo {
    std::string id;
    std::vector<topology::Bridge> chain;  // root port .. upstream port
  };
  std::string NextAddr();
  topology::PciPlacement Place(int root, int sw);

  int domain_ = 0;
  int bus_ = 0x10;
  std::vector<RootInfo> roots_;
  std::vector<SwitchInfo> switches_;
  std::vector<topology::Hca> hcas_;
  std::vector<topology::Gpu> gpus_;
};

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
  int lone_hcas = 0;  // HCAs beside the switches, under no leaf switch (storage / frontend NICs)
};

// Builds the node; addresses ascend in spec order (GPUs before HCAs within a switch).
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
// Eight GPUs, four HCAs: per NUMA node, one root with a switch of 2 GPUs + 1 HCA and one root
// with a switch of 2 GPUs and an HCA on the root port beside it.
topology::TopologyPtr FewerHcasThanGpus();

std::vector<std::string> HcaIds(const topology::Topology& t);
std::vector<std::string> GpuIds(const topology::Topology& t);

}  // namespace rdp::testing
