#pragma once

// Which devices a container should get: the answer to the kubelet's GetPreferredAllocation.
//
// Pure and deterministic: no I/O, no locks, no hwloc or protobuf types. The same snapshot and
// request always give the same answer. Thread-safe: Prefer() is const and may be called from
// many threads at once.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/topology.h"

namespace rdp::allocator {

// What is known about GPUs at the moment of the request (from the kubelet's pod-resources API).
struct GpuContext {
  // PCI addresses of the GPUs of the container being admitted; empty when unknown.
  std::vector<std::string> container_gpus;
  // PCI addresses of the node's GPUs that no container holds; meaningful only when
  // free_gpus_known (otherwise every GPU counts as free).
  std::vector<std::string> free_gpus;
  bool free_gpus_known = false;
};

struct Request {
  std::vector<std::string> available;     // device IDs the kubelet may hand out
  std::vector<std::string> must_include;  // IDs that must be in the answer
  int size = 0;                           // how many IDs to return
  GpuContext gpus;
};

// Checks the request against itself: size >= 1, size <= |available|, must_include within
// available, |must_include| <= size, no duplicate IDs. InvalidArgument naming the problem.
absl::Status ValidateRequest(const Request& request);

// Exclusive mode: IDs are HCA PCI addresses ("0000:1a:00.0").
class ExclusiveAllocator {
 public:
  // Precomputes everything that depends on the snapshot alone (affinity matrices, groups).
  explicit ExclusiveAllocator(topology::TopologyPtr topology);

  // The preferred IDs, sorted by PCI address, or InvalidArgument when the request is invalid or
  // names an ID that is not an HCA of the snapshot.
  absl::StatusOr<std::vector<std::string>> Prefer(const Request& request) const;

  const topology::TopologyPtr& topology() const { return topology_; }

 private:
  topology::TopologyPtr topology_;
};

// Shared mode: the IDs are interchangeable; answer must_include plus the lowest other available
// IDs, in natural order ("shared-2" before "shared-10").
absl::StatusOr<std::vector<std::string>> PreferShared(const Request& request);

// Natural-order comparison of IDs: equal prefixes compare their trailing numbers numerically.
bool NaturalLess(const std::string& a, const std::string& b);

}  // namespace rdp::allocator
