#pragma once

// SlicePublisher over the API server: this node's pool of resource.k8s.io/v1
// ResourceSlices kept equal to what the driver offers.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "dra/model.h"
#include "kube/client.h"

namespace rdp::dra {

// The writes that make the server's slices (`existing`, as listed) equal to `desired` (as
// BuildResourceSlices makes them; their pool.generation and owner are replaced).
struct SlicePlan {
  std::int64_t generation = 0;        // the pool's generation after the writes
  std::vector<nlohmann::json> create;  // objects to POST
  std::vector<nlohmann::json> update;  // objects to PUT, each with the resourceVersion it replaces
  std::vector<nlohmann::json> remove;  // existing objects to DELETE
  // By name, for each create and update: what it asks for, as AppliedSlice::asked records it.
  std::map<std::string, nlohmann::json> asked;
  bool empty() const { return create.empty() && update.empty() && remove.empty(); }
};

// What a publisher last wrote of a slice: the object it asked for (as compared: spec, owner,
// labels, annotations) and the resourceVersion the server answered with. A slice the server
// still holds at that version is what was asked for, however the server normalised it
// (defaults, canonical quantities: "1024Mi" is stored as "1Gi").
struct AppliedSlice {
  nlohmann::json asked;
  std::string resource_version;
};
using AppliedSlices = std::map<std::string, AppliedSlice>;  // by slice name

// Pure. The generation: the highest that `existing` of pool `pool_name` hold when every desired
// slice is there, equal and of that one generation; that + 1 when anything differs; 1 when the
// pool has no slice yet. Every desired slice gets it and the Node `node_uid` (when not empty) as
// controller owner. Existing slices not desired (stale names, another pool) are removed.
// Equal: the same spec, owner, labels and annotations once what the server leaves out or adds is
// set aside (null, empty lists and objects; the timeAdded it gives a taint, which is kept across
// updates), or the slice is at the version `applied` records for the same object.
// The fields of `sent` (a ResourceSlice we wrote) that the server's `answer` to the write lacks:
// "devices[].<key>" for each key of a device (matched by name) that is not in the answer's device,
// "devices[].capacity.requestPolicy" when a capacity the answer keeps lacks the request policy
// sent, and "<key>" for a key of the spec. The API server drops, without an error, a field whose
// feature gate is off (taints: DRADeviceTaints; allowMultipleAllocations and a capacity's
// requestPolicy: DRAConsumableCapacity). Empty lists and objects, which the server leaves out as
// well, are not counted. Pure.
std::vector<std::string> DroppedFields(const nlohmann::json& sent, const nlohmann::json& answer);
// The feature gate that controls a field DroppedFields names ("DRADeviceTaints"), or "" when not
// known.
std::string FeatureGateOf(const std::string& field);

// Whether `status` (a slice write's error) is the API server refusing the device taint effect
// None, as servers before Kubernetes 1.35 do: InvalidArgument (422) whose message names a taint's
// effect with the unsupported value "None". The write is refused whole, nothing is stored. Pure.
bool RefusesTaintEffectNone(const absl::Status& status);
// The name under which a refused effect None is reported and counted (on_dropped,
// DroppedCounts, rdma_device_plugin_dra_dropped_fields_total{field}).
inline constexpr char kTaintEffectNoneField[] = "taintEffectNone";
// The name under which a dropped capacity request policy is reported and counted.
inline constexpr char kCapacityRequestPolicyField[] = "capacity.requestPolicy";

SlicePlan PlanPool(const std::vector<nlohmann::json>& desired,
                   const std::vector<nlohmann::json>& existing, const std::string& pool_name,
                   const std::string& node_name, const std::string& node_uid,
                   const AppliedSlices& applied = {});

// Publishes with the contract of SlicePublisher::Publish (dra/model.h): GETs the Node once (its
// uid is the slices' owner; kept until a publish fails or the watch sees one of our slices deleted
// by someone else, as the garbage collector does when the Node was re-created), LISTs the node's slices of the driver
// (fieldSelector spec.nodeName, spec.driver), writes PlanPool's plan, and lists again until a
// list needs no write: OK means the last list showed exactly the desired pool. It remembers
// what it wrote (AppliedSlices), so that a server's normalisation is not taken for a change; a
// new publisher (a restarted driver) facing such a slice writes it once more, then no more. A conflict
// (another writer, a retried create) starts another round, at most a few. Publishing what the
// server holds writes nothing. The slices must be this driver's and node's (else
// InvalidArgument); an empty vector deletes the node's slices. Not thread-safe: one Publish at a
// time (the driver's publishing loop).
//
// Every write's answer is compared with what was sent (DroppedFields): a field the server dropped
// is logged (a warning naming the feature gate, once per field), counted (DroppedCounts: the
// metric rdma_device_plugin_dra_dropped_fields_total{field}) and reported to `on_dropped`, so
// that the driver stops sending what the control plane cannot hold (an untainted unusable HCA
// would be allocated, and Prepare would refuse it). A write the server refuses for a taint's
// effect None (RefusesTaintEffectNone) fails the publish; it is logged (a warning, once), counted
// and reported as kTaintEffectNoneField, so that the driver publishes again without such taints.
//
// Watch (SlicePublisher::Watch): one watch of the node's slices of the driver (the LIST's field
// selector), from the resourceVersion of the last publish's list or the last event or bookmark
// seen, for a timeoutSeconds drawn from [10, 20) minutes (so that nodes do not reconnect
// together); the events of our own writes are not changes.
class ApiSlicePublisher : public SlicePublisher {
 public:
  ApiSlicePublisher(std::shared_ptr<kube::Client> client, std::string driver,
                    std::string node_name);

  absl::Status Publish(const std::vector<nlohmann::json>& slices, absl::Time deadline) override;
  absl::Status Watch(const std::function<bool()>& cancelled, const std::function<void()>& on_open,
                     const std::function<void()>& changed) override;

  // Called (on the publishing thread, during Publish) with each field a write's answer lacked.
  // Set before the first Publish.
  void SetOnDropped(std::function<void(const std::string& field)> on_dropped) {
    on_dropped_ = std::move(on_dropped);
  }
  // Writes whose answer lacked each field, by DroppedFields' name without "devices[]." (taints,
  // allowMultipleAllocations, capacity.requestPolicy), and writes refused for an effect None (kTaintEffectNoneField),
  // so far. Thread-safe.
  std::map<std::string, std::uint64_t> DroppedCounts() const;

 private:
  // The node's slices of the driver and the list's resourceVersion.
  absl::StatusOr<std::pair<std::vector<nlohmann::json>, std::string>> List(absl::Time deadline);
  // The Node's uid, from the cache or the server.
  absl::StatusOr<std::string> NodeUid(absl::Time deadline);
  // The field selector of our slices, for LIST and WATCH.
  std::string Selector() const;
  // Publish's rounds of list + writes, the Node's uid known.
  absl::Status Rounds(const std::vector<nlohmann::json>& slices, const std::string& uid,
                      absl::Time deadline);
  // The plan's writes; Aborted when another writer got in between (a next round re-lists).
  absl::Status Apply(const SlicePlan& plan, absl::Time deadline);

  // Compares a write's answer with what was sent; see the class comment.
  void CheckAnswer(const nlohmann::json& sent, const nlohmann::json& answer);
  // Counts `field` as dropped; true the first time.
  bool CountDropped(const std::string& field) ABSL_LOCKS_EXCLUDED(mu_);
  // A write of `sent` failed with `status`: a refused effect None is logged, counted, reported.
  void CheckRefusal(const nlohmann::json& sent, const absl::Status& status);

  std::shared_ptr<kube::Client> client_;
  const std::string driver_;
  const std::string node_;
  AppliedSlices applied_;
  std::function<void(const std::string&)> on_dropped_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::uint64_t> dropped_ ABSL_GUARDED_BY(mu_);
  std::string node_uid_ ABSL_GUARDED_BY(mu_);  // "" until read, and after it was forgotten
  // Where a watch starts: the last successful publish's list, or the last event seen since.
  std::string watch_version_ ABSL_GUARDED_BY(mu_);
  // The resourceVersions our writes produced, and the slices we deleted: their events are ours.
  std::set<std::string> written_ ABSL_GUARDED_BY(mu_);
  std::multiset<std::string> deleted_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){std::random_device()()};
};

}  // namespace rdp::dra
