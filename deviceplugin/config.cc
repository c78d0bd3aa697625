#include "deviceplugin/config.h"

#include <filesystem>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "allocator/allocator.h"
#include "resources/config.h"

namespace rdp::deviceplugin {

NodeRoots Config::Roots() const {
  NodeRoots roots = discovery.Roots();
  roots.proc = proc_root.empty() ? "/" : proc_root;
  return roots;
}

std::string Config::SocketPath() const {
  return (std::filesystem::path(kubelet_dir) / socket_name).string();
}

std::string Config::KubeletSocketPath() const {
  return (std::filesystem::path(kubelet_dir) / "kubelet.sock").string();
}

namespace {

// Every advertised ID must be one allocator::SharedIndex reads.
using resources::kMaxSharedDevices;
static_assert(kMaxSharedDevices <= static_cast<int>(allocator::kMaxSharedIndex));

absl::Status Bad(const std::string& flag, const std::string& value, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " '", value, "': ", why));
}

bool IsDir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

bool IsSharedDevices(int n) { return n >= 1 && n <= kMaxSharedDevices; }

}  // namespace

absl::Status Validate(const Config& c) {
  if (absl::Status st = resources::ValidateResourceName(c.resource_name); !st.ok()) {
    return Bad("--resource-name", c.resource_name, std::string(st.message()));
  }
  if (!IsSharedDevices(c.shared_devices)) {
    return Bad("--shared-devices", std::to_string(c.shared_devices),
               absl::StrCat("must be 1..", kMaxSharedDevices));
  }
  if (c.kubelet_dir.empty()) return Bad("--kubelet-dir", "", "must not be empty");
  if (c.socket_name.empty() || absl::StrContains(c.socket_name, "/") ||
      c.socket_name == "kubelet.sock") {
    return Bad("--socket-name", c.socket_name,
               "must be a plain file name other than kubelet.sock");
  }
  if (c.health_interval < absl::Milliseconds(10)) {
    return Bad("--health-interval", absl::FormatDuration(c.health_interval),
               "must be at least 10ms");
  }
  const topology::DiscoveryOptions& d = c.discovery;
  if (!d.sysfs_root.empty() && !IsDir(d.sysfs_root)) {
    return Bad("--sysfs-root", d.sysfs_root, "is not a directory");
  }
  if (!IsDir(d.dev_root)) return Bad("--dev-root", d.dev_root, "is not a directory");
  if (!IsDir(c.proc_root)) return Bad("--proc-root", c.proc_root, "is not a directory");
  if (!c.allocation_dir.empty() && !IsDir(c.allocation_dir)) {
    return Bad("--allocation-dir", c.allocation_dir, "is not a directory");
  }
  std::error_code ec;
  if (!d.topology_xml.empty() && !std::filesystem::is_regular_file(d.topology_xml, ec)) {
    return Bad("--topology-xml", d.topology_xml, "is not a readable file");
  }
  for (const std::string& r : c.gpu_resources) {
    if (r.find('/') == std::string::npos) {
      return Bad("--gpu-resources", r, "each entry must be <domain>/<name>");
    }
  }
  return hca::ValidateEarlyWarning(c.early_warning);
}

std::vector<std::string> SocketNames(const Config& config,
                                     const std::vector<resources::Resource>& served) {
  if (served.empty()) return {config.socket_name};
  std::string stem;  // "" for the default --socket-name
  if (config.socket_name != Config().socket_name) {
    stem = config.socket_name;
    if (absl::EndsWith(stem, ".sock")) stem.resize(stem.size() - 5);
    stem += "-";
  }
  std::vector<std::string> out;
  for (const resources::Resource& r : served) out.push_back(stem + r.SocketName());
  return out;
}

std::vector<AllocationNaming> AllocationNamings(const std::vector<resources::Resource>& served) {
  if (served.size() <= 1) return {AllocationNaming{}};
  // The own file beside hca::kAllocationFile, in a directory of its own.
  const absl::string_view common_file = hca::kAllocationFile;
  const std::size_t slash = common_file.rfind('/');
  std::vector<AllocationNaming> out;
  for (const resources::Resource& r : served) {
    AllocationNaming n;
    n.common = out.empty();
    n.suffix = r.VariableSuffix();
    n.own_file = absl::StrCat(common_file.substr(0, slash + 1), absl::AsciiStrToLower(n.suffix),
                              common_file.substr(slash));
    out.push_back(std::move(n));
  }
  return out;
}

absl::Status ValidateResources(const Config& config,
                               const std::vector<resources::Resource>& served) {
  const std::vector<std::string> sockets = SocketNames(config, served);
  std::map<std::string, std::string> by_name;    // resource name -> itself
  std::map<std::string, std::string> by_socket;  // socket name -> the resource served on it
  std::map<std::string, std::string> by_suffix;  // variable suffix -> the resource that has it
  for (std::size_t i = 0; i < served.size(); ++i) {
    const resources::Resource& r = served[i];
    if (absl::Status st = resources::ValidateResourceName(r.name); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("resource '", r.name, "': ", st.message()));
    }
    if (!IsSharedDevices(r.shared_devices)) {
      return absl::InvalidArgumentError(absl::StrCat("resource ", r.name, ": shared devices ",
                                                     r.shared_devices, " must be 1..",
                                                     kMaxSharedDevices));
    }
    if (!by_name.emplace(r.name, r.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("resource ", r.name, " is given twice"));
    }
    if (sockets[i] == "kubelet.sock") {
      return absl::InvalidArgumentError(
          absl::StrCat("resource ", r.name, " would be served on the kubelet's own socket"));
    }
    auto [it, fresh] = by_socket.emplace(sockets[i], r.name);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resources ", it->second, " and ", r.name, " would be served on one socket, ",
          sockets[i], ": give them names that differ in more than '/' and '.'"));
    }
    auto [suffix, unique] = by_suffix.emplace(r.VariableSuffix(), r.name);
    if (!unique) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resources ", suffix->second, " and ", r.name,
          " would set the same container variables, RDMA_HCA_NAMES_", suffix->first,
          " and the like: give them names that differ in more than case and punctuation"));
    }
  }
  return absl::OkStatus();
}

}  // namespace rdp::deviceplugin
