#pragma once

// SlicePublisher over the API server (issue 16): this node's pool of resource.k8s.io/v1
// ResourceSlices kept equal to what the driver offers.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dra/kube_client.h"
#include "dra/model.h"

namespace rdp::dra {

// The writes that make the server's slices (`existing`, as listed) equal to `desired` (as
// BuildResourceSlices makes them; their pool.generation and owner are replaced).
struct SlicePlan {
  std::int64_t generation = 0;        // the pool's generation after the writes
  std::vector<nlohmann::json> create;  // objects to POST
  std::vector<nlohmann::json> update;  // objects to PUT, each with the resourceVersion it replaces
  std::vector<nlohmann::json> remove;  // existing objects to DELETE
  bool empty() const { return create.empty() && update.empty() && remove.empty(); }
};

// Pure. The generation: the highest that `existing` of pool `pool_name` hold when every desired
// slice is there, equal (spec, owner, labels, annotations) and of that one generation; that + 1
// when anything differs; 1 when the pool has no slice yet. Every desired slice gets it and the
// Node `node_uid` (when not empty) as controller owner. Existing slices not desired (stale
// names, another pool) are removed. Equality ignores what the API server leaves out or adds
// (null, empty lists and objects; the timeAdded it gives a taint, which is kept across
// updates). Capacity quantities must be written canonically ("64Gi", not "65536Mi"), as the
// server stores them, or every Publish is a write.
SlicePlan PlanPool(const std::vector<nlohmann::json>& desired,
                   const std::vector<nlohmann::json>& existing, const std::string& pool_name,
                   const std::string& node_name, const std::string& node_uid);

// Publishes with the contract of SlicePublisher::Publish (dra/model.h): GETs the Node (its uid
// is the slices' owner), LISTs the node's slices of the driver
// (fieldSelector spec.nodeName, spec.driver), writes PlanPool's plan, and lists again until a
// list needs no write: OK means the last list showed exactly the desired pool. A conflict
// (another writer, a retried create) starts another round, at most a few. Publishing what the
// server holds writes nothing. The slices must be this driver's and node's (else
// InvalidArgument); an empty vector deletes the node's slices. Not thread-safe: one Publish at a
// time (the driver's publishing loop).
class ApiSlicePublisher : public SlicePublisher {
 public:
  ApiSlicePublisher(std::shared_ptr<KubeClient> client, std::string driver, std::string node_name);

  absl::Status Publish(const std::vector<nlohmann::json>& slices, absl::Time deadline) override;

 private:
  absl::StatusOr<std::vector<nlohmann::json>> List(absl::Time deadline);
  // The plan's writes; Aborted when another writer got in between (a next round re-lists).
  absl::Status Apply(const SlicePlan& plan, absl::Time deadline);

  std::shared_ptr<KubeClient> client_;
  const std::string driver_;
  const std::string node_;
};

}  // namespace rdp::dra
