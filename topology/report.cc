#include "topology/report.h"

#include <map>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace rdp::topology {
namespace {

nlohmann::ordered_json OrNull(const std::string& s) {
  return s.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s);
}
nlohmann::ordered_json OrNull(const std::optional<int>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}
std::string NumaText(const std::optional<int>& v) { return v ? std::to_string(*v) : "N/A"; }
std::string OrNA(const std::string& s) { return s.empty() ? "N/A" : s; }

// "NUMA nodes: 0 (CPUs 0-71), 1 (CPUs 72-143); without CPUs: 2 (GPUMemory), 3 (GPUMemory)"
std::string NumaLine(const Topology& t) {
  std::vector<std::string> cpu, memory;
  for (const NumaNode& n : t.all_numa_nodes()) {
    if (n.has_cpus) {
      cpu.push_back(n.cpus.empty() ? std::to_string(n.id) : fmt::format("{} (CPUs {})", n.id, n.cpus));
    } else {
      memory.push_back(n.memory_kind.empty() ? std::to_string(n.id)
                                             : fmt::format("{} ({})", n.id, n.memory_kind));
    }
  }
  std::string out = "NUMA nodes: " + (cpu.empty() ? std::string("none known") : fmt::format("{}", fmt::join(cpu, ", ")));
  if (!memory.empty()) out += fmt::format("; without CPUs: {}", fmt::join(memory, ", "));
  return out + "\n";
}

}  // namespace

nlohmann::ordered_json ToJson(const Topology& t) {
  nlohmann::ordered_json out;
  out["numa_nodes"] = t.numa_nodes();
  auto gpus = nlohmann::ordered_json::array();
  for (const Gpu& g : t.gpus()) {
    nlohmann::ordered_json j;
    j["pci"] = g.place.pci;
    j["vendor"] = OrNull(g.vendor);
    j["numa"] = OrNull(g.place.numa);
    j["pcie_root"] = OrNull(g.place.pcie_root);
    j["switch"] = OrNull(g.place.Switch());
    gpus.push_back(std::move(j));
  }
  out["gpus"] = std::move(gpus);
  auto hcas = nlohmann::ordered_json::array();
  for (const Hca& h : t.hcas()) {
    nlohmann::ordered_json j;
    j["name"] = h.name;
    j["pci"] = h.place.pci;
    j["numa"] = OrNull(h.place.numa);
    j["pcie_root"] = OrNull(h.place.pcie_root);
    j["switch"] = OrNull(h.place.Switch());
    j["uverbs"] = OrNull(h.uverbs);
    auto ports = nlohmann::ordered_json::array();
    for (const Port& p : h.ports) {
      ports.push_back({{"port", p.number}, {"state", OrNull(p.state)},
                       {"link_layer", OrNull(p.link_layer)}});
    }
    j["ports"] = std::move(ports);
    j["healthy"] = h.AllPortsActive();
    j["vendor"] = OrNull(h.vendor);
    j["device"] = OrNull(h.device);
    j["driver"] = OrNull(h.driver);
    j["firmware_version"] = OrNull(h.firmware_version);
    j["node_guid"] = OrNull(h.node_guid);
    j["vf"] = h.IsVirtualFunction();
    j["pf"] = OrNull(h.physfn);
    hcas.push_back(std::move(j));
  }
  out["hcas"] = std::move(hcas);
  auto paths = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < t.hcas().size(); ++i) {
    auto row = nlohmann::ordered_json::object();
    for (std::size_t g = 0; g < t.gpus().size(); ++g) {
      row[t.gpus()[g].place.pci] = std::string(PathClassName(t.Path(i, g)));
    }
    paths[t.hcas()[i].name] = std::move(row);
  }
  out["paths"] = std::move(paths);
  return out;
}

std::string RenderMatrix(const Topology& t) {
  std::size_t name_w = 4;
  for (const Hca& h : t.hcas()) name_w = std::max(name_w, h.name.size());
  std::string out = fmt::format("{:<{}}", "", name_w + 2);
  for (std::size_t g = 0; g < t.gpus().size(); ++g) out += fmt::format("{:<6}", fmt::format("GPU{}", g));
  out += fmt::format("{:<6}{:<12}{}\n", "NUMA", "PCIe root", "PCI");
  for (std::size_t i = 0; i < t.hcas().size(); ++i) {
    const Hca& h = t.hcas()[i];
    out += fmt::format("{:<{}}", h.name, name_w + 2);
    for (std::size_t g = 0; g < t.gpus().size(); ++g) {
      out += fmt::format("{:<6}", PathClassName(t.Path(i, g)));
    }
    out += fmt::format("{:<6}{:<12}{}{}{}\n", NumaText(h.place.numa), OrNA(h.place.pcie_root),
                       h.place.pci, h.IsVirtualFunction() ? "  (VF of " + h.physfn + ")" : "",
                       h.AllPortsActive() ? "" : "  (not every port ACTIVE)");
  }
  if (t.hcas().empty()) out += "(no RDMA devices)\n";
  out += "\n";
  for (std::size_t g = 0; g < t.gpus().size(); ++g) {
    const Gpu& gpu = t.gpus()[g];
    out += fmt::format("GPU{:<3} {} vendor={} NUMA={} pcieRoot={} switch={}\n", g, gpu.place.pci,
                       gpu.vendor, NumaText(gpu.place.numa), OrNA(gpu.place.pcie_root),
                       OrNA(gpu.place.Switch()));
  }
  out += "\n" + NumaLine(t);
  out +=
      "\nLegend:\n"
      "  PIX  = path crosses at most a single PCIe switch\n"
      "  PXB  = path crosses multiple PCIe switches (without a PCIe host bridge)\n"
      "  PHB  = path crosses a PCIe host bridge (typically the CPU)\n"
      "  NODE = path crosses host bridges within one NUMA node\n"
      "  SYS  = path crosses the SMP interconnect between NUMA nodes (or locality unknown)\n"
      "  GPUDirect RDMA performs well at PIX and PXB only.\n";
  return out;
}

std::string RenderDot(const Topology& t) {
  // numa -> root -> switch -> device labels
  std::map<std::string, std::map<std::string, std::map<std::string, std::vector<std::string>>>> tree;
  auto add = [&tree](const PciPlacement& p, const std::string& label) {
    tree[p.numa ? "NUMA " + std::to_string(*p.numa) : std::string("NUMA unknown")]
        [OrNA(p.pcie_root)][p.Switch()].push_back(label);
  };
  for (const Gpu& g : t.gpus()) add(g.place, "GPU " + g.place.pci);
  for (const Hca& h : t.hcas()) {
    add(h.place, h.name + "\\n" + h.place.pci +
                     (h.IsVirtualFunction() ? "\\nVF of " + h.physfn : std::string()));
  }
  std::string out = "graph topology {\n  node [shape=box];\n";
  int cluster = 0;
  for (const auto& [numa, roots] : tree) {
    out += fmt::format("  subgraph cluster_{} {{\n    label=\"{}\";\n", cluster++, numa);
    for (const auto& [root, switches] : roots) {
      out += fmt::format("    \"{}\" [shape=ellipse];\n", root);
      for (const auto& [sw, devices] : switches) {
        std::string parent = root;
        if (!sw.empty()) {
          parent = "switch " + sw;
          out += fmt::format("    \"{}\" [shape=diamond];\n    \"{}\" -- \"{}\";\n", parent, root,
                             parent);
        }
        for (const std::string& d : devices) out += fmt::format("    \"{}\" -- \"{}\";\n", parent, d);
      }
    }
    out += "  }\n";
  }
  out += "}\n";
  return out;
}

}  // namespace rdp::topology
