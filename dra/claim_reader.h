#pragma once

// ClaimReader over the API server (issue 16): GET resource.k8s.io/v1 ResourceClaims.

#include <memory>
#include <string>
#include <vector>

#include "dra/kube_client.h"
#include "dra/model.h"

namespace rdp::dra {

// Reads GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name} with the contract of
// ClaimReader::Read (dra/model.h). Messages name the claim as "<ns>/<name>" and, for a malformed
// allocation, the field ("status.allocation.devices.results[1].pool"). A ref whose namespace or
// name is not a DNS name is InvalidArgument, not sent. Thread-safe (the client is).
class ApiClaimReader : public ClaimReader {
 public:
  explicit ApiClaimReader(std::shared_ptr<KubeClient> client);

  absl::StatusOr<std::vector<AllocatedDevice>> Read(const ClaimRef& ref, const std::string& driver,
                                                    absl::Time deadline) override;

 private:
  std::shared_ptr<KubeClient> client_;
};

// The allocation of a ResourceClaim object as Read returns it, without the uid check: the
// results of `driver`, or the errors of Read's contract. Pure.
absl::StatusOr<std::vector<AllocatedDevice>> ParseAllocation(const nlohmann::json& claim,
                                                             const std::string& driver,
                                                             const std::string& claim_name);

}  // namespace rdp::dra
