#pragma once

// Hand-built topologies for the allocator tests: plain Topology values, no discovery.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace rdp::allocator::testing {

// Builds a node device by device. Addresses are "0000:<bus>:00.0" with the bus in hex.
class NodeBuilder {
 public:
  // A host bridge with its root port; returns the root's index for the calls below.
  int Root(std::optional<int> numa) {
    roots_.push_back({numa, "pci0000:" + Hex(next_bus_), Bridge(next_bus_, "")});
    next_bus_ += 0x10;
    return static_cast<int>(roots_.size()) - 1;
  }
  // A PCIe switch below a root (parent_switch -1) or below another switch; returns its index.
  int Switch(int root, int parent_switch = -1) {
    std::vector<topology::Bridge> chain =
        parent_switch < 0 ? std::vector<topology::Bridge>{roots_[root].port}
                          : switches_[parent_switch].chain;
    std::string upstream = Addr(next_bus_++);
    std::string downstream_parent = parent_switch < 0 ? "" : switches_[parent_switch].id;
    if (parent_switch >= 0) chain.push_back(Bridge(next_bus_++, downstream_parent));
    chain.push_back({upstream, upstream});
    switches_.push_back({root, upstream, chain});
    return static_cast<int>(switches_.size()) - 1;
  }
  // An HCA under a switch (sw >= 0) or directly on the root's port (sw -1).
  std::string Hca(int root, int sw, std::string rate = "400 Gb/sec (4X NDR)",
                  int ports = 1, int active_ports = 1) {
    topology::Hca hca;
    hca.name = "mlx5_" + std::to_string(hcas_.size());
    hca.place = Place(root, sw);
    for (int p = 1; p <= ports; ++p) {
      hca.ports.push_back({p, p <= active_ports ? "ACTIVE" : "DOWN", "", "InfiniBand", rate});
    }
    hcas_.push_back(hca);
    return hca.place.pci;
  }
  std::string Gpu(int root, int sw) {
    topology::Gpu gpu;
    gpu.place = Place(root, sw);
    gpu.vendor = "10de";
    gpu.device = "2330";
    gpus_.push_back(gpu);
    return gpu.place.pci;
  }
  topology::TopologyPtr Build() const {
    std::vector<int> numa;
    for (const RootInfo& r : roots_) {
      if (r.numa) numa.push_back(*r.numa);
    }
    return std::make_shared<const topology::Topology>(numa, hcas_, gpus_);
  }

 private:
  struct RootInfo {
    std::optional<int> numa;
    std::string name;
    topology::Bridge port;
  };
  struct SwitchInfo {
    int root;
    std::string id;
    std::vector<topology::Bridge> chain;  // root port .. upstream port
  };

  static std::string Hex(int bus) {
    static const char* kDigits = "0123456789abcdef";
    return std::string{kDigits[(bus >> 4) & 15], kDigits[bus & 15]};
  }
  static std::string Addr(int bus) { return "0000:" + Hex(bus) + ":00.0"; }
  static topology::Bridge Bridge(int bus, std::string sw) { return {Addr(bus), std::move(sw)}; }

  topology::PciPlacement Place(int root, int sw) {
    topology::PciPlacement place;
    place.numa = roots_[root].numa;
    place.pcie_root = roots_[root].name;
    place.bridges_known = true;
    if (sw < 0) {
      place.bridges = {roots_[root].port};
    } else {
      place.bridges = switches_[sw].chain;
      place.bridges.push_back(Bridge(next_bus_++, switches_[sw].id));  // downstream port
    }
    place.pci = Addr(next_bus_++);
    return place;
  }

  int next_bus_ = 0x10;
  std::vector<RootInfo> roots_;
  std::vector<SwitchInfo> switches_;
  std::vector<topology::Hca> hcas_;
  std::vector<topology::Gpu> gpus_;
};

// The shape of dgx-h100-like.xml: 2 NUMA nodes, 4 roots each with one switch holding 2 GPUs and
// 2 HCAs, plus one HCA alone on a fifth root (NUMA 1). Addresses ascend in this order:
// switch 0 (GPU, GPU, HCA, HCA), switch 1, ..., the lone HCA.
struct Dgx {
  topology::TopologyPtr topology;
  std::vector<std::vector<std::string>> switch_gpus;  // per switch
  std::vector<std::vector<std::string>> switch_hcas;  // per switch
  std::string lone_hca;
  std::vector<std::string> all_hcas;
  std::vector<std::string> all_gpus;
};

inline Dgx MakeDgx(std::vector<std::string> slow_hcas_by_position = {}) {
  NodeBuilder b;
  Dgx d;
  d.switch_gpus.resize(4);
  d.switch_hcas.resize(4);
  int position = 0;
  for (int s = 0; s < 4; ++s) {
    int root = b.Root(s / 2);
    int sw = b.Switch(root);
    for (int i = 0; i < 2; ++i) d.switch_gpus[s].push_back(b.Gpu(root, sw));
    for (int i = 0; i < 2; ++i, ++position) {
      bool slow = false;
      for (const std::string& p : slow_hcas_by_position) slow |= p == std::to_string(position);
      d.switch_hcas[s].push_back(b.Hca(root, sw, slow ? "200 Gb/sec (4X HDR)" : "400 Gb/sec"));
    }
  }
  d.lone_hca = b.Hca(b.Root(1), -1);
  d.topology = b.Build();
  for (const auto& hs : d.switch_hcas) d.all_hcas.insert(d.all_hcas.end(), hs.begin(), hs.end());
  d.all_hcas.push_back(d.lone_hca);
  for (const auto& gs : d.switch_gpus) d.all_gpus.insert(d.all_gpus.end(), gs.begin(), gs.end());
  return d;
}

}  // namespace rdp::allocator::testing
