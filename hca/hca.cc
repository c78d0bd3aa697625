#include "server/devices.h"

#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rdp::server {
namespace {

constexpr char kSharedPrefix[] = "shared-";
constexpr char kDevDir[] = "/dev/infiniband/";

bool Usable(const HcaHealth& h, const std::set<std::string>& withheld) {
  return h.present && h.healthy && withheld.count(h.pci) == 0;
}

// Whether the char device named `node` (uverbs0, umad1...) was present when last checked.
bool Existed(const topology::Hca& hca, const std::string& node) {
  for (const auto& [path, present] : hca.char_devices) {
    // The last component of `path` is `node` (compared in place: Allocate calls this for every
    // node of every HCA it hands out).
    const std::size_t at = path.size() - node.size();
    if (path.size() > node.size() && path[at - 1] == '/' && path.compare(at, node.size(), node) == 0) {
      return present;
    }
  }
  return false;
}

}  // namespace

Verdict Assess(const topology::Hca& hca) {
  if (hca.ports.empty()) return {false, "no port state is known"};
  for (const topology::Port& port : hca.ports) {
    if (!port.Active()) {
      return {false, absl::StrCat("port ", port.number, " is ",
                                  port.state.empty() ? "in an unknown state" : port.state)};
    }
  }
  if (hca.uverbs.empty()) return {false, "it has no uverbs device"};
  for (const auto& [path, present] : hca.char_devices) {
    if (!present) return {false, absl::StrCat("device node ", path, " is missing")};
  }
  return {true, ""};
}

std::vector<DeviceState> ExclusiveDevices(const std::vector<HcaHealth>& hcas,
                                          const std::set<std::string>& withheld) {
  bool all_numa = true;
  for (const HcaHealth& h : hcas) all_numa = all_numa && h.numa.has_value();
  std::vector<DeviceState> out;
  out.reserve(hcas.size());
  for (const HcaHealth& h : hcas) {
    out.push_back({h.pci, Usable(h, withheld), all_numa ? h.numa : std::nullopt});
  }
  return out;
}

std::vector<DeviceState> SharedDevices(int count, const std::vector<HcaHealth>& hcas,
                                       const std::set<std::string>& withheld) {
  if (hcas.empty()) return {};
  bool any = false;
  for (const HcaHealth& h : hcas) any = any || Usable(h, withheld);
  std::vector<DeviceState> out;
  out.reserve(count);
  for (int i = 0; i < count; ++i) out.push_back({SharedId(i), any, std::nullopt});
  return out;
}

std::string SharedId(int index) { return absl::StrCat(kSharedPrefix, index); }

bool IsSharedId(const std::string& id, int count) {
  // By hand: a shared GetPreferredAllocation checks 1000 of these.
  constexpr std::string_view kPrefix = kSharedPrefix;
  if (id.size() <= kPrefix.size() || id.size() > kPrefix.size() + 10) return false;  // int
  for (std::size_t i = 0; i < kPrefix.size(); ++i) {
    if (id[i] != kPrefix[i]) return false;
  }
  if (id.size() > kPrefix.size() + 1 && id[kPrefix.size()] == '0') return false;
  long long n = 0;
  for (std::size_t i = kPrefix.size(); i < id.size(); ++i) {
    const char c = id[i];
    if (c < '0' || c > '9') return false;
    n = n * 10 + (c - '0');
  }
  return n < count;
}

ContainerAllocation BuildAllocation(const std::vector<const topology::Hca*>& hcas,
                                    bool with_rdma_cm) {
  ContainerAllocation out;
  out.devices.reserve(hcas.size() * 3 + 1);
  auto add = [&out](const std::string& node) {
    const std::string path = absl::StrCat(kDevDir, node);
    out.devices.push_back({path, path, "rw"});
  };
  std::vector<std::string> names, pcis;
  for (const topology::Hca* hca : hcas) {
    if (!hca->uverbs.empty() && Existed(*hca, hca->uverbs)) add(hca->uverbs);
    for (const auto* list : {&hca->umad, &hca->issm}) {
      for (const std::string& node : *list) {
        if (Existed(*hca, node)) add(node);
      }
    }
    names.push_back(hca->name);
    pcis.push_back(hca->place.pci);
  }
  if (with_rdma_cm) add("rdma_cm");
  out.envs["NCCL_IB_HCA"] = absl::StrCat("=", absl::StrJoin(names, ","));
  out.envs["RDMA_HCA_NAMES"] = absl::StrJoin(names, ",");
  out.envs["RDMA_HCA_PCI"] = absl::StrJoin(pcis, ",");
  return out;
}

}  // namespace rdp::server
