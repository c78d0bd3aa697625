#pragma once

// An in-memory API server for the DRA driver's tests, holding Nodes, Pods, ResourceClaims and
// ResourceSlices the way kube-apiserver answers for them (status codes, resourceVersion
// conflicts, field selectors, a taint's timeAdded, omitted empty fields), served through
// kube/'s test Transport (test/kube/fakes.h).

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "kube/transport.h"
#include "nlohmann/json.hpp"
#include "test/kube/fakes.h"

namespace rdp::dra::testing {

using kube::HttpRequest;
using kube::HttpResponse;
using kube::testing::FuncTransport;
using kube::testing::Json;
using kube::testing::StatusBody;

// An API server in memory (any server URL). A mutex serialises the exchanges. Header-only, as the
// test target compiles only *_test.cc.
class FakeApiServer {
 public:
  struct Counters {
    int gets = 0, lists = 0, creates = 0, updates = 0, deletes = 0;
    int writes() const { return creates + updates + deletes; }
  };

  void AddNode(const std::string& name, const std::string& uid);
  void AddClaim(const nlohmann::json& claim);
  void AddPod(const nlohmann::json& pod);
  // Stores a slice as if someone had created it.
  void AddSlice(nlohmann::json slice);
  // The stored slices of `node` (all nodes when empty), by name.
  std::map<std::string, nlohmann::json> Slices(const std::string& node = "");
  Counters counters();
  // The next `n` PUTs of a slice or of a claim's status fail with 409 Conflict (another writer
  // got there first).
  void FailNextUpdates(int n);
  // The stored claim "<ns>/<name>" (null when there is none).
  nlohmann::json Claim(const std::string& key);
  // PUT .../resourceclaims/<name>/status drops status.devices, as a control plane with
  // DRAResourceClaimDeviceStatus off does.
  void DropClaimDeviceStatus(bool drop);
  // The next `n` exchanges about claims are answered with this status (500, 403, ...).
  void FailNextClaimRequests(int n, int status);
  // Every GET of a pod is answered 403 Forbidden while `refuse` (no RBAC get on pods).
  void RefusePods(bool refuse);
  // LIST answers at most this many items per page (0: all).
  void SetPageSize(int n);
  // Every write of a slice with a taint whose effect is None is refused (422 Invalid, the
  // message kube-apiserver gives) while `refuse`, as a control plane older than 1.35 does.
  void RefuseTaintEffectNone(bool refuse);
  // Applied to every slice stored, after pruning: a server-side normalisation.
  void SetNormalizer(std::function<void(nlohmann::json&)> normalize);

  // Serves the exchanges; its streams (watches) are `stream`'s when given.
  std::unique_ptr<kube::Transport> NewTransport(FuncTransport::StreamHandler stream = nullptr);
  absl::StatusOr<HttpResponse> Serve(const HttpRequest& request);

 private:
  HttpResponse ServeSlices(const std::string& method, const std::string& name,
                           const std::string& query, const nlohmann::json& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  nlohmann::json Store(nlohmann::json slice) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, nlohmann::json> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, nlohmann::json> claims_ ABSL_GUARDED_BY(mu_);  // "<ns>/<name>"
  std::map<std::string, nlohmann::json> pods_ ABSL_GUARDED_BY(mu_);    // "<ns>/<name>"
  std::map<std::string, nlohmann::json> slices_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  int fail_updates_ ABSL_GUARDED_BY(mu_) = 0;
  bool drop_device_status_ ABSL_GUARDED_BY(mu_) = false;
  int fail_claims_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_claims_status_ ABSL_GUARDED_BY(mu_) = 0;
  int page_size_ ABSL_GUARDED_BY(mu_) = 0;
  bool refuse_pods_ ABSL_GUARDED_BY(mu_) = false;
  bool refuse_effect_none_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(nlohmann::json&)> normalize_ ABSL_GUARDED_BY(mu_);
  std::int64_t version_ ABSL_GUARDED_BY(mu_) = 100;
};

}  // namespace rdp::dra::testing

// ---- FakeApiServer, inline ----

namespace rdp::dra::testing {

namespace fake_internal {

inline std::string Decode(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The query's parameters, decoded.
inline std::map<std::string, std::string> Query(const std::string& query) {
  std::map<std::string, std::string> out;
  std::size_t start = 0;
  while (start < query.size()) {
    std::size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    const std::string pair = query.substr(start, end - start);
    const std::size_t eq = pair.find('=');
    out[Decode(pair.substr(0, eq))] = eq == std::string::npos ? "" : Decode(pair.substr(eq + 1));
    start = end + 1;
  }
  return out;
}

// What the API server drops on storing (omitempty): nulls, empty lists and objects.
inline nlohmann::json Prune(const nlohmann::json& v) {
  if (v.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = v.begin(); it != v.end(); ++it) {
      nlohmann::json inner = Prune(it.value());
      if (inner.is_null() || ((inner.is_array() || inner.is_object()) && inner.empty())) continue;
      out[it.key()] = std::move(inner);
    }
    return out;
  }
  if (v.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : v) out.push_back(Prune(e));
    return out;
  }
  return v;
}

}  // namespace fake_internal

inline void FakeApiServer::AddNode(const std::string& name, const std::string& uid) {
  absl::MutexLock lock(&mu_);
  nodes_[name] = {{"apiVersion", "v1"},
                  {"kind", "Node"},
                  {"metadata", {{"name", name}, {"uid", uid}, {"resourceVersion", "1"}}}};
}

inline void FakeApiServer::AddClaim(const nlohmann::json& claim) {
  absl::MutexLock lock(&mu_);
  claims_[claim["metadata"]["namespace"].get<std::string>() + "/" +
          claim["metadata"]["name"].get<std::string>()] = claim;
}

inline nlohmann::json FakeApiServer::Claim(const std::string& key) {
  absl::MutexLock lock(&mu_);
  const auto it = claims_.find(key);
  return it == claims_.end() ? nlohmann::json() : it->second;
}

inline void FakeApiServer::DropClaimDeviceStatus(bool drop) {
  absl::MutexLock lock(&mu_);
  drop_device_status_ = drop;
}

inline void FakeApiServer::FailNextClaimRequests(int n, int status) {
  absl::MutexLock lock(&mu_);
  fail_claims_ = n;
  fail_claims_status_ = status;
}

inline void FakeApiServer::AddPod(const nlohmann::json& pod) {
  absl::MutexLock lock(&mu_);
  pods_[pod["metadata"]["namespace"].get<std::string>() + "/" +
        pod["metadata"]["name"].get<std::string>()] = pod;
}

inline void FakeApiServer::RefusePods(bool refuse) {
  absl::MutexLock lock(&mu_);
  refuse_pods_ = refuse;
}

inline void FakeApiServer::AddSlice(nlohmann::json slice) {
  absl::MutexLock lock(&mu_);
  Store(std::move(slice));
}

inline std::map<std::string, nlohmann::json> FakeApiServer::Slices(const std::string& node) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, nlohmann::json> out;
  for (const auto& [name, slice] : slices_) {
    if (node.empty() || slice["spec"].value("nodeName", "") == node) out[name] = slice;
  }
  return out;
}

inline FakeApiServer::Counters FakeApiServer::counters() {
  absl::MutexLock lock(&mu_);
  return counters_;
}

inline void FakeApiServer::FailNextUpdates(int n) {
  absl::MutexLock lock(&mu_);
  fail_updates_ = n;
}

inline void FakeApiServer::SetPageSize(int n) {
  absl::MutexLock lock(&mu_);
  page_size_ = n;
}

inline void FakeApiServer::RefuseTaintEffectNone(bool refuse) {
  absl::MutexLock lock(&mu_);
  refuse_effect_none_ = refuse;
}

inline void FakeApiServer::SetNormalizer(std::function<void(nlohmann::json&)> normalize) {
  absl::MutexLock lock(&mu_);
  normalize_ = std::move(normalize);
}

inline std::unique_ptr<kube::Transport> FakeApiServer::NewTransport(
    FuncTransport::StreamHandler stream) {
  auto t = std::make_unique<FuncTransport>(
      [this](const HttpRequest& request) { return Serve(request); });
  t->stream_handler = std::move(stream);
  return t;
}

// A stored copy: pruned, a uid, a new resourceVersion, timeAdded on taints without one.
inline nlohmann::json FakeApiServer::Store(nlohmann::json slice) {
  slice = fake_internal::Prune(slice);
  if (normalize_) normalize_(slice);
  const std::string name = slice["metadata"]["name"];
  if (!slice["metadata"].contains("uid")) slice["metadata"]["uid"] = "uid-" + name;
  slice["metadata"]["resourceVersion"] = std::to_string(++version_);
  if (slice["spec"].contains("devices")) {
    for (auto& device : slice["spec"]["devices"]) {
      if (!device.contains("taints")) continue;
      for (auto& taint : device["taints"]) {
        if (!taint.contains("timeAdded")) taint["timeAdded"] = "2026-12-04T10:00:00Z";
      }
    }
  }
  slices_[name] = slice;
  return slice;
}

inline HttpResponse FakeApiServer::ServeSlices(const std::string& method, const std::string& name,
                                               const std::string& query,
                                               const nlohmann::json& body) {
  const auto it = slices_.find(name);
  if (method == "GET" && name.empty()) {
    ++counters_.lists;
    auto params = fake_internal::Query(query);
    std::map<std::string, std::string> want;
    const std::string selector = params["fieldSelector"];
    for (std::size_t start = 0; start < selector.size();) {
      std::size_t end = selector.find(',', start);
      if (end == std::string::npos) end = selector.size();
      const std::string term = selector.substr(start, end - start);
      const std::size_t eq = term.find('=');
      want[term.substr(0, eq)] = term.substr(eq + 1);
      start = end + 1;
    }
    nlohmann::json items = nlohmann::json::array();
    for (const auto& [n, slice] : slices_) {
      bool match = true;
      for (const auto& [field, value] : want) {
        const std::string key = field.substr(field.find('.') + 1);  // spec.nodeName -> nodeName
        match = match && slice["spec"].value(key, "") == value;
      }
      if (!match) continue;
      items.push_back(slice);
    }
    const std::size_t from = params.count("continue") ? std::stoul(params["continue"]) : 0;
    nlohmann::json page = nlohmann::json::array();
    std::size_t i = from;
    for (; i < items.size() && (page_size_ == 0 || page.size() < std::size_t(page_size_)); ++i) {
      page.push_back(items[i]);
    }
    nlohmann::json meta = {{"resourceVersion", std::to_string(version_)}};
    if (i < items.size()) meta["continue"] = std::to_string(i);
    return Json(200, {{"kind", "ResourceSliceList"}, {"apiVersion", "resource.k8s.io/v1"},
                      {"metadata", meta}, {"items", page}});
  }
  if ((method == "POST" || method == "PUT") && refuse_effect_none_ && body.contains("spec") &&
      body["spec"].contains("devices")) {
    const auto& devices = body["spec"]["devices"];
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (!devices[i].contains("taints")) continue;
      for (std::size_t j = 0; j < devices[i]["taints"].size(); ++j) {
        if (devices[i]["taints"][j].value("effect", "") != "None") continue;
        return StatusBody(422, "Invalid",
                          "ResourceSlice.resource.k8s.io \"" +
                              body["metadata"].value("name", "") + "\" is invalid: spec.devices[" +
                              std::to_string(i) + "].taints[" + std::to_string(j) +
                              "].effect: Unsupported value: \"None\": supported values: "
                              "\"NoExecute\", \"NoSchedule\"");
      }
    }
  }
  if (method == "POST") {
    ++counters_.creates;
    const std::string new_name = body["metadata"]["name"];
    if (slices_.count(new_name)) {
      return StatusBody(409, "AlreadyExists", "resourceslices \"" + new_name + "\" already exists");
    }
    if (body["metadata"].contains("resourceVersion")) {
      return StatusBody(500, "InternalError",
                        "resourceVersion should not be set on objects to be created");
    }
    return Json(201, Store(body));
  }
  if (it == slices_.end()) {
    return StatusBody(404, "NotFound", "resourceslices.resource.k8s.io \"" + name + "\" not found");
  }
  if (method == "GET") {
    ++counters_.gets;
    return Json(200, it->second);
  }
  if (method == "PUT") {
    ++counters_.updates;
    const std::string version = body["metadata"].value("resourceVersion", "");
    if (fail_updates_ > 0 || version != it->second["metadata"]["resourceVersion"]) {
      if (fail_updates_ > 0) --fail_updates_;
      return StatusBody(409, "Conflict",
                        "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"" +
                            name + "\": the object has been modified");
    }
    nlohmann::json stored = body;
    stored["metadata"]["uid"] = it->second["metadata"]["uid"];
    return Json(200, Store(stored));
  }
  if (method == "DELETE") {
    ++counters_.deletes;
    if (body.is_object() && body.contains("preconditions") &&
        body["preconditions"].value("uid", "") != it->second["metadata"]["uid"]) {
      return StatusBody(409, "Conflict", "Precondition failed: UID in precondition");
    }
    nlohmann::json gone = it->second;
    slices_.erase(it);
    return Json(200, gone);
  }
  return StatusBody(405, "MethodNotAllowed", method);
}

inline absl::StatusOr<HttpResponse> FakeApiServer::Serve(const HttpRequest& request) {
  absl::MutexLock lock(&mu_);
  // "https://host" + path [+ "?" query]
  const std::size_t path_start = request.url.find('/', std::string("https://").size());
  std::string path = request.url.substr(path_start);
  std::string query;
  if (const std::size_t q = path.find('?'); q != std::string::npos) {
    query = path.substr(q + 1);
    path = path.substr(0, q);
  }
  const nlohmann::json body =
      request.body.empty() ? nlohmann::json() : nlohmann::json::parse(request.body);
  const std::string kNodes = "/api/v1/nodes/";
  const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";
  const std::string kClaims = "/apis/resource.k8s.io/v1/namespaces/";
  if (path.rfind(kNodes, 0) == 0 && request.method == "GET") {
    ++counters_.gets;
    const auto it = nodes_.find(fake_internal::Decode(path.substr(kNodes.size())));
    if (it == nodes_.end()) {
      return StatusBody(404, "NotFound", "nodes \"" + path.substr(kNodes.size()) + "\" not found");
    }
    return Json(200, it->second);
  }
  const std::string kPods = "/api/v1/namespaces/";
  if (path.rfind(kPods, 0) == 0 && request.method == "GET") {
    ++counters_.gets;
    // <ns>/pods/<name>
    const std::string rest = path.substr(kPods.size());
    const std::string key = rest.substr(0, rest.find('/')) + "/" + rest.substr(rest.rfind('/') + 1);
    if (refuse_pods_) {
      return StatusBody(403, "Forbidden",
                        "pods \"" + key.substr(key.find('/') + 1) +
                            "\" is forbidden: User \"system:serviceaccount:kube-system:rdp\" "
                            "cannot get resource \"pods\" in API group \"\" in the namespace \"" +
                            key.substr(0, key.find('/')) + "\"");
    }
    const auto it = pods_.find(key);
    if (it == pods_.end()) return StatusBody(404, "NotFound", "pods \"" + key + "\" not found");
    return Json(200, it->second);
  }
  if (path == kSlices) return ServeSlices(request.method, "", query, body);
  if (path.rfind(kSlices + "/", 0) == 0) {
    const std::string name = fake_internal::Decode(path.substr(kSlices.size() + 1));
    return ServeSlices(request.method, name, query, body);
  }
  if (path.rfind(kClaims, 0) == 0 && path.find("/resourceclaims/") != std::string::npos) {
    if (fail_claims_ > 0) {
      --fail_claims_;
      return StatusBody(fail_claims_status_, "InternalError", "injected failure");
    }
    // <ns>/resourceclaims/<name>[/status]
    std::vector<std::string> parts;
    for (std::size_t start = kClaims.size(), end; start <= path.size(); start = end + 1) {
      end = std::min(path.find('/', start), path.size());
      parts.push_back(fake_internal::Decode(path.substr(start, end - start)));
    }
    const bool status = parts.size() == 4 && parts[3] == "status";
    if (parts.size() < 3 || parts[1] != "resourceclaims" || (parts.size() == 4 && !status) ||
        parts.size() > 4) {
      return StatusBody(404, "NotFound", "the server could not find the requested resource");
    }
    const std::string key = parts[0] + "/" + parts[2];
    const auto it = claims_.find(key);
    if (it == claims_.end()) {
      return StatusBody(404, "NotFound", "resourceclaims \"" + key + "\" not found");
    }
    if (request.method == "GET") {
      ++counters_.gets;
      return Json(200, it->second);
    }
    if (request.method != "PUT" || !status) return StatusBody(405, "MethodNotAllowed", request.method);
    ++counters_.updates;
    nlohmann::json& stored = it->second;
    const std::string version = body["metadata"].value("resourceVersion", "");
    if (fail_updates_ > 0 || version != stored["metadata"].value("resourceVersion", "")) {
      if (fail_updates_ > 0) --fail_updates_;
      return StatusBody(409, "Conflict",
                        "Operation cannot be fulfilled on resourceclaims.resource.k8s.io \"" +
                            parts[2] + "\": the object has been modified");
    }
    if (body["metadata"].value("uid", "") != stored["metadata"].value("uid", "")) {
      return StatusBody(422, "Invalid", "metadata.uid: field is immutable");
    }
    // The status subresource: only the status changes.
    stored["status"] = body.value("status", nlohmann::json::object());
    if (drop_device_status_) stored["status"].erase("devices");
    stored["metadata"]["resourceVersion"] = std::to_string(++version_);
    return Json(200, stored);
  }
  return StatusBody(404, "NotFound", "the server could not find the requested resource");
}

}  // namespace rdp::dra::testing
