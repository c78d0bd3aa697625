#include "dra/claim_reader.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace rdp::dra {

namespace {

// A namespace or object name the API server could hold (a DNS subdomain's characters), so that
// nothing else ends up in the request path.
bool IsDnsName(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (const char c : s) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '.')) return false;
  }
  return true;
}

// results[i].<key>: a non-empty string, else InvalidArgument naming the claim and the field.
absl::StatusOr<std::string> RequiredString(const nlohmann::json& result, const char* key,
                                           const std::string& prefix, const std::string& where) {
  const auto it = result.find(key);
  if (it == result.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, where, ".", key,
                     it == result.end() ? " is missing" : " is not a non-empty string"));
  }
  return it->get<std::string>();
}

}  // namespace

absl::StatusOr<std::vector<AllocatedDevice>> ParseAllocation(const nlohmann::json& claim,
                                                             const std::string& driver,
                                                             const std::string& claim_name) {
  const std::string prefix = absl::StrCat("resourceclaim ", claim_name, ": ");
  const nlohmann::json* status = nullptr;
  if (claim.is_object()) {
    const auto it = claim.find("status");
    if (it != claim.end() && it->is_object()) status = &*it;
  }
  const auto allocation = status ? status->find("allocation") : nlohmann::json::const_iterator();
  if (status == nullptr || allocation == status->end() || allocation->is_null()) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, "not allocated (no status.allocation)"));
  }
  std::string where = "status.allocation";
  if (!allocation->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, where, " is not an object"));
  }
  std::vector<AllocatedDevice> out;
  const auto devices = allocation->find("devices");
  if (devices == allocation->end() || devices->is_null()) return out;
  where += ".devices";
  if (!devices->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, where, " is not an object"));
  }
  const auto results = devices->find("results");
  if (results == devices->end() || results->is_null()) return out;
  where += ".results";
  if (!results->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, where, " is not an array"));
  }
  for (std::size_t i = 0; i < results->size(); ++i) {
    const nlohmann::json& result = (*results)[i];
    const std::string at = absl::StrCat(where, "[", i, "]");
    if (!result.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, at, " is not an object"));
    }
    auto result_driver = RequiredString(result, "driver", prefix, at);
    if (!result_driver.ok()) return result_driver.status();
    // Another driver's results are its business: not checked further.
    if (*result_driver != driver) continue;
    AllocatedDevice device;
    for (auto [key, field] : {std::pair{"request", &device.request},
                              std::pair{"pool", &device.pool},
                              std::pair{"device", &device.device}}) {
      auto value = RequiredString(result, key, prefix, at);
      if (!value.ok()) return value.status();
      *field = *std::move(value);
    }
    out.push_back(std::move(device));
  }
  return out;
}

ApiClaimReader::ApiClaimReader(std::shared_ptr<KubeClient> client) : client_(std::move(client)) {}

absl::StatusOr<std::vector<AllocatedDevice>> ApiClaimReader::Read(const ClaimRef& ref,
                                                                  const std::string& driver,
                                                                  absl::Time deadline) {
  const std::string claim_name = absl::StrCat(ref.ns, "/", ref.name);
  if (!IsDnsName(ref.ns) || !IsDnsName(ref.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("resourceclaim \"", claim_name, "\": namespace or name is not a DNS name"));
  }
  auto response = client_->Get(absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", ref.ns,
                                            "/resourceclaims/", ref.name),
                               deadline);
  if (!response.ok()) {
    if (absl::IsNotFound(response.status())) {
      return absl::NotFoundError(absl::StrCat("resourceclaim ", claim_name, " (uid ", ref.uid,
                                              ") not found: ", response.status().message()));
    }
    return response.status();
  }
  const nlohmann::json& claim = response->body;
  std::string uid;
  if (claim.is_object() && claim.contains("metadata") && claim["metadata"].is_object() &&
      claim["metadata"].contains("uid") && claim["metadata"]["uid"].is_string()) {
    uid = claim["metadata"]["uid"].get<std::string>();
  }
  if (uid != ref.uid) {
    // Deleted and created again under the same name: the kubelet's claim is gone.
    return absl::NotFoundError(absl::StrCat("resourceclaim ", claim_name,
                                            ": the kubelet asked for uid ", ref.uid,
                                            ", the API server holds uid ",
                                            uid.empty() ? "(none)" : uid));
  }
  return ParseAllocation(claim, driver, claim_name);
}

}  // namespace rdp::dra
