#include "bench/allocator_topologies.h"

#include <cstdio>
#include <memory>

namespace rdp::bench {
namespace {

class Builder {
 public:
  std::string Addr() {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%04x:%02x:00.0", domain_, bus_);
    if (++bus_ == 0x100) {
      bus_ = 0;
      ++domain_;
    }
    return buf;
  }

  topology::PciPlacement Place(int numa, const std::string& root,
                               std::vector<topology::Bridge> chain, const std::string& sw) {
    topology::PciPlacement p;
    p.numa = numa;
    p.pcie_root = root;
    p.bridges_known = true;
    p.bridges = std::move(chain);
    if (!sw.empty()) p.bridges.push_back({Addr(), sw});  // the switch's downstream port
    p.pci = Addr();
    return p;
  }

  void Add(const RootSpec& spec) {
    std::string root_bus = Addr();
    std::string root_name = "pci" + root_bus.substr(0, 7);
    std::vector<topology::Bridge> base = {{Addr(), ""}};  // the root port
    std::string top;
    if (spec.top_switch) {
      top = Addr();
      base.push_back({top, top});
    }
    for (const SwitchSpec& s : spec.switches) {
      std::vector<topology::Bridge> chain = base;
      if (!top.empty()) chain.push_back({Addr(), top});
      std::string id = Addr();
      chain.push_back({id, id});
      for (int g = 0; g < s.gpus; ++g) Gpu(Place(spec.numa, root_name, chain, id));
      for (int h = 0; h < s.hcas; ++h) Hca(Place(spec.numa, root_name, chain, id));
    }
    for (int h = 0; h < spec.lone_hcas; ++h) Hca(Place(spec.numa, root_name, base, top));
    numa_.push_back(spec.numa);
  }

  topology::TopologyPtr Build() {
    return std::make_shared<const topology::Topology>(numa_, hcas_, gpus_);
  }

 private:
  void Gpu(topology::PciPlacement place) {
    topology::Gpu g;
    g.place = std::move(place);
    g.vendor = "10de";
    g.device = "2330";
    gpus_.push_back(std::move(g));
  }
  void Hca(topology::PciPlacement place) {
    topology::Hca h;
    h.name = "mlx5_" + std::to_string(hcas_.size());
    h.place = std::move(place);
    h.ports.push_back({1, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)"});
    hcas_.push_back(std::move(h));
  }

  int domain_ = 0, bus_ = 0x10;
  std::vector<int> numa_;
  std::vector<topology::Hca> hcas_;
  std::vector<topology::Gpu> gpus_;
};

}  // namespace

topology::TopologyPtr BuildNode(const std::vector<RootSpec>& roots) {
  Builder b;
  for (const RootSpec& r : roots) b.Add(r);
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
  int switches = hcas / 2;
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

topology::TopologyPtr FourNuma() {
  std::vector<RootSpec> roots;
  for (int n = 0; n < 4; ++n) roots.push_back({n, false, {{2, 1}, {2, 1}}, 0});
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

}  // namespace rdp::bench
