#include "hca/hca.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rdp::hca {
namespace {

constexpr char kDevDir[] = "/dev/infiniband/";

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

absl::StatusOr<Mode> ParseMode(std::string_view text) {
  if (text == "shared") return Mode::kShared;
  if (text == "exclusive") return Mode::kExclusive;
  return absl::InvalidArgumentError(
      absl::StrCat("'", std::string(text), "' is not a mode: shared or exclusive"));
}

const char* ModeName(Mode mode) { return mode == Mode::kShared ? "shared" : "exclusive"; }

Verdict Assess(const topology::Hca& hca) {
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
    for (const auto& [path, present] : hca.char_devices) {
      if (!present) {
        out.reason = absl::StrCat("device node ", path, " is missing");
        break;
      }
    }
  }
  out.usable = out.reason.empty();
  return out;
}

topology::Hca WithDeviceNodesNow(const topology::Hca& hca, Env& env) {
  topology::Hca now = hca;
  for (auto& [path, present] : now.char_devices) present = env.Exists(path);
  return now;
}

ContainerAllocation BuildAllocation(const std::vector<topology::Hca>& hcas,
                                    bool with_rdma_cm) {
  ContainerAllocation out;
  out.devices.reserve(hcas.size() * 3 + 1);
  auto add = [&out](const std::string& node) {
    const std::string path = absl::StrCat(kDevDir, node);
    out.devices.push_back({path, path, "rw"});
  };
  std::vector<std::string> names, pcis, nccl;
  for (const topology::Hca& hca : hcas) {
    if (!hca.uverbs.empty() && Existed(hca, hca.uverbs)) add(hca.uverbs);
    for (const auto* list : {&hca.umad, &hca.issm}) {
      for (const std::string& node : *list) {
        if (Existed(hca, node)) add(node);
      }
    }
    names.push_back(hca.name);
    pcis.push_back(hca.place.pci);
    // NCCL uses every port of an HCA it is given by name alone; one with a port that is not
    // ACTIVE is named port by port (NCCL's "name:port"), its ACTIVE ports only.
    const std::vector<int> active = Assess(hca).active_ports;
    if (active.empty() || active.size() == hca.ports.size()) {
      nccl.push_back(hca.name);
    } else {
      for (int port : active) nccl.push_back(absl::StrCat(hca.name, ":", port));
    }
  }
  if (with_rdma_cm) add("rdma_cm");
  out.envs["NCCL_IB_HCA"] = absl::StrCat("=", absl::StrJoin(nccl, ","));
  out.envs["RDMA_HCA_NAMES"] = absl::StrJoin(names, ",");
  out.envs["RDMA_HCA_PCI"] = absl::StrJoin(pcis, ",");
  return out;
}

}  // namespace rdp::hca
