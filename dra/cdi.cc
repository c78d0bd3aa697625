#include "dra/cdi.h"

#include <sys/stat.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dra/atomic_file.h"

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

std::string CdiDeviceId(const std::string& driver, const std::string& claim_uid) {
  return absl::StrCat(driver, "/", kCdiClass, "=", claim_uid);
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

nlohmann::json BuildCdiSpec(const std::string& driver, const std::string& claim_uid,
                            const hca::ContainerAllocation& allocation, Env& env) {
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
  nlohmann::json env_list = nlohmann::json::array();
  for (const auto& [key, value] : allocation.envs) {
    env_list.push_back(absl::StrCat(key, "=", value));
  }
  nlohmann::json edits = nlohmann::json::object();
  edits["env"] = std::move(env_list);
  edits["deviceNodes"] = std::move(nodes);
  nlohmann::json device = nlohmann::json::object();
  device["name"] = claim_uid;
  device["containerEdits"] = std::move(edits);
  nlohmann::json spec = nlohmann::json::object();
  spec["cdiVersion"] = kCdiVersion;
  spec["kind"] = absl::StrCat(driver, "/", kCdiClass);
  spec["devices"] = nlohmann::json::array({std::move(device)});
  return spec;
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
  return WriteFileAtomically(PathOf(claim_uid), spec.dump(2) + "\n", kSpecMode);
}

absl::Status CdiStore::Remove(const std::string& claim_uid) const {
  return RemoveFile(PathOf(claim_uid));
}

bool CdiStore::Exists(const std::string& claim_uid) const {
  struct stat st;
  return ::stat(PathOf(claim_uid).c_str(), &st) == 0;
}

}  // namespace rdp::dra
