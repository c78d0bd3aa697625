#include "dra/claim_reader.h"

#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace rdp::dra {

namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

// What the driver does without the pods' specs (docs/dra.md, "Reading pods").
constexpr char kWithoutPods[] =
    "the CDI devices of prepared claims set only each request's own variables "
    "(NCCL_IB_HCA_<claim>_<request>, RDMA_HCA_NAMES_..., RDMA_HCA_PCI_...), not the common "
    "NCCL_IB_HCA, RDMA_HCA_NAMES, RDMA_HCA_PCI nor /etc/rdma/allocation.json: which HCAs each "
    "container holds, and which of those variables its pod spec sets itself, are in the specs "
    "of the pods the claims are reserved for";

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

// obj[key] when it is a string, else "".
std::string Str(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) return "";
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

// obj[key] when it is an array, else an empty one.
const nlohmann::json& Array(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json kEmpty = nlohmann::json::array();
  if (!obj.is_object()) return kEmpty;
  const auto it = obj.find(key);
  return it != obj.end() && it->is_array() ? *it : kEmpty;
}

const nlohmann::json& Object(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  if (!obj.is_object()) return kEmpty;
  const auto it = obj.find(key);
  return it != obj.end() && it->is_object() ? *it : kEmpty;
}

// The pods of status.reservedFor (other consumers, e.g. a controller's objects, are left out).
std::vector<PodRef> ReservedPods(const nlohmann::json& claim) {
  std::vector<PodRef> out;
  const std::string ns = Str(Object(claim, "metadata"), "namespace");
  for (const nlohmann::json& r : Array(Object(claim, "status"), "reservedFor")) {
    if (Str(r, "resource") != "pods" || !Str(r, "apiGroup").empty()) continue;
    PodRef pod{ns, Str(r, "name"), Str(r, "uid")};
    if (!pod.name.empty()) out.push_back(std::move(pod));
  }
  return out;
}

absl::StatusOr<std::vector<AllocatedDevice>> ParseResults(const nlohmann::json& claim,
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
    if (const auto share = result.find("shareID"); share != result.end() && !share->is_null()) {
      if (!share->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(prefix, at, ".shareID is not a string"));
      }
      device.share_id = share->get<std::string>();
    }
    if (const auto consumed = result.find("consumedCapacity");
        consumed != result.end() && !consumed->is_null()) {
      if (!consumed->is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, at, ".consumedCapacity is not an object"));
      }
      for (const auto& [name, quantity] : consumed->items()) {
        if (name.empty() || !quantity.is_string() || quantity.get<std::string>().empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              prefix, at, ".consumedCapacity[\"", name, "\"] is not a quantity string"));
        }
        device.consumed_capacity[name] = quantity.get<std::string>();
      }
    }
    // Absent (a control plane without the field, or not an admin claim) or null: not admin.
    if (const auto admin = result.find("adminAccess"); admin != result.end() && !admin->is_null()) {
      if (!admin->is_boolean()) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, at, ".adminAccess is not a boolean"));
      }
      device.admin_access = admin->get<bool>();
    }
    out.push_back(std::move(device));
  }
  return out;
}

}  // namespace

absl::StatusOr<ClaimAllocation> ParseClaim(const nlohmann::json& claim, const std::string& driver,
                                           const std::string& claim_name) {
  absl::StatusOr<std::vector<AllocatedDevice>> devices = ParseResults(claim, driver, claim_name);
  if (!devices.ok()) return devices.status();
  ClaimAllocation out;
  out.uid = Str(Object(claim, "metadata"), "uid");
  out.devices = *std::move(devices);
  out.reserved_for = ReservedPods(claim);
  const nlohmann::json& annotations = Object(Object(claim, "metadata"), "annotations");
  if (const auto it = annotations.find(kPodClaimNameAnnotation);
      it != annotations.end() && it->is_string()) {
    out.pod_claim_name = it->get<std::string>();
  }
  return out;
}

PodClaims ParsePodClaims(const nlohmann::json& pod) {
  PodClaims out;
  const nlohmann::json& meta = Object(pod, "metadata");
  out.pod = {Str(meta, "namespace"), Str(meta, "name"), Str(meta, "uid")};
  const nlohmann::json& spec = Object(pod, "spec");
  const nlohmann::json& status = Object(pod, "status");
  // spec.resourceClaims[].name -> the ResourceClaim's name: given, or made from a template
  // (status.resourceClaimStatuses; null there: no claim was needed).
  std::map<std::string, std::string> claim_of;
  for (const nlohmann::json& c : Array(spec, "resourceClaims")) {
    if (const std::string named = Str(c, "resourceClaimName"); !named.empty()) {
      claim_of[Str(c, "name")] = named;
    }
  }
  for (const nlohmann::json& c : Array(status, "resourceClaimStatuses")) {
    if (const std::string made = Str(c, "resourceClaimName"); !made.empty()) {
      claim_of.emplace(Str(c, "name"), made);
    }
  }
  const nlohmann::json& extended = Object(status, "extendedResourceClaimStatus");
  const std::string extended_claim = Str(extended, "resourceClaimName");
  for (const char* list : {"initContainers", "containers"}) {
    for (const nlohmann::json& c : Array(spec, list)) {
      PodClaims::Container container;
      container.name = Str(c, "name");
      for (const nlohmann::json& e : Array(c, "env")) {
        if (std::string name = Str(e, "name"); !name.empty()) container.env.push_back(std::move(name));
      }
      for (const nlohmann::json& use : Array(Object(c, "resources"), "claims")) {
        const auto it = claim_of.find(Str(use, "name"));
        if (it != claim_of.end()) container.uses.push_back({it->second, Str(use, "request")});
      }
      if (!extended_claim.empty()) {
        for (const nlohmann::json& m : Array(extended, "requestMappings")) {
          if (Str(m, "containerName") == container.name && !Str(m, "requestName").empty()) {
            container.uses.push_back({extended_claim, Str(m, "requestName")});
          }
        }
      }
      out.containers.push_back(std::move(container));
    }
  }
  return out;
}

ApiClaimReader::ApiClaimReader(std::shared_ptr<kube::Client> client, PodReads pods)
    : client_(std::move(client)), pods_(std::move(pods)) {}

absl::StatusOr<ClaimAllocation> ApiClaimReader::Read(const ClaimRef& ref,
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
  if (!ref.uid.empty() && uid != ref.uid) {
    // Deleted and created again under the same name: the kubelet's claim is gone.
    return absl::NotFoundError(absl::StrCat("resourceclaim ", claim_name,
                                            ": the kubelet asked for uid ", ref.uid,
                                            ", the API server holds uid ",
                                            uid.empty() ? "(none)" : uid));
  }
  return ParseClaim(claim, driver, claim_name);
}

absl::StatusOr<PodClaims> ApiClaimReader::ReadPod(const PodRef& pod, absl::Time deadline) {
  const std::string pod_name = absl::StrCat(pod.ns, "/", pod.name);
  if (!pods_.enabled) {
    absl::Status off = absl::PermissionDeniedError(
        absl::StrCat("pod ", pod_name, ": not read (--read-pods=false)"));
    PodsRefused(off);
    return off;
  }
  if (!IsDnsName(pod.ns) || !IsDnsName(pod.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod \"", pod_name, "\": namespace or name is not a DNS name"));
  }
  auto response =
      client_->Get(absl::StrCat("/api/v1/namespaces/", pod.ns, "/pods/", pod.name), deadline);
  if (!response.ok()) {
    if (absl::IsPermissionDenied(response.status())) PodsRefused(response.status());
    return response.status();
  }
  if (pods_refused_.exchange(false)) {
    Log()->info("pods can be read again: the CDI devices of claims prepared from now on set the "
                "common variables again where they can");
  }
  PodClaims out = ParsePodClaims(response->body);
  if (!pod.uid.empty() && out.pod.uid != pod.uid) {
    return absl::NotFoundError(absl::StrCat("pod ", pod_name, ": uid ", pod.uid,
                                            " was asked for, the API server holds uid ",
                                            out.pod.uid.empty() ? "(none)" : out.pod.uid));
  }
  const std::string node = Str(Object(response->body, "spec"), "nodeName");
  if (!pods_.node.empty() && !node.empty() && node != pods_.node) {
    return absl::NotFoundError(absl::StrCat("pod ", pod_name, " is bound to node ", node,
                                            ", not to this node ", pods_.node,
                                            ": its spec is not used"));
  }
  return out;
}

void ApiClaimReader::PodsRefused(const absl::Status& why) {
  if (pods_refused_.exchange(true)) return;
  if (!pods_.enabled) {
    Log()->warn("pods are not read (--read-pods=false; the chart's dra.readPods: false grants no "
                "RBAC get on pods): {}. Said once",
                kWithoutPods);
  } else {
    Log()->warn("the API server refuses this driver's ServiceAccount RBAC get on pods ({}): {}. "
                "Grant it (the chart's dra.readPods: true) or run with --read-pods=false. Said "
                "once, until a pod read succeeds",
                std::string(why.message()), kWithoutPods);
  }
}

}  // namespace rdp::dra
