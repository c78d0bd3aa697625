#pragma once

// ClaimReader over the API server: GET resource.k8s.io/v1 ResourceClaims and the
// pods they are reserved for.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "dra/model.h"
#include "kube/client.h"

namespace rdp::dra {

// Which pods ApiClaimReader::ReadPod reads and uses (docs/dra.md, "Reading pods").
struct PodReads {
  // This node's name. A pod bound to another node (spec.nodeName set and not this) is read and
  // not used: NotFound. A pod not bound yet is used: the kubelet prepares a claim allocated on
  // this node, so the pods it is reserved for are bound here. "": any node's pod is used.
  std::string node;
  // false (dra --read-pods=false; the chart's dra.readPods: false grants no `get pods`): no pod
  // is read.
  bool enabled = true;
};

// Reads GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name} with the contract of
// ClaimReader::Read (dra/model.h), and GET /api/v1/namespaces/{ns}/pods/{name} for ReadPod.
// Messages name the claim as "<ns>/<name>" and, for a malformed allocation, the field
// ("status.allocation.devices.results[1].pool"). A namespace or name that is not a DNS name is
// InvalidArgument, not sent.
// ReadPod is PermissionDenied when pods.enabled is false (nothing sent) or the API server
// refuses the read (403: no RBAC `get pods`). Either is logged once, as a warning that says what
// the driver cannot do without the pods' specs; a read that succeeds after a refusal is logged
// once too, and the next refusal is logged again. Thread-safe (the client is).
class ApiClaimReader : public ClaimReader {
 public:
  explicit ApiClaimReader(std::shared_ptr<kube::Client> client, PodReads pods = {});

  absl::StatusOr<ClaimAllocation> Read(const ClaimRef& ref, const std::string& driver,
                                       absl::Time deadline) override;
  absl::StatusOr<PodClaims> ReadPod(const PodRef& pod, absl::Time deadline) override;

 private:
  // Logs `why` once per refusal episode (see the class comment).
  void PodsRefused(const absl::Status& why);

  std::shared_ptr<kube::Client> client_;
  const PodReads pods_;
  std::atomic<bool> pods_refused_{false};  // since the last pod read that succeeded
};

// A ResourceClaim object as Read returns it, without the uid check: its uid, the results of
// `driver`, the pods in status.reservedFor; or the errors of Read's contract. Pure.
absl::StatusOr<ClaimAllocation> ParseClaim(const nlohmann::json& claim, const std::string& driver,
                                           const std::string& claim_name);

// The claims each container of a Pod object uses (PodClaims, dra/model.h). A container's claim
// whose pod-level entry names no ResourceClaim yet (a template not yet instantiated) or none at
// all is left out. Pure; never fails: what is not there is not used.
PodClaims ParsePodClaims(const nlohmann::json& pod);

}  // namespace rdp::dra
