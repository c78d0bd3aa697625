#include "topology/discovery.h"

#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/log.h"
#include "topology/internal/hwloc_tree.h"
#include "topology/internal/numa.h"
#include "topology/internal/sysfs_util.h"

namespace rdp::topology {
namespace {

bool Contains(const std::vector<std::uint32_t>& v, std::uint32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool IsGpu(const HwlocPciDevice& d, const DiscoveryOptions& o) {
  for (const auto& [vendor, device] : o.not_gpus) {
    if (d.vendor == vendor && d.device == device) return false;
  }
  if (!Contains(o.gpu_classes, d.class_id)) return false;
  return d.class_id == 0x0302 || Contains(o.gpu_vendors, d.vendor);
}

std::string Hex4(std::uint32_t v) {
  std::string out;
  AppendHex(out, v, 4);
  return out;
}

void LogHca(spdlog::logger& log, const Hca& h) {
  log.info(
      "discovered RDMA device: {} (PCI={}, NUMA={}, uverbs={}, pcieRoot={})", h.name, h.place.pci,
      h.place.numa ? *h.place.numa : -1, h.uverbs.empty() ? "unknown" : h.uverbs,
      h.place.pcie_root.empty() ? "unknown" : h.place.pcie_root);
}

using TreeIndex = std::map<std::string_view, const HwlocPciDevice*>;

// sysfs knows the devices; hwloc knows the tree. Take hwloc's placement for each sysfs HCA; its
// NUMA node is the kernel's numa_node unless that is a node without CPUs (DeviceNuma).
void PlaceFromTree(std::vector<Hca>& hcas, const TreeIndex& tree, const std::vector<int>& cpuless) {
  for (Hca& h : hcas) {
    const std::optional<int> kernel = h.place.numa;
    auto it = tree.find(h.place.pci);
    if (it == tree.end()) {
      Logger("topology")->debug("HCA {} ({}) is not in hwloc's PCI tree; placing it from sysfs",
                                h.name, h.place.pci);
      h.place.numa = DeviceNuma(kernel, {}, cpuless);
      continue;
    }
    std::string sysfs_root = h.place.pcie_root;
    h.place = it->second->place;
    h.place.numa = DeviceNuma(kernel, it->second->locality, cpuless);
    if (h.place.pcie_root.empty()) h.place.pcie_root = sysfs_root;
  }
}

// An SR-IOV VF sits where its PF sits: the PF's NUMA node, root and bridges, with its own
// address. The PF's placement is that of the PF's HCA in `hcas` (placed already) or, for a PF
// that is no HCA (its RDMA device unbound), hwloc's for it in `tree`; a VF whose PF is in
// neither keeps its own. hwloc exports often leave VFs out, and the kernel hangs a VF's
// directory beside its PF's anyway.
void PlaceVirtualFunctions(std::vector<Hca>& hcas, const TreeIndex& tree,
                           const std::vector<int>& cpuless) {
  std::map<std::string, PciPlacement> pfs;
  for (const Hca& h : hcas) {
    if (!h.IsVirtualFunction()) pfs.emplace(h.place.pci, h.place);
  }
  for (Hca& h : hcas) {
    if (!h.IsVirtualFunction()) continue;
    PciPlacement pf;
    if (auto it = pfs.find(h.physfn); it != pfs.end()) {
      pf = it->second;
    } else if (auto t = tree.find(h.physfn); t != tree.end()) {
      pf = t->second->place;
      pf.numa = DeviceNuma(h.place.numa, t->second->locality, cpuless);
    } else {
      continue;
    }
    pf.pci = h.place.pci;
    h.place = std::move(pf);
  }
}

// Every NUMA node a device sits on is a node of the snapshot, even one the tree does not list
// (an XML whose locality names a node it has no object for: found by fuzz_hwloc_xml).
void AddDeviceNodes(std::vector<NumaNode>& numa, const std::vector<Hca>& hcas,
                    const std::vector<Gpu>& gpus) {
  auto add = [&numa](const std::optional<int>& id) {
    if (!id) return;
    for (const NumaNode& n : numa) {
      if (n.id == *id) return;
    }
    numa.push_back(NumaNode{*id, true, "", ""});
  };
  for (const Hca& h : hcas) add(h.place.numa);
  for (const Gpu& g : gpus) add(g.place.numa);
}

}  // namespace

absl::Status PrepareHwloc(const DiscoveryOptions& options) {
  return UseHwlocRoot(options.topology_xml.empty() ? options.sysfs_root : "");
}

NodeRoots DiscoveryOptions::Roots() const {
  NodeRoots roots;
  roots.sysfs = sysfs_root.empty() ? "/" : sysfs_root;
  roots.dev = dev_root.empty() ? "/" : dev_root;
  return roots;
}

Discoverer::Discoverer(DiscoveryOptions options, std::shared_ptr<Env> env)
    : options_(std::move(options)),
      // Only sysfs is read through it: an XML alone needs no view of the node's trees.
      env_(env                                                             ? std::move(env)
           : !options_.topology_xml.empty() && options_.sysfs_root.empty() ? nullptr
                                                                          : NewNodeEnv(options_.Roots())) {}
Discoverer::~Discoverer() = default;

absl::StatusOr<std::shared_ptr<HwlocTree>> Discoverer::Tree() {
  const std::string sysfs_root = options_.sysfs_root.empty() ? "/" : options_.sysfs_root;
  // The live PCI tree changes on hotplug: load it afresh; a one-shot XML is loaded once anyway.
  if (options_.topology_xml.empty() || one_shot_) {
    absl::StatusOr<HwlocTree> tree = LoadHwlocTree(options_.topology_xml, sysfs_root);
    if (!tree.ok()) return tree.status();
    return std::make_shared<HwlocTree>(std::move(*tree));
  }
  absl::MutexLock lock(&mu_);
  if (!xml_tree_) {
    absl::StatusOr<HwlocTree> tree = LoadHwlocTree(options_.topology_xml, sysfs_root);
    if (!tree.ok()) return tree.status();
    xml_tree_ = std::make_shared<HwlocTree>(std::move(*tree));
  }
  return xml_tree_;
}

absl::StatusOr<TopologyPtr> Discover(const DiscoveryOptions& options) {
  Discoverer once(options);
  once.one_shot_ = true;
  return once.Discover();
}

absl::StatusOr<TopologyPtr> Discoverer::Discover() {
  const DiscoveryOptions& options = options_;
  const bool hcas_from_xml = !options.topology_xml.empty() && options.sysfs_root.empty();

  std::vector<Hca> hcas;
  if (!hcas_from_xml) {
    auto read = ReadSysfsHcas(*env_);
    if (!read.ok()) return read.status();
    hcas = std::move(*read);
  }
  absl::StatusOr<std::shared_ptr<HwlocTree>> tree = Tree();
  if (!tree.ok()) return tree.status();
  // Which NUMA nodes have CPUs: the kernel says where it is read (--sysfs-root or the live node),
  // hwloc's tree elsewhere.
  std::vector<NumaNode> numa = MergeNumaNodes(
      (*tree)->numa_nodes, env_ ? ReadKernelNumaNodes(*env_) : std::map<int, std::string>{});
  const std::vector<int> cpuless = CpulessIds(numa);
  TreeIndex by_pci;  // of two functions with one address, the last
  for (const HwlocPciDevice& d : (*tree)->pci) by_pci[d.place.pci] = &d;
  if (hcas_from_xml) {
    // A tree loaded for this call alone is ours to take from; the kept one is copied.
    if (tree->use_count() == 1) {
      hcas = std::move((*tree)->openfabrics);
    } else {
      hcas = (*tree)->openfabrics;
    }
    for (std::size_t i = 0; i < hcas.size(); ++i) {
      hcas[i].place.numa = DeviceNuma(std::nullopt, (*tree)->openfabrics_locality[i], cpuless);
    }
    DropDuplicatePci(hcas, "HCA", [](const Hca& h) { return h.name; });
  } else {
    PlaceFromTree(hcas, by_pci, cpuless);
    PlaceVirtualFunctions(hcas, by_pci, cpuless);
  }

  std::vector<Gpu> gpus;
  for (const HwlocPciDevice& d : (*tree)->pci) {
    if (!IsGpu(d, options)) continue;
    Gpu gpu{d.place, Hex4(d.vendor), Hex4(d.device), Hex4(d.class_id)};
    gpu.place.numa = DeviceNuma(env_ ? ReadKernelPciNuma(*env_, d.place.pci) : std::nullopt,
                                d.locality, cpuless);
    gpus.push_back(std::move(gpu));
  }
  DropDuplicatePci(gpus, "GPU", [](const Gpu& g) { return g.vendor + ":" + g.device; });
  AddDeviceNodes(numa, hcas, gpus);
  auto topo = std::make_shared<const Topology>(
      Topology::WithNumaNodes(std::move(numa), std::move(hcas), std::move(gpus)));
  const std::shared_ptr<spdlog::logger> log = Logger("topology");
  for (const Hca& h : topo->hcas()) LogHca(*log, h);
  log->info("snapshot: hcas={} gpus={} numa_nodes={} memory_only_numa_nodes={}",
            topo->hcas().size(), topo->gpus().size(), topo->numa_nodes().size(),
            topo->all_numa_nodes().size() - topo->numa_nodes().size());
  return topo;
}

TopologyPtr WithScannedHcas(const Topology& last, std::vector<Hca> scanned) {
  const std::vector<int> cpuless = CpulessIds(last.all_numa_nodes());
  for (Hca& h : scanned) {
    const int known = last.HcaIndex(h.place.pci);
    const int pf = h.IsVirtualFunction() ? last.HcaIndex(h.physfn) : -1;
    if (known >= 0) {
      h.place = last.hcas()[known].place;
    } else if (pf >= 0) {  // a new VF: where its PF is
      std::string pci = std::move(h.place.pci);
      h.place = last.hcas()[pf].place;
      h.place.pci = std::move(pci);
    } else {
      h.place.numa = DeviceNuma(h.place.numa, {}, cpuless);
    }
  }
  std::vector<NumaNode> numa = last.all_numa_nodes();
  AddDeviceNodes(numa, scanned, {});
  return std::make_shared<const Topology>(
      Topology::WithNumaNodes(std::move(numa), std::move(scanned), last.gpus()));
}

absl::StatusOr<std::vector<std::uint32_t>> ParseHexList(const std::string& text) {
  std::vector<std::uint32_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    absl::string_view digits = part;
    if (!absl::ConsumePrefix(&digits, "0x")) absl::ConsumePrefix(&digits, "0X");
    std::uint32_t v = 0;
    if (digits.empty() || digits.size() > 8 || !absl::SimpleHexAtoi(digits, &v)) {
      return absl::InvalidArgumentError("'" + std::string(part) +
                                        "' is not a hexadecimal number (e.g. 0x0302 or 10de)");
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError("empty list: '" + text + "'");
  return out;
}

std::string HcaFingerprint(const std::vector<Hca>& hcas) {
  std::vector<std::string> parts;
  for (const Hca& h : hcas) {
    std::string p = absl::StrCat(h.place.pci, "|", h.name, "|", h.uverbs);
    for (const auto& [path, present] : h.char_devices) absl::StrAppend(&p, "|", path, present);
    for (const auto& port : h.ports) absl::StrAppend(&p, "|", port.number, port.state);
    parts.push_back(std::move(p));
  }
  std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, ";");
}

}  // namespace rdp::topology
