#include "dra/slice_publisher.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace rdp::dra {

namespace {

constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices";
// Rounds of list + writes; each round after the first follows a conflict with another writer.
constexpr int kMaxRounds = 4;

// `v` without what the API server drops when it stores an object (omitempty): nulls, empty
// lists and objects, recursively.
nlohmann::json Pruned(const nlohmann::json& v) {
  if (v.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = v.begin(); it != v.end(); ++it) {
      nlohmann::json inner = Pruned(it.value());
      if (inner.is_null() || ((inner.is_array() || inner.is_object()) && inner.empty())) continue;
      out[it.key()] = std::move(inner);
    }
    return out;
  }
  if (v.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : v) out.push_back(Pruned(e));
    return out;
  }
  return v;
}

const nlohmann::json& Field(const nlohmann::json& obj, std::initializer_list<const char*> path) {
  static const nlohmann::json kNull;
  const nlohmann::json* at = &obj;
  for (const char* key : path) {
    if (!at->is_object()) return kNull;
    const auto it = at->find(key);
    if (it == at->end()) return kNull;
    at = &*it;
  }
  return *at;
}

std::string Name(const nlohmann::json& slice) {
  const auto& name = Field(slice, {"metadata", "name"});
  return name.is_string() ? name.get<std::string>() : "";
}

std::int64_t Generation(const nlohmann::json& slice) {
  const auto& g = Field(slice, {"spec", "pool", "generation"});
  return g.is_number_integer() ? g.get<std::int64_t>() : 0;
}

// What Publish owns of a slice, as the server would store it.
nlohmann::json Comparable(const nlohmann::json& slice) {
  return Pruned({{"spec", Field(slice, {"spec"})},
                 {"ownerReferences", Field(slice, {"metadata", "ownerReferences"})},
                 {"labels", Field(slice, {"metadata", "labels"})},
                 {"annotations", Field(slice, {"metadata", "annotations"})}});
}

using TaintKey = std::tuple<std::string, std::string, std::string, std::string>;

TaintKey KeyOf(const std::string& device, const nlohmann::json& taint) {
  auto str = [&](const char* k) {
    const auto it = taint.find(k);
    return it != taint.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  return {device, str("key"), str("value"), str("effect")};
}

// The API server stamps timeAdded on a taint written without one; a taint the server already
// holds keeps its time, so that the desired object equals the stored one and the time says when
// the taint appeared.
void CarryTaintTimes(nlohmann::json& slice, const std::map<TaintKey, nlohmann::json>& times) {
  auto& devices = slice["spec"]["devices"];
  if (!devices.is_array()) return;
  for (auto& device : devices) {
    if (!device.is_object() || !device.contains("taints") || !device["taints"].is_array()) continue;
    const std::string name = device.value("name", "");
    for (auto& taint : device["taints"]) {
      if (!taint.is_object() || taint.contains("timeAdded")) continue;
      const auto it = times.find(KeyOf(name, taint));
      if (it != times.end()) taint["timeAdded"] = it->second;
    }
  }
}

std::map<TaintKey, nlohmann::json> TaintTimes(const std::vector<nlohmann::json>& slices) {
  std::map<TaintKey, nlohmann::json> times;
  for (const auto& slice : slices) {
    const auto& devices = Field(slice, {"spec", "devices"});
    if (!devices.is_array()) continue;
    for (const auto& device : devices) {
      const auto& taints = Field(device, {"taints"});
      if (!taints.is_array()) continue;
      for (const auto& taint : taints) {
        if (taint.is_object() && taint.contains("timeAdded")) {
          times.emplace(KeyOf(device.value("name", ""), taint), taint["timeAdded"]);
        }
      }
    }
  }
  return times;
}

// A desired slice made ready to write, and what it asks for before the server's taint times
// were carried into it (as AppliedSlice records it: the server may stamp a time we never sent).
struct Wanted {
  nlohmann::json object;
  nlohmann::json asked;
};

// `desired` with the pool's generation, the Node as owner and the taint times the server holds.
std::vector<Wanted> Stamped(const std::vector<nlohmann::json>& desired, std::int64_t generation,
                            const std::string& node_name, const std::string& node_uid,
                            const std::map<TaintKey, nlohmann::json>& times) {
  std::vector<Wanted> out;
  for (nlohmann::json slice : desired) {
    slice["spec"]["pool"]["generation"] = generation;
    if (!node_uid.empty()) {
      slice["metadata"]["ownerReferences"] = nlohmann::json::array({{{"apiVersion", "v1"},
                                                                     {"kind", "Node"},
                                                                     {"name", node_name},
                                                                     {"uid", node_uid},
                                                                     {"controller", true}}});
    }
    nlohmann::json asked = Comparable(slice);
    CarryTaintTimes(slice, times);
    out.push_back({std::move(slice), std::move(asked)});
  }
  return out;
}

bool Empty(const nlohmann::json& v) {
  return v.is_null() || ((v.is_array() || v.is_object()) && v.empty());
}

}  // namespace

std::vector<std::string> DroppedFields(const nlohmann::json& sent, const nlohmann::json& answer) {
  std::vector<std::string> out;
  const nlohmann::json& sent_spec = Field(sent, {"spec"});
  const nlohmann::json& answer_spec = Field(answer, {"spec"});
  if (!sent_spec.is_object()) return out;
  for (auto it = sent_spec.begin(); it != sent_spec.end(); ++it) {
    if (!Empty(it.value()) && !answer_spec.contains(it.key())) out.push_back(it.key());
  }
  const nlohmann::json& sent_devices = Field(sent_spec, {"devices"});
  const nlohmann::json& answer_devices = Field(answer_spec, {"devices"});
  if (!sent_devices.is_array() || !answer_devices.is_array()) return out;
  std::map<std::string, const nlohmann::json*> held;
  for (const auto& d : answer_devices) {
    if (d.is_object()) held[d.value("name", "")] = &d;
  }
  std::set<std::string> keys;
  for (const auto& d : sent_devices) {
    if (!d.is_object()) continue;
    const auto it = held.find(d.value("name", ""));
    if (it == held.end()) continue;
    for (auto k = d.begin(); k != d.end(); ++k) {
      if (!Empty(k.value()) && !it->second->contains(k.key())) keys.insert(k.key());
    }
    // A capacity's requestPolicy goes while the capacity stays (DRAConsumableCapacity off).
    const nlohmann::json& held_capacity = Field(*it->second, {"capacity"});
    const nlohmann::json& sent_capacity = Field(d, {"capacity"});
    if (!sent_capacity.is_object() || !held_capacity.is_object()) continue;
    for (auto c = sent_capacity.begin(); c != sent_capacity.end(); ++c) {
      const nlohmann::json& policy = Field(c.value(), {"requestPolicy"});
      if (!Empty(policy) && held_capacity.contains(c.key()) &&
          Empty(Field(held_capacity[c.key()], {"requestPolicy"}))) {
        keys.insert(kCapacityRequestPolicyField);
      }
    }
  }
  for (const std::string& k : keys) out.push_back("devices[]." + k);
  return out;
}

std::string FeatureGateOf(const std::string& field) {
  static const std::map<std::string, std::string> kGates = {
      {"devices[].taints", "DRADeviceTaints"},
      {"devices[].allowMultipleAllocations", "DRAConsumableCapacity"},
      {"devices[].capacity", "DRAConsumableCapacity"},
      {std::string("devices[].") + kCapacityRequestPolicyField, "DRAConsumableCapacity"},
      {"devices[].bindsToNode", "DRADeviceBindingConditions"},
      {"devices[].bindingConditions", "DRADeviceBindingConditions"},
      {"devices[].consumesCounters", "DRAPartitionableDevices"},
      {"sharedCounters", "DRAPartitionableDevices"},
      {"perDeviceNodeSelection", "DRAPartitionableDevices"},
  };
  const auto it = kGates.find(field);
  return it != kGates.end() ? it->second : "";
}

bool RefusesTaintEffectNone(const absl::Status& status) {
  // kube-apiserver's field.NotSupported for spec.devices[i].taints[j].effect:
  // `...taints[0].effect: Unsupported value: "None": supported values: "NoExecute", "NoSchedule"`
  return absl::IsInvalidArgument(status) && absl::StrContains(status.message(), "taints[") &&
         absl::StrContains(status.message(), "].effect: Unsupported value: \"None\"");
}

SlicePlan PlanPool(const std::vector<nlohmann::json>& desired,
                   const std::vector<nlohmann::json>& existing, const std::string& pool_name,
                   const std::string& node_name, const std::string& node_uid,
                   const AppliedSlices& applied) {
  // Whether the server's slice `held` is `want`.
  auto holds = [&applied](const nlohmann::json& held, const Wanted& want) {
    if (Comparable(held) == Comparable(want.object)) return true;
    const auto it = applied.find(Name(want.object));
    return it != applied.end() && it->second.asked == want.asked &&
           Field(held, {"metadata", "resourceVersion"}) == it->second.resource_version;
  };
  std::map<std::string, const nlohmann::json*> by_name;
  std::int64_t current = 0;
  bool one_generation = true;
  for (const auto& slice : existing) {
    by_name[Name(slice)] = &slice;
    if (Field(slice, {"spec", "pool", "name"}) != pool_name) continue;
    const std::int64_t g = Generation(slice);
    if (current != 0 && g != current) one_generation = false;
    current = std::max(current, g);
  }
  const auto times = TaintTimes(existing);

  SlicePlan plan;
  bool same = one_generation && current != 0 && desired.size() == existing.size();
  std::vector<Wanted> want =
      Stamped(desired, std::max<std::int64_t>(current, 1), node_name, node_uid, times);
  for (const auto& slice : want) {
    if (!same) break;
    const auto it = by_name.find(Name(slice.object));
    same = it != by_name.end() && holds(*it->second, slice);
  }
  plan.generation = same ? current : current + 1;
  if (!same) want = Stamped(desired, plan.generation, node_name, node_uid, times);

  std::map<std::string, bool> wanted;
  for (auto& slice : want) {
    const std::string name = Name(slice.object);
    wanted[name] = true;
    const auto it = by_name.find(name);
    if (it != by_name.end() && holds(*it->second, slice)) continue;
    plan.asked[name] = std::move(slice.asked);
    if (it == by_name.end()) {
      plan.create.push_back(std::move(slice.object));
    } else {
      slice.object["metadata"]["resourceVersion"] =
          Field(*it->second, {"metadata", "resourceVersion"});
      plan.update.push_back(std::move(slice.object));
    }
  }
  for (const auto& slice : existing) {
    if (!wanted.count(Name(slice))) plan.remove.push_back(slice);
  }
  return plan;
}

ApiSlicePublisher::ApiSlicePublisher(std::shared_ptr<kube::Client> client, std::string driver,
                                     std::string node_name)
    : client_(std::move(client)), driver_(std::move(driver)), node_(std::move(node_name)) {}

std::string ApiSlicePublisher::Selector() const {
  return kube::PercentEncode(absl::StrCat("spec.nodeName=", node_, ",spec.driver=", driver_));
}

absl::StatusOr<std::pair<std::vector<nlohmann::json>, std::string>> ApiSlicePublisher::List(
    absl::Time deadline) {
  const std::string base = absl::StrCat(kSlices, "?fieldSelector=", Selector(), "&limit=500");
  std::vector<nlohmann::json> out;
  std::string version;  // the first page's: the snapshot the pages are of
  std::string next;
  do {
    auto page = client_->Get(next.empty() ? base : base + "&continue=" + kube::PercentEncode(next),
                             deadline);
    if (!page.ok()) return page.status();
    const auto& items = Field(page->body, {"items"});
    if (!items.is_null() && !items.is_array()) {
      return absl::InternalError(absl::StrCat("GET ", kSlices, ": items is not a list"));
    }
    if (items.is_array()) out.insert(out.end(), items.begin(), items.end());
    const auto& listed = Field(page->body, {"metadata", "resourceVersion"});
    if (version.empty() && listed.is_string()) version = listed.get<std::string>();
    const auto& cont = Field(page->body, {"metadata", "continue"});
    next = cont.is_string() ? cont.get<std::string>() : "";
  } while (!next.empty());
  return std::pair{std::move(out), std::move(version)};
}

absl::Status ApiSlicePublisher::Apply(const SlicePlan& plan, absl::Time deadline) {
  auto conflict = [](const absl::Status& s) {
    return absl::IsAborted(s) || absl::IsAlreadyExists(s) || absl::IsNotFound(s);
  };
  absl::Status first_conflict;
  auto note = [&](absl::Status s) -> bool {  // true: stop with s
    if (s.ok()) return false;
    if (!conflict(s)) return true;
    if (first_conflict.ok()) first_conflict = absl::AbortedError(s.message());
    return false;
  };
  // Deletes first, then updates, then creates: a device that moves from a stale slice to a
  // new one is never listed twice in the pool, which would make the pool invalid to the
  // scheduler until the stale slice went.
  for (const auto& slice : plan.remove) {
    const nlohmann::json options = {
        {"apiVersion", "v1"},
        {"kind", "DeleteOptions"},
        {"preconditions", {{"uid", Field(slice, {"metadata", "uid"})}}}};
    auto s = client_->Delete(absl::StrCat(kSlices, "/", kube::PercentEncode(Name(slice))), options,
                             deadline)
                 .status();
    if (s.ok() || absl::IsNotFound(s)) applied_.erase(Name(slice));  // gone, as wanted
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      deleted_.insert(Name(slice));
    }
    if (absl::IsNotFound(s)) continue;
    if (note(s)) return s;
  }
  // What the server answered a write with is what it holds at that resourceVersion; it is
  // compared with what was sent.
  auto remember = [&](const nlohmann::json& written, const absl::StatusOr<kube::Response>& r) {
    const std::string name = Name(written);
    const auto& version = Field(r->body, {"metadata", "resourceVersion"});
    if (version.is_string()) {
      applied_[name] = {plan.asked.at(name), version};
      absl::MutexLock lock(&mu_);
      written_.insert(version.get<std::string>());
    }
    CheckAnswer(written, r->body);
  };
  for (const auto& slice : plan.update) {
    auto r = client_->Put(absl::StrCat(kSlices, "/", kube::PercentEncode(Name(slice))), slice,
                          deadline);
    if (r.ok()) remember(slice, r);
    CheckRefusal(slice, r.status());
    if (note(r.status())) return r.status();
  }
  for (const auto& slice : plan.create) {
    auto r = client_->Post(kSlices, slice, deadline);
    if (r.ok()) remember(slice, r);
    CheckRefusal(slice, r.status());
    if (note(r.status())) return r.status();
  }
  return first_conflict;
}

void ApiSlicePublisher::CheckAnswer(const nlohmann::json& sent, const nlohmann::json& answer) {
  for (const std::string& field : DroppedFields(sent, answer)) {
    const std::string key = field.rfind("devices[].", 0) == 0 ? field.substr(10) : field;
    const bool first = CountDropped(key);
    const std::string gate = FeatureGateOf(field);
    const std::string why =
        gate.empty() ? "a feature gate of the control plane is off, or the server is older than "
                       "the field"
                     : absl::StrCat("the feature gate ", gate,
                                    " is off on the control plane (API server and scheduler)");
    if (first) {
      Logger("dra")->warn(
          "the API server dropped {} from ResourceSlice {} (node={} driver={}): {}; counted in "
          "rdma_device_plugin_dra_dropped_fields_total{{field=\"{}\"}} (docs/dra.md, minimum "
          "versions)",
          field, Name(sent), node_, driver_, why, key);
    } else {
      Logger("dra")->debug("the API server dropped {} from ResourceSlice {} again", field,
                           Name(sent));
    }
    if (on_dropped_) on_dropped_(key);
  }
}

bool ApiSlicePublisher::CountDropped(const std::string& field) {
  absl::MutexLock lock(&mu_);
  return dropped_[field]++ == 0;
}

void ApiSlicePublisher::CheckRefusal(const nlohmann::json& sent, const absl::Status& status) {
  if (!RefusesTaintEffectNone(status)) return;
  if (CountDropped(kTaintEffectNoneField)) {
    Logger("dra")->warn(
        "the API server refused the device taint effect None in ResourceSlice {} (node={} "
        "driver={}): the control plane is older than Kubernetes 1.35; taints that only inform "
        "(degraded HCAs) are left out from now on; counted in "
        "rdma_device_plugin_dra_dropped_fields_total{{field=\"{}\"}} (docs/dra.md, minimum "
        "versions)",
        Name(sent), node_, driver_, kTaintEffectNoneField);
  } else {
    Logger("dra")->debug(
        "the API server refused the device taint effect None in ResourceSlice {} again",
        Name(sent));
  }
  if (on_dropped_) on_dropped_(kTaintEffectNoneField);
}

std::map<std::string, std::uint64_t> ApiSlicePublisher::DroppedCounts() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

absl::Status ApiSlicePublisher::Publish(const std::vector<nlohmann::json>& slices,
                                        absl::Time deadline) {
  for (const auto& slice : slices) {
    if (Name(slice).empty() || Field(slice, {"spec", "driver"}) != driver_ ||
        Field(slice, {"spec", "nodeName"}) != node_ ||
        !Field(slice, {"spec", "pool", "name"}).is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice \"", Name(slice), "\" is not one of node ", node_, " for driver ", driver_,
          " (metadata.name, spec.driver, spec.nodeName, spec.pool.name)"));
    }
  }
  absl::StatusOr<std::string> uid = NodeUid(deadline);
  if (!uid.ok()) return uid.status();
  absl::Status s = Rounds(slices, *uid, deadline);
  if (!s.ok() && !absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) {
    absl::MutexLock lock(&mu_);
    node_uid_.clear();  // read again: the Node may have been re-created
  }
  return s;
}

absl::StatusOr<std::string> ApiSlicePublisher::NodeUid(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (!node_uid_.empty()) return node_uid_;
  }
  auto node = client_->Get(absl::StrCat("/api/v1/nodes/", kube::PercentEncode(node_)), deadline);
  if (!node.ok()) return node.status();
  const auto& uid = Field(node->body, {"metadata", "uid"});
  if (!uid.is_string() || uid.get<std::string>().empty()) {
    return absl::InternalError(absl::StrCat("node ", node_, " has no metadata.uid"));
  }
  absl::MutexLock lock(&mu_);
  node_uid_ = uid.get<std::string>();
  return node_uid_;
}

absl::Status ApiSlicePublisher::Rounds(const std::vector<nlohmann::json>& slices,
                                       const std::string& uid, absl::Time deadline) {
  const std::string pool =
      slices.empty() ? node_ : Field(slices[0], {"spec", "pool", "name"}).get<std::string>();
  absl::Status last;
  for (int round = 1; round <= kMaxRounds; ++round) {
    auto listed = List(deadline);
    if (!listed.ok()) return listed.status();
    const SlicePlan plan = PlanPool(slices, listed->first, pool, node_, uid, applied_);
    if (plan.empty()) {
      {
        absl::MutexLock lock(&mu_);
        if (!listed->second.empty()) watch_version_ = listed->second;
        // Events older than this list are of no interest to a watch started from it.
        if (written_.size() > 1024) written_.clear();
        if (deleted_.size() > 1024) deleted_.clear();
      }
      if (round > 1) {
        Logger("dra")->info("slices published node={} driver={} slices={} generation={} rounds={}",
                            node_, driver_, slices.size(), plan.generation, round - 1);
      }
      return absl::OkStatus();
    }
    Logger("dra")->debug("slice plan node={} generation={} create={} update={} delete={}", node_,
                         plan.generation, plan.create.size(), plan.update.size(),
                         plan.remove.size());
    last = Apply(plan, deadline);
    if (!last.ok() && !absl::IsAborted(last)) return last;
  }
  return absl::AbortedError(absl::StrCat("slices of node ", node_, " for driver ", driver_,
                                         " still differ after ", kMaxRounds,
                                         " rounds (another writer?); last conflict: ",
                                         last.message()));
}

absl::Status ApiSlicePublisher::Watch(const std::function<bool()>& cancelled,
                                      const std::function<void()>& on_open,
                                      const std::function<void()>& changed) {
  std::string version;
  absl::Duration timeout;
  {
    absl::MutexLock lock(&mu_);
    version = watch_version_;
    timeout = absl::Seconds(std::uniform_int_distribution<int>(600, 1199)(rng_));
  }
  if (version.empty()) {
    return absl::FailedPreconditionError("no publish has listed the node's slices yet");
  }
  const std::string path = absl::StrCat(
      kSlices, "?fieldSelector=", Selector(), "&watch=true&allowWatchBookmarks=true",
      "&resourceVersion=", kube::PercentEncode(version),
      "&timeoutSeconds=", absl::ToInt64Seconds(timeout));
  return client_->Watch(
      path, timeout + absl::Seconds(30), cancelled, on_open, [&](const nlohmann::json& event) {
        const std::string type = event.value("type", "");
        const nlohmann::json& object = Field(event, {"object"});
        const auto& at = Field(object, {"metadata", "resourceVersion"});
        bool ours = false;
        {
          absl::MutexLock lock(&mu_);
          if (at.is_string()) watch_version_ = at.get<std::string>();
          if (type == "BOOKMARK") return true;
          if (type == "DELETED") {
            const auto it = deleted_.find(Name(object));
            ours = it != deleted_.end();
            if (ours) {
              deleted_.erase(it);
            } else {
              node_uid_.clear();  // the garbage collector's, when the Node was re-created
            }
          } else {
            ours = at.is_string() && written_.count(at.get<std::string>()) > 0;
          }
        }
        if (!ours) {
          Logger("dra")->info("ResourceSlice {} {} by someone else: publishing the pool again",
                              Name(object), type == "DELETED" ? "deleted" : "changed");
          changed();
        }
        return true;
      });
}

}  // namespace rdp::dra
