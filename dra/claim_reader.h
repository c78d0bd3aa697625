#pragma once

// ClaimReader over the API server: GET resource.k8s.io/v1 ResourceClaims and the
// pods they are reserved for.

#include <memory>
#include <string>
#include <vector>

#include "dra/model.h"
#include "kube/client.h"

namespace rdp::dra {

// Reads GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name} with the contract of
// ClaimReader::Read (dra/model.h), and GET /api/v1/namespaces/{ns}/pods/{name} for ReadPod.
// Messages name the claim as "<ns>/<name>" and, for a malformed allocation, the field
// ("status.allocation.devices.results[1].pool"). A namespace or name that is not a DNS name is
// InvalidArgument, not sent. Thread-safe (the client is).
class ApiClaimReader : public ClaimReader {
 public:
  explicit ApiClaimReader(std::shared_ptr<kube::Client> client);

  absl::StatusOr<ClaimAllocation> Read(const ClaimRef& ref, const std::string& driver,
                                       absl::Time deadline) override;
  absl::StatusOr<PodClaims> ReadPod(const PodRef& pod, absl::Time deadline) override;

 private:
  std::shared_ptr<kube::Client> client_;
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
