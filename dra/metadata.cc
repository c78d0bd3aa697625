#include "dra/metadata.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "dra/cdi.h"
#include "serving/atomic_file.h"

namespace rdp::dra {
namespace {

constexpr char kMetadataFile[] = "metadata.json";
constexpr unsigned kMetadataMode = 0644;

nlohmann::json Devices(const std::string& driver, const std::vector<MetadataDevice>& devices) {
  nlohmann::json out = nlohmann::json::array();
  for (const MetadataDevice& d : devices) {
    nlohmann::json device = {{"driver", driver}, {"pool", d.pool}, {"name", d.name}};
    if (d.attributes.is_object() && !d.attributes.empty()) {
      nlohmann::json attributes = nlohmann::json::object();
      for (const auto& [key, value] : d.attributes.items()) {  // by name
        if (attributes.size() == kMaxMetadataAttributes) break;
        attributes[key] = value;
      }
      device["attributes"] = std::move(attributes);
    }
    if (d.network_data.is_object()) device["networkData"] = d.network_data;
    out.push_back(std::move(device));
  }
  return out;
}

}  // namespace

std::string MetadataContainerPath(const std::string& driver, const std::string& claim_name,
                                  const std::optional<std::string>& pod_claim_name,
                                  const std::string& base_request) {
  const bool templated = pod_claim_name && !pod_claim_name->empty();
  return absl::StrCat(kMetadataContainerDir, "/",
                      templated ? "resourceclaimtemplates" : "resourceclaims", "/",
                      templated ? *pod_claim_name : claim_name, "/", base_request, "/", driver,
                      "-metadata.json");
}

std::vector<nlohmann::json> BuildDeviceMetadata(const std::string& driver, const ClaimRef& claim,
                                                const std::optional<std::string>& pod_claim_name,
                                                const std::string& request,
                                                const std::vector<MetadataDevice>& devices,
                                                int64_t generation) {
  nlohmann::json body = {
      {"kind", "DeviceMetadata"},
      {"metadata",
       {{"name", claim.name}, {"namespace", claim.ns}, {"uid", claim.uid},
        {"generation", generation}}},
      {"requests", nlohmann::json::array({{{"name", request}, {"devices", Devices(driver, devices)}}})}};
  if (pod_claim_name) body["podClaimName"] = *pod_claim_name;
  std::vector<nlohmann::json> out;
  for (const char* version : kMetadataApiVersions) {
    nlohmann::json object = body;
    object["apiVersion"] = version;
    out.push_back(std::move(object));
  }
  return out;
}

std::string MetadataStream(const std::vector<nlohmann::json>& objects) {
  std::string out;
  for (const nlohmann::json& o : objects) {
    out += o.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  return out;
}

absl::StatusOr<std::vector<nlohmann::json>> ParseMetadataStream(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  // A stream reader parses one value and leaves the rest (after a closing brace: nothing read).
  while (in >> std::ws && in.peek() != std::char_traits<char>::eof()) {
    nlohmann::json o;
    try {
      in >> o;
    } catch (const nlohmann::json::exception& e) {
      return absl::DataLossError(absl::StrCat("not a stream of JSON objects: ", e.what()));
    }
    if (!o.is_object()) return absl::DataLossError("not a stream of JSON objects");
    out.push_back(std::move(o));
  }
  return out;
}

MetadataStore::MetadataStore(std::string dir) : dir_(std::move(dir)) {}

std::string MetadataStore::ClaimDir(const std::string& claim_uid) const {
  return (std::filesystem::path(dir_) / claim_uid).string();
}

std::string MetadataStore::PathOf(const std::string& claim_uid,
                                  const std::string& base_request) const {
  return (std::filesystem::path(ClaimDir(claim_uid)) / base_request / kMetadataFile).string();
}

absl::Status MetadataStore::Write(const std::string& claim_uid, const std::string& base_request,
                                  const std::string& content) const {
  const std::filesystem::path path = PathOf(claim_uid, base_request);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", path.parent_path().string(), ": ", ec.message()));
  }
  return serving::WriteFileAtomically(path.string(), content, kMetadataMode);
}

absl::StatusOr<std::string> MetadataStore::Read(const std::string& claim_uid,
                                                const std::string& base_request) const {
  return serving::ReadWholeFile(PathOf(claim_uid, base_request));
}

absl::Status MetadataStore::RemoveClaim(const std::string& claim_uid) const {
  const std::string dir = ClaimDir(claim_uid);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> MetadataStore::ListClaims() const {
  std::vector<std::string> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir_, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (ValidateClaimUid(name).ok()) out.push_back(std::move(name));
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir_, ": ", ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<std::string>> MetadataStore::RemoveTemporaryFiles(
    const std::string& claim_uid) const {
  std::vector<std::string> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(ClaimDir(claim_uid), ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    absl::StatusOr<std::vector<std::string>> removed = serving::RemoveTemporaryFiles(
        it->path().string(), [](std::string_view target) { return target == kMetadataFile; });
    if (!removed.ok()) return removed.status();
    out.insert(out.end(), removed->begin(), removed->end());
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list ", ClaimDir(claim_uid), ": ", ec.message()));
  }
  return out;
}

}  // namespace rdp::dra
