#include "test/support/node_builder.h"

#include <cstdio>
#include <memory>

namespace rdp::testing {

std::string NodeBuilder::NextAddr() {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:00.0", domain_, bus_);
  if (++bus_ == 0x100) {
    bus_ = 0;
    ++domain_;
  }
  return buf;
}

int NodeBuilder::Root(std::optional<int> numa) {
  const std::string host = NextAddr();
  roots_.push_back({numa, "pci" + host.substr(0, 7), {NextAddr(), ""}});
  return static_cast<int>(roots_.size()) - 1;
}

int NodeBuilder::Switch(int root, int parent_switch) {
  std::vector<topology::Bridge> chain;
  if (parent_switch < 0) {
    chain = {roots_[root].port};
  } else {
    chain = switches_[parent_switch].chain;
    chain.push_back({NextAddr(), switches_[parent_switch].id});  // the parent's downstream port
  }
  const std::string upstream = NextAddr();
  chain.push_back({upstream, upstream});
  switches_.push_back({upstream, std::move(chain)});
  return static_cast<int>(switches_.size()) - 1;
}

topology::PciPlacement NodeBuilder::Place(int root, int sw) {
  topology::PciPlacement place;
  place.numa = roots_[root].numa;
  place.pcie_root = roots_[root].name;
  place.bridges_known = true;
  if (sw < 0) {
    place.bridges = {roots_[root].port};
  } else {
    place.bridges = switches_[sw].chain;
    place.bridges.push_back({NextAddr(), switches_[sw].id});  // the switch's downstream port
  }
  place.pci = NextAddr();
  return place;
}

std::string NodeBuilder::Hca(int root, int sw, std::string rate, int ports, int active_ports) {
  topology::Hca hca;
  hca.name = "mlx5_" + std::to_string(hcas_.size());
  hca.place = Place(root, sw);
  for (int p = 1; p <= ports; ++p) {
    const bool active = p <= active_ports;
    hca.ports.push_back(
        {p, active ? "ACTIVE" : "DOWN", active ? "LinkUp" : "Disabled", "InfiniBand", rate});
  }
  hcas_.push_back(hca);
  return hca.place.pci;
}

std::string NodeBuilder::Gpu(int root, int sw) {
  topology::Gpu gpu;
  gpu.place = Place(root, sw);
  gpu.vendor = "10de";
  gpu.device = "2330";
  gpus_.push_back(gpu);
  return gpu.place.pci;
}

topology::TopologyPtr NodeBuilder::Build() const {
  std::vector<int> numa;
  for (const RootInfo& r : roots_) {
    if (r.numa) numa.push_back(*r.numa);
  }
  return std::make_shared<const topology::Topology>(numa, hcas_, gpus_);
}

topology::TopologyPtr BuildNode(const std::vector<RootSpec>& roots) {
  NodeBuilder b;
  for (const RootSpec& spec : roots) {
    const int root = b.Root(spec.numa);
    const int top = spec.top_switch ? b.Switch(root) : -1;
    for (const SwitchSpec& s : spec.switches) {
      const int sw = b.Switch(root, top);
      for (int g = 0; g < s.gpus; ++g) b.Gpu(root, sw);
      for (int h = 0; h < s.hcas; ++h) b.Hca(root, sw);
    }
    for (int h = 0; h < spec.lone_hcas; ++h) b.Hca(root, top);
  }
  return b.Build();
}

topology::TopologyPtr DgxH100Like() {
  std::vector<RootSpec> roots;
  for (int i = 0; i < 4; ++i) roots.push_back({i / 2, false, {{2, 2}}, 0});
  roots.push_back({1, false, {}, 1});
  return BuildNode(roots);
}

topology::TopologyPtr ScaledDgx(int hcas) {
  std::vector<RootSpec> roots;
  const int switches = hcas / 2;
  for (int i = 0; i < switches; ++i) roots.push_back({i * 2 / switches, false, {{2, 2}}, 0});
  return BuildNode(roots);
}

topology::TopologyPtr DistinctHcas(int hcas) {
  std::vector<RootSpec> roots;
  for (int i = 0; i < hcas; ++i) roots.push_back({i * 2 / hcas, false, {{1, 1}}, 0});
  return BuildNode(roots);
}

topology::TopologyPtr TwoLevelSwitches() {
  std::vector<RootSpec> roots;
  for (int i = 0; i < 4; ++i) roots.push_back({i / 2, true, {{2, 1}, {2, 1}}, 0});
  return BuildNode(roots);
}

topology::TopologyPtr FewerHcasThanGpus() {
  std::vector<RootSpec> roots;
  for (int n = 0; n < 2; ++n) {
    roots.push_back({n, false, {{2, 1}}, 0});
    roots.push_back({n, false, {{2, 0}}, 1});
  }
  return BuildNode(roots);
}

std::vector<std::string> HcaIds(const topology::Topology& t) {
  std::vector<std::string> ids;
  for (const topology::Hca& h : t.hcas()) ids.push_back(h.place.pci);
  return ids;
}

std::vector<std::string> GpuIds(const topology::Topology& t) {
  std::vector<std::string> ids;
  for (const topology::Gpu& g : t.gpus()) ids.push_back(g.place.pci);
  return ids;
}

}  // namespace rdp::testing
