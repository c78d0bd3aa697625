#include "dra/cdi.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "serving/atomic_file.h"

namespace rdp::dra {
namespace {

constexpr char kDevDir[] = "/dev/infiniband/";
constexpr unsigned kSpecMode = 0644;

// The sysfs class entry of a device node under /dev/infiniband, or "".
std::string SysfsDevFile(const std::string& dev_path) {
  const std::string prefix = kDevDir;
  if (dev_path.compare(0, prefix.size(), prefix) != 0) return "";
  const std::string node = dev_path.substr(prefix.size());
  if (node.empty() || node.find('/') != std::string::npos) return "";
  if (node == "rdma_cm") return "/sys/class/misc/rdma_cm/dev";
  if (absl::StartsWith(node, "uverbs")) {
    return absl::StrCat("/sys/class/infiniband_verbs/", node, "/dev");
  }
  if (absl::StartsWith(node, "umad") || absl::StartsWith(node, "issm")) {
    return absl::StrCat("/sys/class/infiniband_mad/", node, "/dev");
  }
  return "";
}

}  // namespace

std::string CdiDeviceName(const std::string& claim_uid, const std::string& request) {
  return absl::StrCat(claim_uid, "-", request);
}

std::string CdiDeviceId(const std::string& driver, const std::string& claim_uid,
                        const std::string& request) {
  return absl::StrCat(driver, "/", kCdiClass, "=", CdiDeviceName(claim_uid, request));
}

std::string MetadataCdiDeviceName(const std::string& claim_uid, const std::string& request) {
  return absl::StrCat(claim_uid, "_", request);
}

std::string MetadataCdiDeviceId(const std::string& driver, const std::string& claim_uid,
                                const std::string& request) {
  return absl::StrCat(driver, "/", kCdiClass, "=", MetadataCdiDeviceName(claim_uid, request));
}

std::string LegacyCdiDeviceId(const std::string& driver, const std::string& claim_uid) {
  return absl::StrCat(driver, "/", kCdiClass, "=", claim_uid);
}

std::string OwnVariableSuffix(const std::string& claim_uid, const std::string& request) {
  std::string out;
  for (const char c : claim_uid) {
    if (c != '-') out.push_back(absl::ascii_tolower(c));
  }
  out.push_back('_');
  for (const char c : request) out.push_back(c == '-' ? '_' : c);
  return out;
}

absl::Status ValidateClaimUid(std::string_view uid) {
  bool ok = uid.size() == 36;
  for (std::size_t i = 0; ok && i < uid.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    ok = dash ? uid[i] == '-' : absl::ascii_isxdigit(uid[i]);
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "claim uid \"", absl::CHexEscape(std::string(uid.substr(0, 64))),
      "\" is not a UUID (8-4-4-4-12 hex digits, as the API server gives every object)"));
}

std::string CdiSpecFileName(const std::string& driver, const std::string& claim_uid) {
  return absl::StrCat(driver, "-", kCdiClass, "_", claim_uid, ".json");
}

std::optional<DeviceNumber> ReadDeviceNumber(Env& env, const std::string& dev_path) {
  const std::string file = SysfsDevFile(dev_path);
  if (file.empty()) return std::nullopt;
  const std::optional<std::string> text = ReadAttribute(env, file);
  if (!text) return std::nullopt;
  const std::vector<std::string> parts = absl::StrSplit(*text, ':');
  DeviceNumber n;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &n.major) ||
      !absl::SimpleAtoi(parts[1], &n.minor) || n.major <= 0 || n.minor < 0) {
    return std::nullopt;
  }
  return n;
}

namespace {

nlohmann::json DeviceNodes(const hca::ContainerAllocation& allocation, Env& env) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const hca::ContainerAllocation::Spec& d : allocation.devices) {
    nlohmann::json node = {{"path", d.container_path}, {"type", "c"}};
    // host path = container path: left out (CDI takes path for both).
    if (!d.permissions.empty()) node["permissions"] = d.permissions;
    if (const std::optional<DeviceNumber> n = ReadDeviceNumber(env, d.host_path)) {
      node["major"] = n->major;
      node["minor"] = n->minor;
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

nlohmann::json Device(const std::string& name, nlohmann::json env, nlohmann::json nodes) {
  std::vector<std::string> sorted = env.get<std::vector<std::string>>();
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json edits = nlohmann::json::object();
  edits["env"] = sorted;
  edits["deviceNodes"] = std::move(nodes);
  nlohmann::json device = nlohmann::json::object();
  device["name"] = name;
  device["containerEdits"] = std::move(edits);
  return device;
}

nlohmann::json Spec(const std::string& driver, nlohmann::json devices) {
  nlohmann::json spec = nlohmann::json::object();
  spec["cdiVersion"] = kCdiVersion;
  spec["kind"] = absl::StrCat(driver, "/", kCdiClass);
  spec["devices"] = std::move(devices);
  return spec;
}

}  // namespace

nlohmann::json BuildCdiSpec(const std::string& driver, const std::string& claim_uid,
                            const std::vector<CdiRequest>& requests, Env& env) {
  nlohmann::json devices = nlohmann::json::array();
  for (const CdiRequest& r : requests) {
    nlohmann::json vars = nlohmann::json::array();
    const std::string suffix = OwnVariableSuffix(claim_uid, r.request);
    for (const auto& [key, value] : r.own.envs) {
      vars.push_back(absl::StrCat(hca::OwnVariableName(key, suffix), "=", value));
    }
    if (r.common) {
      for (const auto& [key, value] : *r.common) vars.push_back(absl::StrCat(key, "=", value));
    }
    nlohmann::json device =
        Device(CdiDeviceName(claim_uid, r.request), std::move(vars), DeviceNodes(r.own, env));
    if (r.common && r.allocation_file) {
      device["containerEdits"]["mounts"] = nlohmann::json::array(
          {{{"hostPath", *r.allocation_file},
            {"containerPath", hca::kAllocationFile},
            {"options", {"ro", "nosuid", "nodev", "bind"}}}});
    }
    devices.push_back(std::move(device));
    if (r.metadata) {
      nlohmann::json edits = nlohmann::json::object();
      edits["mounts"] = nlohmann::json::array({{{"hostPath", r.metadata->host_path},
                                                {"containerPath", r.metadata->container_path},
                                                {"options", {"ro", "bind"}}}});
      devices.push_back({{"name", MetadataCdiDeviceName(claim_uid, r.request)},
                         {"containerEdits", std::move(edits)}});
    }
  }
  return Spec(driver, std::move(devices));
}

nlohmann::json BuildLegacyCdiSpec(const std::string& driver, const std::string& claim_uid,
                                  const hca::ContainerAllocation& allocation, Env& env) {
  nlohmann::json vars = nlohmann::json::array();
  for (const auto& [key, value] : allocation.envs) vars.push_back(absl::StrCat(key, "=", value));
  return Spec(driver, nlohmann::json::array({Device(claim_uid, std::move(vars),
                                                    DeviceNodes(allocation, env))}));
}

CdiStore::CdiStore(std::string dir, std::string driver)
    : dir_(std::move(dir)), driver_(std::move(driver)) {}

std::string CdiStore::PathOf(const std::string& claim_uid) const {
  return (std::filesystem::path(dir_) / CdiSpecFileName(driver_, claim_uid)).string();
}

absl::Status CdiStore::Write(const std::string& claim_uid, const nlohmann::json& spec) const {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir_, ": ", ec.message()));
  return serving::WriteFileAtomically(
      PathOf(claim_uid),
      spec.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", kSpecMode);
}

absl::Status CdiStore::Remove(const std::string& claim_uid) const {
  return serving::RemoveFile(PathOf(claim_uid));
}

bool CdiStore::Exists(const std::string& claim_uid) const {
  struct stat st;
  return ::stat(PathOf(claim_uid).c_str(), &st) == 0;
}

absl::StatusOr<nlohmann::json> CdiStore::Read(const std::string& claim_uid) const {
  const std::string path = PathOf(claim_uid);
  absl::StatusOr<std::string> text = serving::ReadWholeFile(path);
  if (absl::IsNotFound(text.status())) return absl::NotFoundError(absl::StrCat("no CDI spec ", path));
  if (!text.ok()) return text.status();
  nlohmann::json spec = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded()) return absl::DataLossError(absl::StrCat(path, " is not JSON"));
  return spec;
}

namespace {

// The claim uid of one of the driver's spec file names ("<driver>-hca_<uid>.json"), or "".
std::string ClaimOfSpecFile(const std::string& driver, std::string_view file) {
  absl::string_view name(file.data(), file.size());
  const std::string prefix = absl::StrCat(driver, "-", kCdiClass, "_");
  if (!absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, ".json")) return "";
  return ValidateClaimUid(std::string_view(name.data(), name.size())).ok() ? std::string(name) : "";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CdiStore::ListClaims() const {
  std::vector<std::string> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir_, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::string uid = ClaimOfSpecFile(driver_, it->path().filename().string());
    if (!uid.empty()) out.push_back(std::move(uid));
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir_, ": ", ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<std::string>> CdiStore::RemoveTemporaryFiles() const {
  return serving::RemoveTemporaryFiles(dir_, [this](std::string_view target) {
    return !ClaimOfSpecFile(driver_, target).empty();
  });
}

}  // namespace rdp::dra
