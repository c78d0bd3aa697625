#include "dra/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "serving/atomic_file.h"
#include "nlohmann/json.hpp"

namespace rdp::dra {
namespace {

constexpr int kVersion = 2;
constexpr int kLegacyVersion = 1;  // one CDI device per claim
constexpr unsigned kMode = 0600;

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

nlohmann::json ToJson(const PreparedClaim& c) {
  nlohmann::json devices = nlohmann::json::array();
  for (const AllocatedDevice& d : c.devices) {
    nlohmann::json device = {{"request", d.request}, {"pool", d.pool}, {"device", d.device}};
    if (!d.share_id.empty()) device["shareID"] = d.share_id;
    if (!d.consumed_capacity.empty()) device["consumedCapacity"] = d.consumed_capacity;
    if (d.admin_access) device["adminAccess"] = true;
    devices.push_back(std::move(device));
  }
  nlohmann::json out = {{"namespace", c.ref.ns}, {"name", c.ref.name}, {"devices", std::move(devices)}};
  if (!c.common.empty()) out["common"] = c.common;
  if (!c.pod_env.empty()) out["podEnv"] = c.pod_env;
  if (c.legacy) out["layout"] = "claim";
  if (c.pod_claim_name) out["podClaimName"] = *c.pod_claim_name;
  if (c.prepared_at != absl::InfinitePast()) {
    out["preparedAt"] = absl::FormatTime(absl::RFC3339_full, c.prepared_at, absl::UTCTimeZone());
  }
  return out;
}

bool IsString(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_string() && !j[key].get<std::string>().empty();
}

bool IsStringList(const nlohmann::json& j) {
  return j.is_array() && std::all_of(j.begin(), j.end(), [](const auto& e) { return e.is_string(); });
}

// j[key] as {"<request>": ["<string>", ...]}; none when j has no key.
absl::StatusOr<std::map<std::string, std::vector<std::string>>> ListsByRequest(
    const std::string& uid, const nlohmann::json& j, const char* key) {
  std::map<std::string, std::vector<std::string>> out;
  if (!j.contains(key)) return out;
  const absl::Status malformed =
      absl::InvalidArgumentError(absl::StrCat("entry ", uid, " has a malformed ", key));
  if (!j[key].is_object()) return malformed;
  for (const auto& [request, list] : j[key].items()) {
    if (!IsStringList(list)) return malformed;
    out[request] = list.get<std::vector<std::string>>();
  }
  return out;
}

// One entry of a checkpoint of `version`, or why it is not valid.
absl::StatusOr<PreparedClaim> FromJson(const std::string& uid, const nlohmann::json& j,
                                       int version) {
  if (uid.empty()) return absl::InvalidArgumentError("an entry without uid");
  if (!j.is_object() || !IsString(j, "namespace") || !IsString(j, "name") ||
      !j.contains("devices") || !j["devices"].is_array() ||
      (version == kLegacyVersion && (!j.contains("cdiDeviceIds") || !IsStringList(j["cdiDeviceIds"])))) {
    return absl::InvalidArgumentError(absl::StrCat("entry ", uid, " is malformed"));
  }
  PreparedClaim c;
  c.ref = {j["namespace"].get<std::string>(), uid, j["name"].get<std::string>()};
  for (const nlohmann::json& d : j["devices"]) {
    if (!d.is_object() || !d.contains("request") || !d["request"].is_string() ||
        !IsString(d, "pool") || !IsString(d, "device")) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", uid, " has a malformed device"));
    }
    AllocatedDevice device{d["request"].get<std::string>(), d["pool"].get<std::string>(),
                           d["device"].get<std::string>()};
    if (d.contains("shareID") && d["shareID"].is_string()) device.share_id = d["shareID"];
    if (d.contains("consumedCapacity")) {
      const nlohmann::json& consumed = d["consumedCapacity"];
      if (!consumed.is_object() ||
          !std::all_of(consumed.begin(), consumed.end(), [](const auto& q) { return q.is_string(); })) {
        return absl::InvalidArgumentError(
            absl::StrCat("entry ", uid, " has a malformed consumedCapacity"));
      }
      device.consumed_capacity = consumed.get<std::map<std::string, std::string>>();
    }
    if (d.contains("adminAccess")) {
      if (!d["adminAccess"].is_boolean()) {
        return absl::InvalidArgumentError(
            absl::StrCat("entry ", uid, " has a malformed adminAccess"));
      }
      device.admin_access = d["adminAccess"].get<bool>();
    }
    c.devices.push_back(std::move(device));
  }
  if (j.contains("preparedAt")) {
    std::string err;
    if (!j["preparedAt"].is_string() ||
        !absl::ParseTime(absl::RFC3339_full, j["preparedAt"].get<std::string>(), &c.prepared_at,
                         &err)) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", uid, " has a malformed preparedAt"));
    }
  }
  if (j.contains("podClaimName")) {
    if (!j["podClaimName"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", uid, " has a malformed podClaimName"));
    }
    c.pod_claim_name = j["podClaimName"].get<std::string>();
  }
  if (version == kLegacyVersion) {
    c.legacy = true;
    return c;
  }
  c.legacy = j.value("layout", "") == "claim";
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> common =
      ListsByRequest(uid, j, "common");
  if (!common.ok()) return common.status();
  c.common = *std::move(common);
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> pod_env =
      ListsByRequest(uid, j, "podEnv");
  if (!pod_env.ok()) return pod_env.status();
  for (const auto& [request, names] : *pod_env) c.pod_env[request].insert(names.begin(), names.end());
  return c;
}

}  // namespace

Checkpoint::Checkpoint(std::string path) : path_(std::move(path)) {}

absl::StatusOr<PreparedClaims> Checkpoint::Load() {
  const std::filesystem::path path(path_);
  const std::string name = path.filename().string();
  absl::StatusOr<std::vector<std::string>> leftovers = serving::RemoveTemporaryFiles(
      path.parent_path().string(), [&name](std::string_view target) { return target == name; });
  if (!leftovers.ok()) return leftovers.status();
  for (const std::string& file : *leftovers) {
    Log()->warn("removed {}: the temporary file of a checkpoint write that did not finish", file);
  }
  written_ = absl::InfinitePast();
  std::ifstream in(path_);
  if (!in) {
    if (errno == ENOENT) return PreparedClaims{};
    return absl::InternalError(absl::StrCat("cannot read ", path_, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  // Now when the file cannot be stat'ed: a later bound keeps more claims.
  struct stat st {};
  written_ = ::stat(path_.c_str(), &st) == 0 ? absl::TimeFromTimespec(st.st_mtim) : absl::Now();
  PreparedClaims out;
  std::vector<std::string> problems;
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    problems.push_back("not JSON");
  } else if (!j.is_object() || !j.contains("version") ||
             (j["version"] != kVersion && j["version"] != kLegacyVersion)) {
    problems.push_back(absl::StrCat("not a version ", kVersion, " (or ", kLegacyVersion,
                                    ") checkpoint"));
  } else if (!j.contains("claims") || !j["claims"].is_object()) {
    problems.push_back("no claims object");
  } else {
    for (const auto& [uid, entry] : j["claims"].items()) {
      absl::StatusOr<PreparedClaim> c = FromJson(uid, entry, j["version"].get<int>());
      if (c.ok()) {
        out.emplace(uid, *std::move(c));
      } else {
        problems.push_back(std::string(c.status().message()));
      }
    }
  }
  if (problems.empty()) return out;
  const std::string aside =
      absl::StrCat(path_, ".corrupt-", absl::ToUnixNanos(absl::Now()));
  if (std::rename(path_.c_str(), aside.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("checkpoint ", path_, " is corrupt (",
                                            problems.front(), ") and cannot be moved aside: ",
                                            std::strerror(errno)));
  }
  Log()->error(
      "checkpoint {} is corrupt ({}; {} problem(s)); moved it to {} and go on with the {} "
      "claim(s) that could be read",
      path_, problems.front(), problems.size(), aside, out.size());
  return out;
}

absl::Status Checkpoint::Save(const PreparedClaims& claims) {
  nlohmann::json all = nlohmann::json::object();
  for (const auto& [uid, c] : claims) all[uid] = ToJson(c);
  const nlohmann::json doc = {{"version", kVersion}, {"claims", std::move(all)}};
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create the directory of ", path_));
  return serving::WriteFileAtomically(path_, doc.dump(1) + "\n", kMode);
}

}  // namespace rdp::dra
