#include "check/container_check.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <memory>
#include <set>
#include <string_view>
#include <utility>

#include "fmt/format.h"
#include "check/gpudirect_check.h"
#include "topology/discovery.h"
#include "topology/gpudirect.h"

namespace rdp::check {
namespace {

constexpr char kMofedCause[] =
    "The classic cause is another component injecting every /dev/infiniband device into GPU "
    "containers: nvidia-device-plugin with MOFED_ENABLED, or NVIDIA_MOFED=true for "
    "nvidia-container-toolkit (upgrade it or turn that off on exclusive nodes). A privileged "
    "container or a hostPath mount of /dev does the same.";
constexpr char kMissingCause[] =
    "Their verbs devices were not injected into this container: check the plugin's log for "
    "this pod's Allocate, and that nothing (runtime configuration, admission policy) strips "
    "devices. A name that is not an HCA on this node means the plugin and the node disagree.";

std::string Trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\n") - first + 1);
}

// Splits on ',', trims, drops a ":port" suffix and empty entries; sorted and unique.
std::vector<std::string> SplitNames(const std::string& list) {
  std::set<std::string> names;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string entry = Trim(list.substr(start, end - start));
    entry = Trim(entry.substr(0, entry.find(':')));
    if (!entry.empty()) names.insert(entry);
    start = end + 1;
  }
  return {names.begin(), names.end()};
}

std::string Join(const std::vector<std::string>& items) {
  return items.empty() ? "none" : fmt::format("{}", fmt::join(items, ","));
}

std::vector<std::string> Minus(const std::vector<std::string>& a,
                               const std::vector<std::string>& b) {
  std::vector<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

std::string Plural(size_t n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

const char* SourceName(Allocation::Source source) {
  switch (source) {
    case Allocation::Source::kRdmaHcaNames:
      return "RDMA_HCA_NAMES";
    case Allocation::Source::kNcclIbHca:
      return "NCCL_IB_HCA";
    case Allocation::Source::kNone:
      break;
  }
  return "none";
}

std::string Explain(const CheckReport& r) {
  const auto& allocated = r.allocation.names;
  const std::string given =
      r.allocation.source == Allocation::Source::kNone
          ? "was allocated no HCA (neither RDMA_HCA_NAMES nor NCCL_IB_HCA is set)"
          : fmt::format("was allocated {} ({})", Plural(allocated.size(), "HCA"), Join(allocated));
  switch (r.verdict) {
    case Verdict::kMatch:
      if (r.openable.empty()) return fmt::format("This container {} and can open none.", given);
      return fmt::format("This container can open exactly the {} it was allocated ({}).",
                         Plural(allocated.size(), "HCA"), Join(allocated));
    case Verdict::kMore:
      return fmt::format(
          "This container can open {} but {}: it can also open {}, which {} not its own, so "
          "exclusive isolation does not hold. {}",
          Plural(r.openable.size(), "HCA"), given, Join(r.extra),
          r.extra.size() == 1 ? "is" : "are", kMofedCause);
    case Verdict::kFewer:
      return fmt::format("This container {} but cannot open {}. {}", given, Join(r.missing),
                         kMissingCause);
    case Verdict::kDifferent:
      return fmt::format(
          "This container {} but cannot open {}, and it can open {}, which {} not its own. {} "
          "{}",
          given, Join(r.missing), Join(r.extra), r.extra.size() == 1 ? "is" : "are", kMofedCause,
          kMissingCause);
  }
  return "";
}

}  // namespace

std::optional<std::string> AllocatedHcaNames(const std::vector<std::string>& environ) {
  constexpr std::string_view kName = "RDMA_HCA_NAMES";
  std::optional<std::string> out;
  for (const std::string& entry : environ) {
    const std::size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string_view name(entry.data(), eq);
    if (name.substr(0, kName.size()) != kName ||
        (name.size() != kName.size() && name[kName.size()] != '_')) {
      continue;
    }
    out = out ? *out + "," + entry.substr(eq + 1) : entry.substr(eq + 1);
  }
  return out;
}

Allocation ParseAllocation(const std::optional<std::string>& rdma_hca_names,
                           const std::optional<std::string>& nccl_ib_hca) {
  Allocation a;
  if (rdma_hca_names) {
    a.source = Allocation::Source::kRdmaHcaNames;
    a.names = SplitNames(*rdma_hca_names);
    return a;
  }
  if (!nccl_ib_hca) return a;
  std::string list = Trim(*nccl_ib_hca);
  if (!list.empty() && list[0] == '^') {
    a.notes.push_back("NCCL_IB_HCA='" + list +
                      "' is an exclude list ('^'), not an allocation; ignored");
    return a;
  }
  a.source = Allocation::Source::kNcclIbHca;
  if (!list.empty() && list[0] == '=') {
    list.erase(0, 1);
  } else if (!list.empty()) {
    a.notes.push_back(
        "NCCL_IB_HCA has no leading '=': NCCL matches its entries as prefixes (mlx5_1 also "
        "selects mlx5_10); compared here as exact names");
  }
  a.names = SplitNames(list);
  return a;
}

CheckReport Compare(std::vector<HcaAccess> hcas, Allocation allocation) {
  CheckReport r;
  std::sort(hcas.begin(), hcas.end(),
            [](const HcaAccess& x, const HcaAccess& y) { return x.name < y.name; });
  std::set<std::string> openable;
  for (const HcaAccess& h : hcas) {
    if (h.openable) openable.insert(h.name);
  }
  r.openable.assign(openable.begin(), openable.end());
  r.hcas = std::move(hcas);
  r.allocation = std::move(allocation);
  r.extra = Minus(r.openable, r.allocation.names);
  r.missing = Minus(r.allocation.names, r.openable);
  if (!r.extra.empty() && !r.missing.empty()) {
    r.verdict = Verdict::kDifferent;
  } else if (!r.extra.empty()) {
    r.verdict = Verdict::kMore;
  } else if (!r.missing.empty()) {
    r.verdict = Verdict::kFewer;
  }
  r.explanation = Explain(r);
  return r;
}

absl::StatusOr<std::vector<HcaAccess>> ProbeHcas(Env& env) {
  auto hcas = topology::ReadSysfsHcas(env);
  if (!hcas.ok()) return hcas.status();
  std::vector<HcaAccess> out;
  for (const topology::Hca& hca : *hcas) {
    HcaAccess a{hca.name, hca.place.pci, hca.uverbs, false, ""};
    if (hca.uverbs.empty()) {
      a.error = "no uverbs device in sysfs";
    } else {
      const std::string path = env.HostPath("/dev/infiniband/" + hca.uverbs);
      const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd >= 0) {
        ::close(fd);
        a.openable = true;
      } else {
        // ENXIO/ENODEV: the open reached the device and found no driver behind it (a node
        // without its kernel module, or no HCA behind the node). Only a device the container's
        // device cgroup allows gets that far; a denied one is EPERM. So it is as reachable as
        // an open that succeeds, which is what isolation is about.
        const int err = errno;
        a.openable = err == ENXIO || err == ENODEV;
        a.error = std::strerror(err);
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

const char* VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kMatch:
      return "match";
    case Verdict::kMore:
      return "more";
    case Verdict::kFewer:
      return "fewer";
    case Verdict::kDifferent:
      return "different";
  }
  return "";
}

nlohmann::json ToJson(const CheckReport& r) {
  nlohmann::json hcas = nlohmann::json::array();
  for (const HcaAccess& h : r.hcas) {
    hcas.push_back({{"name", h.name},
                    {"pci", h.pci},
                    {"uverbs", h.uverbs},
                    {"openable", h.openable},
                    {"error", h.error}});
  }
  return {{"ok", r.ExitCode() == 0},
          {"verdict", VerdictName(r.verdict)},
          {"allocation_source", SourceName(r.allocation.source)},
          {"allocated", r.allocation.names},
          {"openable", r.openable},
          {"extra", r.extra},
          {"missing", r.missing},
          {"hcas", hcas},
          {"notes", r.allocation.notes},
          {"explanation", r.explanation}};
}

void PrintText(const CheckReport& r, std::ostream& out) {
  out << fmt::format("{:<16} {:<14} {:<10} {}\n", "HCA", "PCI", "UVERBS", "OPENS");
  for (const HcaAccess& h : r.hcas) {
    out << fmt::format("{:<16} {:<14} {:<10} {}\n", h.name, h.pci,
                       h.uverbs.empty() ? "-" : h.uverbs,
                       h.openable ? "yes" : "no (" + h.error + ")");
  }
  if (r.hcas.empty()) out << "(no RDMA devices in sysfs)\n";
  out << fmt::format("allocated ({}): {}\n", SourceName(r.allocation.source),
                     Join(r.allocation.names));
  for (const std::string& note : r.allocation.notes) out << "note: " << note << "\n";
  out << (r.ExitCode() == 0 ? "OK: " : "FAIL: ") << r.explanation << "\n";
}

int RunCheck(const CheckOptions& options, const std::optional<std::string>& rdma_hca_names,
             const std::optional<std::string>& nccl_ib_hca, std::ostream& out,
             std::ostream& err) {
  NodeRoots roots;
  roots.sysfs = options.sysfs_root;
  roots.dev = options.dev_root;
  roots.proc = options.proc_root;
  const std::shared_ptr<Env> env = NewNodeEnv(roots);
  auto hcas = ProbeHcas(*env);
  if (!hcas.ok()) {
    err << "rdma-device-plugin check: cannot list HCAs: " << hcas.status().message() << "\n";
    return kExitCannotCheck;
  }
  const CheckReport report =
      Compare(std::move(*hcas), ParseAllocation(rdma_hca_names, nccl_ib_hca));
  const GpuDirectReport gpudirect = AssessGpuDirect(topology::ReadGpuDirect(*env),
                                                    VisibleGpus(*env), report.openable,
                                                    options.memlock);
  if (options.json) {
    nlohmann::json j = ToJson(report);
    j["gpudirect"] = ToJson(gpudirect);
    out << j.dump(2) << "\n";
  } else {
    PrintText(report, out);
    PrintText(gpudirect, out);
  }
  if (options.require_gpudirect && !gpudirect.possible && report.ExitCode() == 0) return 1;
  return report.ExitCode();
}

}  // namespace rdp::check
