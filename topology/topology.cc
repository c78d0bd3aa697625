#include "topology/topology.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>

namespace rdp::topology {

std::string PciPlacement::Switch() const {
  for (auto it = bridges.rbegin(); it != bridges.rend(); ++it) {
    if (!it->switch_id.empty()) return it->switch_id;
  }
  return "";
}

bool Hca::AllPortsActive() const {
  return !ports.empty() &&
         std::all_of(ports.begin(), ports.end(), [](const Port& p) { return p.Active(); });
}

std::string_view PathClassName(PathClass c) {
  switch (c) {
    case PathClass::kPIX: return "PIX";
    case PathClass::kPXB: return "PXB";
    case PathClass::kPHB: return "PHB";
    case PathClass::kNODE: return "NODE";
    case PathClass::kSYS: return "SYS";
  }
  return "SYS";
}

PathClass Classify(const PciPlacement& a, const PciPlacement& b) {
  if (a.pcie_root.empty() || b.pcie_root.empty() || a.pcie_root != b.pcie_root) {
    // Different host bridges: NODE within one known NUMA node, SYS otherwise.
    if (a.numa && b.numa && *a.numa == *b.numa) return PathClass::kNODE;
    return PathClass::kSYS;
  }
  if (!a.bridges_known || !b.bridges_known) return PathClass::kPHB;
  // Same host bridge: find the deepest common bridge. None in common means the path goes
  // through the host bridge itself.
  std::size_t common = 0;
  while (common < a.bridges.size() && common < b.bridges.size() &&
         a.bridges[common].pci == b.bridges[common].pci) {
    ++common;
  }
  if (common == 0) return PathClass::kPHB;
  // The switches the path crosses: those of the bridges below the common one on either side,
  // plus the switch the common bridge belongs to. A switch's upstream and downstream ports
  // share one switch_id; PIX is at most one distinct switch, so the first one seen and whether
  // another differs from it say it all.
  const std::string* first = nullptr;
  bool more = false;
  auto add = [&](const Bridge& br) {
    if (br.switch_id.empty()) return;
    if (first == nullptr) {
      first = &br.switch_id;
    } else if (*first != br.switch_id) {
      more = true;
    }
  };
  add(a.bridges[common - 1]);
  for (std::size_t i = common; i < a.bridges.size(); ++i) add(a.bridges[i]);
  for (std::size_t i = common; i < b.bridges.size(); ++i) add(b.bridges[i]);
  return more ? PathClass::kPXB : PathClass::kPIX;
}

namespace {

template <typename T>
void SortByPci(std::vector<T>& v) {
  std::sort(v.begin(), v.end(), [](const T& x, const T& y) { return x.place.pci < y.place.pci; });
}

template <typename T>
int IndexByPci(const std::vector<T>& v, std::string_view pci) {
  auto norm = NormalizePci(pci);
  if (!norm) return -1;
  if (std::count(pci.begin(), pci.end(), ':') < 2) {
    const std::string_view bdf = std::string_view(*norm).substr(5);  // "01:00.0"
    int found = -1;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (std::string_view(v[i].place.pci).substr(5) != bdf) continue;
      if (found >= 0) return -1;
      found = static_cast<int>(i);
    }
    return found;
  }
  auto it = std::lower_bound(v.begin(), v.end(), *norm,
                             [](const T& x, const std::string& p) { return x.place.pci < p; });
  if (it == v.end() || it->place.pci != *norm) return -1;
  return static_cast<int>(it - v.begin());
}

}  // namespace

namespace {

std::vector<NumaNode> WithCpus(const std::vector<int>& ids) {
  std::vector<NumaNode> out;
  out.reserve(ids.size());
  for (int id : ids) out.push_back(NumaNode{id, true, "", ""});
  return out;
}

}  // namespace

Topology::Topology(std::vector<int> numa_nodes, std::vector<Hca> hcas, std::vector<Gpu> gpus)
    : Topology(NodesTag{}, WithCpus(numa_nodes), std::move(hcas), std::move(gpus)) {}

Topology Topology::WithNumaNodes(std::vector<NumaNode> numa_nodes, std::vector<Hca> hcas,
                                 std::vector<Gpu> gpus) {
  return Topology(NodesTag{}, std::move(numa_nodes), std::move(hcas), std::move(gpus));
}

Topology::Topology(NodesTag, std::vector<NumaNode> numa_nodes, std::vector<Hca> hcas,
                   std::vector<Gpu> gpus)
    : numa_nodes_(std::move(numa_nodes)), hcas_(std::move(hcas)), gpus_(std::move(gpus)) {
  std::stable_sort(numa_nodes_.begin(), numa_nodes_.end(),
                   [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  numa_nodes_.erase(std::unique(numa_nodes_.begin(), numa_nodes_.end(),
                                [](const NumaNode& a, const NumaNode& b) { return a.id == b.id; }),
                    numa_nodes_.end());
  for (const NumaNode& n : numa_nodes_) {
    if (n.has_cpus) cpu_numa_nodes_.push_back(n.id);
  }
  SortByPci(hcas_);
  SortByPci(gpus_);
  paths_.reserve(hcas_.size() * gpus_.size());
  for (const Hca& h : hcas_) {
    for (const Gpu& g : gpus_) paths_.push_back(Classify(h.place, g.place));
  }
}

int Topology::HcaIndex(std::string_view pci) const { return IndexByPci(hcas_, pci); }
int Topology::GpuIndex(std::string_view pci) const { return IndexByPci(gpus_, pci); }

bool IsCanonicalPci(std::string_view text) {
  if (text.size() != 12 || text[4] != ':' || text[7] != ':' || text[10] != '.') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
    const char c = text[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  // Device 0x00-0x1f, function 0-7.
  return text[8] <= '1' && text[11] <= '7';
}

std::optional<std::string> NormalizePci(std::string_view text) {
  // What the kubelet sends back is what we advertised: canonical already, no parsing.
  if (IsCanonicalPci(text)) return std::string(text);
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  std::string s(text);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  char tail = 0;
  int n = std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail);
  if (n != 4) {
    domain = 0;
    n = std::sscanf(s.c_str(), "%x:%x.%x%c", &bus, &dev, &fn, &tail);
    if (n != 3) return std::nullopt;
  }
  // sscanf's %x accepts signs and "0x"; insist on plain hex digits and separators.
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return std::nullopt;
  }
  if (domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 0x7) return std::nullopt;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return std::string(buf);
}

}  // namespace rdp::topology
