#pragma once

// Internal to allocator/: what ExclusiveAllocator precomputes from one snapshot, and the
// per-request problem the search works on. Not part of the module's interface.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "Eigen/Core"
#include "allocator/allocator.h"
#include "topology/topology.h"

namespace rdp::allocator {

// Path-class weights (docs/allocator.md, Objective): the cliff after PXB is where GPUDirect
// RDMA stops.
inline constexpr int kPathWeight[] = {8, 6, 2, 1, 0};  // PIX, PXB, PHB, NODE, SYS

using WeightMatrix = Eigen::Matrix<int, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Device indices by PCI address as the snapshot spells it ("0000:1a:00.0"): canonical addresses
// packed into integers and binary-searched (no hashing or string compares per request), any
// other spelling a snapshot may hold in a hash map. -1 when absent.
class PciIndex {
 public:
  void Add(const std::string& pci, int index);
  int Find(const std::string& id) const;
  // Find for an ID spelled canonically ("dddd:bb:dd.f", lower-case hex) alone: -1 for any other
  // spelling, without looking further.
  int FindCanonical(std::string_view id) const;

 private:
  std::vector<std::pair<std::int64_t, int>> packed_;  // sorted
  std::unordered_map<std::string, int> others_;
};

// Built once per snapshot; immutable afterwards, shared by copies of the allocator. Group ids are
// dense small ints so that per-request state is flat arrays; -1 means "unknown".
struct Model {
  int hca_count = 0;
  int gpu_count = 0;
  WeightMatrix weight;                     // hca x gpu: kPathWeight of the path class
  std::vector<int> hca_numa;               // NUMA group per HCA
  std::vector<int> hca_root;               // PCIe root group per HCA
  std::vector<std::vector<int>> hca_switches;  // every switch above the HCA (or its root port)
  std::vector<int> hca_degraded;           // Score::degraded_cost contribution
  std::vector<int> hca_class;              // interchangeable HCAs share a class
  std::vector<int> gpu_numa;               // NUMA group per GPU
  std::vector<int> gpu_switch;             // nearest switch (or root port) above the GPU
  std::vector<int> numa_size, root_size, switch_size;  // HCAs per group
  PciIndex hca_by_pci, gpu_by_pci;  // the snapshot's spelling

  explicit Model(const topology::Topology& topology);
};

// One request, resolved to indices. Everything here is per call; the model is shared.
struct Problem {
  const Model* model = nullptr;
  int size = 0;
  std::vector<int> must;       // HCA indices, ascending
  std::vector<int> candidates; // available minus must, ascending (= by PCI address)
  std::vector<int> gpus;       // the container's GPU indices, ascending, distinct
  int gpu_capacity = 1;        // ceil(size / |gpus|)
  WeightMatrix gpu_weight;     // hca x container GPU (columns of Model::weight)
  std::vector<int> gpu_best;   // per HCA: its best weight to a container GPU
  // per HCA: the container GPUs (columns, up to 64) at that best weight, as bits
  std::vector<std::uint64_t> gpu_best_columns;
  std::vector<int> free_affinity;   // per HCA: Score::free_gpu_affinity contribution
  std::vector<char> numa_target;    // per NUMA group: counts for numa_cover
  std::vector<int> switch_targets;  // distinct nearest switches of the container's GPUs
  std::vector<char> numa_intact, root_intact, switch_intact;  // every member available
};

// Resolves and checks a request; InvalidArgument for anything Prefer() must reject. The first
// form refills `out` in place (its buffers kept: a thread's problem stops allocating).
absl::Status MakeProblem(const topology::Topology& topology, const Model& model,
                         const Request& request, Problem* out);
absl::StatusOr<Problem> MakeProblem(const topology::Topology& topology, const Model& model,
                                    const Request& request);
// The part of MakeProblem after the IDs are resolved and checked: `available` (HCA indices,
// ascending, distinct) and out->must (ascending, within available) are given.
void FillProblem(const topology::Topology& topology, const Model& model,
                 const std::vector<int>& available, int size, const GpuContext& gpus,
                 Problem* out);

// Reusable scratch for Evaluate so the search allocates nothing per candidate.
class Scorer {
 public:
  Scorer() = default;
  explicit Scorer(const Problem& problem);
  // Scores sets of `problem` from now on, with the work count at 0; keeps the buffers.
  void Reset(const Problem& problem);
  // The score of `set` (HCA indices, any order, possibly fewer than problem.size). With a bar,
  // a set that cannot beat it may get a partial score, still strictly worse than the bar.
  Score Evaluate(const std::vector<int>& set, const Score* bar = nullptr);
  // Work done so far, in matrix cells visited (the Hungarian method counted at its worst):
  // the deterministic measure of compute that Options::max_work bounds.
  long long work() const { return work_; }

 private:
  // matrix_ = weights of the set's HCAs against the container's GPUs, transposed so that
  // rows <= cols.
  void BuildMatrix(const std::vector<int>& set, int* rows, int* cols);
  int ColumnBound(int rows, int cols);  // upper bound of the best matching over matrix_
  // The best one-to-one matching of the set's HCAs to the container's GPUs; when it is below
  // `bar`, possibly only an upper bound that is also below `bar`.
  int Matching(const std::vector<int>& set, int bar);
  int MaxAssignment(int rows, int cols);  // Hungarian method over matrix_, rows <= cols
  // The best matching of the set's HCAs to GPUs taking up to `capacity` HCAs each, by min-cost
  // flow over HCA types.
  int Transportation(const std::vector<int>& set, int capacity);

  static constexpr int kFastRows = 16;  // Matching's bit greedy: sets up to this size

  struct FlowEdge {
    int to, cap, cost, next;  // next: the following edge out of the same node, or -1
  };

  const Problem* p_ = nullptr;
  std::vector<int> numa_count_, stamp_root_, stamp_switch_;
  int stamp_ = 0;
  long long work_ = 0;
  std::vector<int> matrix_;  // rows x cols, row-major, weights
  std::vector<int> u_, v_, match_, way_, minv_;
  std::vector<char> used_;
  std::vector<std::pair<int, int>> order_;  // (columns at the row's maximum, row)
  std::vector<std::pair<int, int>> types_;  // (representative HCA, HCAs with its weight row)
  std::vector<FlowEdge> edges_;             // paired: edge e's reverse is e ^ 1
  std::vector<int> head_, dist_, via_, queue_;
};

// The placeholder policy (see ExclusiveAllocator::PreferPlaceholder), as sorted HCA indices.
std::vector<int> PlaceholderPick(const Problem& problem);

// With the container's GPUs known, the answer is among the candidates that can reach the best
// gpu_match, usually few: the exact search over those alone is the exact search over all.
// First with the bar at the best conceivable gpu_match (every HCA at its row maximum); when no
// answer reaches it, at the best one found, which the optimum reaches too. Sorted HCA indices,
// the exact search's answer; nullopt without container GPUs, or when the reduced enumeration
// still counts more than Options::exact_limit answers or hits the work bound.
std::optional<std::vector<int>> ExactAmongReaching(const Problem& problem, const Options& options);

// The scored search (docs/allocator.md, Search): sorted HCA indices.
std::vector<int> Search(const Problem& problem, const Options& options);

}  // namespace rdp::allocator
