#include "hca/hca.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace rdp::hca {
namespace {

constexpr char kDevDir[] = "/dev/infiniband/";

// Whether the char device named `node` (uverbs0, umad1...) was present when last checked.
bool Existed(const HcaNow& h, const std::string& node) {
  const auto& devices = h.hca->char_devices;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    // The last component of the path is `node` (compared in place: Allocate calls this for every
    // node of every HCA it hands out).
    const std::string& path = devices[i].first;
    const std::size_t at = path.size() - node.size();
    if (path.size() > node.size() && path[at - 1] == '/' && path.compare(at, node.size(), node) == 0) {
      return h.present[i];
    }
  }
  return false;
}

// Assess on the HCA's ports and uverbs, with `present(i)` for its i-th char device.
template <typename Present>
Verdict AssessWith(const topology::Hca& hca, Present present) {
  Verdict out;
  if (hca.ports.empty()) {
    out.reason = "no port state is known";
    return out;
  }
  std::vector<std::string> inactive;
  for (const topology::Port& port : hca.ports) {
    if (port.Active()) {
      out.active_ports.push_back(port.number);
    } else {
      inactive.push_back(absl::StrCat("port ", port.number, " is ",
                                      port.state.empty() ? "in an unknown state" : port.state));
    }
  }
  std::sort(out.active_ports.begin(), out.active_ports.end());
  if (out.active_ports.empty()) {
    out.reason = absl::StrJoin(inactive, ", ");
  } else if (hca.uverbs.empty()) {
    out.reason = "it has no uverbs device";
  } else {
    for (std::size_t i = 0; i < hca.char_devices.size(); ++i) {
      if (!present(i)) {
        out.reason = absl::StrCat("device node ", hca.char_devices[i].first, " is missing");
        break;
      }
    }
  }
  out.usable = out.reason.empty();
  return out;
}

}  // namespace

absl::StatusOr<Mode> ParseMode(std::string_view text) {
  if (text == "shared") return Mode::kShared;
  if (text == "exclusive") return Mode::kExclusive;
  return absl::InvalidArgumentError(
      absl::StrCat("'", std::string(text), "' is not a mode: shared or exclusive"));
}

const char* ModeName(Mode mode) { return mode == Mode::kShared ? "shared" : "exclusive"; }

std::string OwnVariableName(std::string_view key, std::string_view suffix) {
  std::string out(key);
  out += '_';
  out += suffix;
  return out;
}

Verdict Assess(const topology::Hca& hca) {
  return AssessWith(hca, [&hca](std::size_t i) { return hca.char_devices[i].second; });
}

Verdict Assess(const HcaNow& h) {
  return AssessWith(*h.hca, [&h](std::size_t i) { return h.present[i]; });
}

HcaNow AsScanned(const topology::Hca& hca) {
  HcaNow out{&hca, {}};
  out.present.reserve(hca.char_devices.size());
  for (const auto& [path, present] : hca.char_devices) out.present.push_back(present);
  return out;
}

NodesNow CheckedNow(const std::vector<const topology::Hca*>& hcas, Env& env) {
  NodesNow out;
  out.hcas.reserve(hcas.size());
  for (const topology::Hca* h : hcas) {
    HcaNow now{h, {}};
    now.present.reserve(h->char_devices.size());
    for (const auto& [path, scanned] : h->char_devices) now.present.push_back(env.Exists(path));
    out.hcas.push_back(std::move(now));
  }
  out.rdma_cm = env.Exists(kRdmaCmPath);
  return out;
}

namespace {

// NCCL_IB_GID_INDEX for the HCAs' ACTIVE RoCE ports (BuildAllocation says when).
void SetGidIndex(const std::vector<HcaNow>& hcas, ContainerAllocation& out) {
  std::set<int> indices;
  std::vector<std::string> missing;
  for (const HcaNow& h : hcas) {
    const topology::Hca& hca = *h.hca;
    for (const topology::Port& port : hca.ports) {
      if (!port.Active() || port.link_layer != "Ethernet") continue;
      if (port.roce_v2_ipv4_gid) {
        indices.insert(*port.roce_v2_ipv4_gid);
      } else {
        missing.push_back(absl::StrCat(hca.name, " port ", port.number));
      }
    }
  }
  if (!missing.empty()) {
    out.warnings.push_back(absl::StrCat(
        "NCCL_IB_GID_INDEX not set: no RoCE v2 GID with an IPv4 address on ",
        absl::StrJoin(missing, ", "),
        " (give the netdev an IPv4 address, or set NCCL_IB_GID_INDEX in the pod spec)"));
  } else if (indices.size() > 1) {
    out.warnings.push_back(absl::StrCat(
        "NCCL_IB_GID_INDEX not set: the RoCE v2 IPv4 GIDs of ",
        absl::StrJoin(hcas, ",", [](std::string* o, const HcaNow& h) { o->append(h.hca->name); }),
        " are at different indices (", absl::StrJoin(indices, ", "), "); NCCL takes one"));
  } else if (indices.size() == 1) {
    out.envs["NCCL_IB_GID_INDEX"] = std::to_string(*indices.begin());
  }
}

// ContainerAllocation::file for `hcas` (in PCI address order) and `envs`.
std::string FileOf(const std::vector<HcaNow>& hcas, const std::map<std::string, std::string>& envs,
                   const std::map<std::string, std::string>& paired_gpu);

// BuildAllocation without `file`: the devices, envs and warnings, `hcas` in PCI address order.
ContainerAllocation BuildWithoutFile(const std::vector<HcaNow>& hcas, bool with_rdma_cm) {
  ContainerAllocation out;
  out.devices.reserve(hcas.size() * 3 + 1);
  auto add = [&out](const std::string& node) {
    std::string path = absl::StrCat(kDevDir, node);
    out.devices.push_back({path, std::move(path), "rw"});  // copied, then moved: in order
  };
  std::vector<std::string> nccl, ucx;
  std::string names, pcis;
  for (const HcaNow& h : hcas) {
    const topology::Hca& hca = *h.hca;
    if (!hca.uverbs.empty() && Existed(h, hca.uverbs)) add(hca.uverbs);
    for (const auto* list : {&hca.umad, &hca.issm}) {
      for (const std::string& node : *list) {
        if (Existed(h, node)) add(node);
      }
    }
    absl::StrAppend(&names, names.empty() ? "" : ",", hca.name);
    absl::StrAppend(&pcis, pcis.empty() ? "" : ",", hca.place.pci);
    // NCCL uses every port of an HCA it is given by name alone; one with a port that is not
    // ACTIVE is named port by port (NCCL's "name:port"), its ACTIVE ports only.
    const std::vector<int> active = Assess(h).active_ports;
    if (active.empty() || active.size() == hca.ports.size()) {
      nccl.push_back(hca.name);
    } else {
      for (int port : active) nccl.push_back(absl::StrCat(hca.name, ":", port));
    }
    // UCX names a device by port always ("mlx5_0:1"): the ACTIVE ones, or every port where none
    // is known ACTIVE (as NCCL is given the HCA by name then).
    if (active.empty()) {
      for (const topology::Port& port : hca.ports) ucx.push_back(absl::StrCat(hca.name, ":", port.number));
    } else {
      for (int port : active) ucx.push_back(absl::StrCat(hca.name, ":", port));
    }
  }
  if (with_rdma_cm) add("rdma_cm");
  out.envs["NCCL_IB_HCA"] = absl::StrCat("=", absl::StrJoin(nccl, ","));
  out.envs["RDMA_HCA_NAMES"] = std::move(names);
  out.envs["RDMA_HCA_PCI"] = std::move(pcis);
  if (!ucx.empty()) out.envs["UCX_NET_DEVICES"] = absl::StrJoin(ucx, ",");
  SetGidIndex(hcas, out);
  return out;
}

}  // namespace

ContainerAllocation BuildAllocation(std::vector<HcaNow> hcas, bool with_rdma_cm,
                                    const std::map<std::string, std::string>& paired_gpu,
                                    const std::string& allocation_dir) {
  std::stable_sort(hcas.begin(), hcas.end(), [](const HcaNow& a, const HcaNow& b) {
    return a.hca->place.pci < b.hca->place.pci;
  });
  ContainerAllocation out = BuildWithoutFile(hcas, with_rdma_cm);
  if (!allocation_dir.empty()) {
    out.file = FileOf(hcas, out.envs, paired_gpu);
    out.file_name = AllocationFileName(out.file);
  }
  return out;
}

std::map<std::string, std::string> PairGpus(const topology::Topology& topology,
                                            std::vector<std::string> hca_pcis,
                                            const std::vector<std::string>& gpu_pcis) {
  std::map<std::string, std::string> out;
  std::vector<int> gpus;
  for (const std::string& g : gpu_pcis) {
    if (const int i = topology.GpuIndex(g); i >= 0) gpus.push_back(i);
  }
  std::sort(gpus.begin(), gpus.end());  // the topology's GPUs are in PCI order
  gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
  if (gpus.empty()) return out;
  std::sort(hca_pcis.begin(), hca_pcis.end());
  std::set<int> paired;
  for (const std::string& pci : hca_pcis) {
    const int h = topology.HcaIndex(pci);
    if (h < 0) continue;
    int best = -1;
    for (const bool only_free : {true, false}) {
      for (const int g : gpus) {
        if (only_free && paired.count(g)) continue;
        if (best < 0 || topology.Path(h, g) < topology.Path(h, best)) best = g;
      }
      if (best >= 0) break;
    }
    paired.insert(best);
    out[topology.hcas()[h].place.pci] = topology.gpus()[best].place.pci;
  }
  return out;
}

std::string AllocationFileName(const std::string& content) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const unsigned char c : content) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return absl::StrCat(absl::Hex(hash, absl::kZeroPad16), ".json");
}

namespace {

std::string FileOf(const std::vector<HcaNow>& hcas, const std::map<std::string, std::string>& envs,
                   const std::map<std::string, std::string>& paired_gpu) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const HcaNow& now : hcas) {
    const topology::Hca& hca = *now.hca;
    nlohmann::ordered_json h;
    h["name"] = hca.name;
    h["pci"] = hca.place.pci;
    if (hca.place.numa) h["numa"] = *hca.place.numa;
    h["netdevs"] = hca.netdevs;
    if (!hca.uverbs.empty()) h["uverbs"] = absl::StrCat(kDevDir, hca.uverbs);
    if (auto it = paired_gpu.find(hca.place.pci); it != paired_gpu.end()) h["gpu"] = it->second;
    nlohmann::ordered_json ports = nlohmann::ordered_json::array();
    for (const topology::Port& port : hca.ports) {
      nlohmann::ordered_json p;
      p["port"] = port.number;
      p["state"] = port.state;
      p["link_layer"] = port.link_layer;
      if (!port.gid_netdev.empty()) {
        p["netdev"] = port.gid_netdev;
      } else if (hca.netdevs.size() == 1) {
        p["netdev"] = hca.netdevs.front();
      }
      if (port.roce_v2_ipv4_gid) {
        p["gid_index"] = *port.roce_v2_ipv4_gid;
        p["gid_ipv4"] = port.gid_ipv4;
      }
      ports.push_back(std::move(p));
    }
    h["ports"] = std::move(ports);
    list.push_back(std::move(h));
  }
  nlohmann::ordered_json out;
  out["hcas"] = std::move(list);
  out["env"] = envs;
  return out.dump(2) + "\n";
}

}  // namespace

}  // namespace rdp::hca
