#include "topology/internal/numa.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rdp::topology {
namespace {

constexpr char kNodes[] = "/sys/devices/system/node";

bool Has(const std::vector<int>& sorted, int id) {
  return std::binary_search(sorted.begin(), sorted.end(), id);
}

}  // namespace

bool IsMemoryOnlyKind(std::string_view subtype) {
  return subtype == "GPUMemory" || subtype == "MCDRAM" || subtype == "HBM" || subtype == "NVM" ||
         subtype == "SPM" || subtype.substr(0, 4) == "CXL-";
}

std::map<int, std::string> ReadKernelNumaNodes(Env& env) {
  std::map<int, std::string> out;
  for (const std::string& entry : env.ListDir(kNodes, /*dirs_only=*/true)) {
    int id = -1;
    if (!absl::StartsWith(entry, "node") || !absl::SimpleAtoi(entry.substr(4), &id) || id < 0) {
      continue;
    }
    // A node whose cpulist cannot be read says nothing (hwloc's view stands for it).
    if (auto cpus = ReadAttribute(env, absl::StrCat(kNodes, "/", entry, "/cpulist"))) {
      out[id] = *cpus;
    }
  }
  return out;
}

std::optional<int> ReadKernelPciNuma(Env& env, const std::string& pci) {
  int numa = -1;
  auto text = ReadAttribute(env, absl::StrCat("/sys/bus/pci/devices/", pci, "/numa_node"));
  if (!text || !absl::SimpleAtoi(*text, &numa) || numa < 0) return std::nullopt;
  return numa;
}

std::vector<NumaNode> MergeNumaNodes(std::vector<NumaNode> hwloc,
                                     const std::map<int, std::string>& kernel) {
  std::map<int, NumaNode> by_id;
  for (NumaNode& n : hwloc) by_id.emplace(n.id, std::move(n));
  for (const auto& [id, cpus] : kernel) {
    NumaNode& n = by_id[id];
    n.id = id;
    n.has_cpus = !cpus.empty();
    n.cpus = cpus;
    if (n.has_cpus) n.memory_kind.clear();
  }
  std::vector<NumaNode> out;
  out.reserve(by_id.size());
  for (auto& [id, n] : by_id) out.push_back(std::move(n));
  return out;
}

std::vector<int> CpulessIds(const std::vector<NumaNode>& nodes) {
  std::vector<int> out;
  for (const NumaNode& n : nodes) {
    if (!n.has_cpus) out.push_back(n.id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<int> DeviceNuma(std::optional<int> kernel, const std::vector<int>& locality,
                              const std::vector<int>& cpuless) {
  if (kernel && !Has(cpuless, *kernel)) return kernel;
  std::optional<int> found;
  for (int id : locality) {
    if (Has(cpuless, id)) continue;
    if (found && *found != id) return std::nullopt;
    found = id;
  }
  return found;
}

}  // namespace rdp::topology
