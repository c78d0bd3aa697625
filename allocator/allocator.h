#pragma once

// Which devices a container should get: the answer to the kubelet's GetPreferredAllocation.
//
// Pure and deterministic: no I/O, no locks, no hwloc or protobuf types. The same snapshot and
// request always give the same answer. Thread-safe: Prefer() is const and may be called from
// many threads at once.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/topology.h"

namespace rdp::allocator {

// What is known about GPUs at the moment of the request (from the kubelet's pod-resources API).
// GPU addresses that are not GPUs of the snapshot are ignored: the context is a hint, and a stale
// hint must not fail the kubelet's request.
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
// available, |must_include| <= size, no duplicate or empty IDs. InvalidArgument naming the
// problem.
absl::Status ValidateRequest(const Request& request);

// The value of one exclusive-mode answer under the objective (docs/allocator.md), term by term.
// Terms are compared in declaration order (operator<); "_cost" terms are better when lower, all
// others when higher. The final tie-break (lowest PCI addresses) is not a term: it is applied by
// comparing the answers themselves.
struct Score {
  // Best one-to-one matching of the chosen HCAs to the container's GPUs, each pair weighted by
  // its path class: PIX 8, PXB 6, PHB 2, NODE 1, SYS 0. 0 without container GPUs.
  int gpu_match = 0;
  // The same matching when every GPU may take ceil(size / |GPUs|) HCAs: spreads HCAs beyond one
  // per GPU over the GPUs, nearest first. Equals gpu_match when size <= |GPUs|.
  int gpu_spread_match = 0;
  // NUMA nodes covered: those of the container's GPUs when known, else those of `available`.
  int numa_cover = 0;
  // Minus the sum of squared per-NUMA-node counts (without container GPUs): an even spread over
  // NUMA nodes, the way the kubelet spreads a multi-NUMA pod's GPUs.
  int numa_balance = 0;
  // PCIe switches of the container's GPUs that have a chosen HCA under them (a device under no
  // switch counts its root port as its switch).
  int switch_cover = 0;
  // Sum over the container's GPUs of the weight to their nearest chosen HCA.
  int gpu_coverage = 0;
  // Without container GPUs: sum over the chosen HCAs of the weight to their nearest free GPU
  // (the pod will get free GPUs). With them: minus the same over free GPUs other than the
  // container's (those HCAs are better left for the pods that will get those GPUs).
  int free_gpu_affinity = 0;
  // Groups (NUMA node, PCIe root, PCIe switch) with every HCA available before and one taken by
  // this answer: each is one fewer intact group left for later requests.
  int broken_numa_cost = 0;
  int broken_root_cost = 0;
  int broken_switch_cost = 0;
  // Switches and roots the answer touches at all: fewer means packing into groups already
  // partly used.
  int touched_switch_cost = 0;
  int touched_root_cost = 0;
  // Sum of the chosen HCAs' degradation (1: slower than the node's fastest HCA, 2: a port not
  // ACTIVE, 3: no port ACTIVE).
  int degraded_cost = 0;
};

// True when `a` is strictly worse than `b`.
bool operator<(const Score& a, const Score& b);
bool operator==(const Score& a, const Score& b);

struct Options {
  // Exact search while the number of distinct candidate answers (interchangeable HCAs merged:
  // same NUMA node, root, switches, GPU paths and health) is at most this many.
  int exact_limit = 2000;
  // The hard bound on compute, in units of scoring work (about one matrix cell each; scoring
  // 8 HCAs against 8 GPUs costs about 220). Beyond exact_limit, greedy construction plus
  // pairwise-swap local search stop when it is spent; the exact search stops at twice it.
  // Counted, not timed, so answers stay deterministic. The default keeps a request well under
  // a millisecond at 64 HCAs (docs/allocator.md).
  long long max_work = 200000;
};

// What the allocator precomputes from one snapshot (allocator/model.h).
struct Model;

// Exclusive mode: IDs are HCA PCI addresses ("0000:1a:00.0").
class ExclusiveAllocator {
 public:
  // Precomputes everything that depends on the snapshot alone (affinity matrices, groups).
  // Copies share the precomputed model (immutable).
  explicit ExclusiveAllocator(topology::TopologyPtr topology, Options options = {});

  // The preferred IDs, sorted by PCI address as the snapshot spells them, or InvalidArgument
  // when the request is invalid or names an ID that is not an HCA of the snapshot.
  absl::StatusOr<std::vector<std::string>> Prefer(const Request& request) const;

  // GetPreferredAllocation's answer: the device plugin's one path, on views of the request's
  // own IDs (not copied; they outlive the call). Only a malformed request is refused
  // (InvalidArgument: ValidateRequest's checks, and two spellings of one HCA). Each ID is
  // resolved once to an HCA of the snapshot, in any spelling topology::NormalizePci accepts; an
  // ID that is none is not offered now (an HCA unplugged a poll ago, a device reused from an init
  // container) and is left out of the choice, a must_include one kept as given. The rest is
  // Prefer's choice among the offered IDs, HCAs with `degraded[index]` (by snapshot index;
  // missing entries: not degraded) taken only when the others are too few; only when the offered
  // IDs are too few is the answer completed from the others, in the request's order. Each ID is
  // spelled as the request spelled it: must_include not offered, then the choice by PCI address,
  // then the completion.
  absl::StatusOr<std::vector<std::string>> Answer(
      const std::vector<std::string_view>& available,
      const std::vector<std::string_view>& must_include, int size, const GpuContext& gpus,
      const std::vector<bool>& degraded = {}) const;

  // The answer of the simple policy the scored search must never lose to: must_include, then the
  // lowest PCI addresses, NUMA node by NUMA node (the nodes must_include uses first, then the
  // node with the most available HCAs). Same errors as Prefer().
  absl::StatusOr<std::vector<std::string>> PreferPlaceholder(const Request& request) const;

  // The objective value of `answer` for `request` (for tests, benchmarks and the simulator).
  // InvalidArgument when the request is invalid or the answer is not a valid answer to it.
  absl::StatusOr<Score> Evaluate(const Request& request,
                                 const std::vector<std::string>& answer) const;

  const topology::TopologyPtr& topology() const { return topology_; }

 private:
  topology::TopologyPtr topology_;
  Options options_;
  std::shared_ptr<const Model> model_;
};

// Shared-mode device IDs, the one definition (the device plugin advertises them, the allocator
// answers on their indices): a prefix, then an index in decimal without sign or leading zero
// ("shared-0", "shared-999"), below kMaxSharedIndex. Among such IDs natural order is index order.
inline constexpr std::string_view kSharedIdPrefix = "shared-";
inline constexpr std::uint32_t kMaxSharedIndex = 1u << 20;
// kSharedIdPrefix + index.
std::string SharedId(std::uint32_t index);
// The index of `id` written as `prefix` + index; nullopt for anything else (another prefix, a
// sign, a leading zero, an index of kMaxSharedIndex or more).
std::optional<std::uint32_t> SharedIndex(std::string_view id,
                                         std::string_view prefix = kSharedIdPrefix);

// GetPreferredAllocation's answer in shared mode, where the IDs are interchangeable, on views of
// the request's own IDs: the IDs kSharedIdPrefix + an index below `count` are offered. The same
// rules as ExclusiveAllocator::Answer: only a malformed request is refused (ValidateRequest's
// checks); an ID not offered (above a lowered --shared-devices, another spelling) is left out of
// the choice, a must_include one kept as given; the choice is must_include plus the lowest other
// offered indices, ascending; the answer is completed from the IDs not offered, in the request's
// order, only when the offered ones are too few.
absl::StatusOr<std::vector<std::string>> AnswerShared(
    const std::vector<std::string_view>& available,
    const std::vector<std::string_view>& must_include, int size, std::uint32_t count);

}  // namespace rdp::allocator
