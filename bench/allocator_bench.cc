// bench_allocator: compute time of the exclusive allocator at 8-64 HCAs and sizes 1-8, shared
// mode over 1000 IDs, and the go-gpuallocator-style peer baseline on the same inputs. Each
// exclusive benchmark also reports the answer's quality as counters, so time and score read
// side by side. Command and results: docs/allocator.md.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/allocator.h"
#include "bench/allocator_peer.h"
#include "test/support/node_builder.h"
#include "benchmark/benchmark.h"

namespace rdp::bench {
namespace {

using testing::DistinctHcas;
using testing::GpuIds;
using testing::HcaIds;
using testing::ScaledDgx;

// Above this the peer's partition enumeration would run for minutes to centuries.
constexpr double kPeerMaxPartitions = 1e7;

enum Shape { kScaledDgx = 0, kDistinct = 1 };

struct Input {
  topology::TopologyPtr topology;
  allocator::Request request;
};

// All HCAs available; with `gpus`, the container holds 8 GPUs starting a quarter into the node
// (so they straddle switches and, on small nodes, both NUMA nodes).
Input MakeInput(Shape shape, int hcas, int size, bool gpus) {
  Input in;
  in.topology = shape == kScaledDgx ? ScaledDgx(hcas) : DistinctHcas(hcas);
  in.request.available = HcaIds(*in.topology);
  in.request.size = size;
  if (gpus) {
    std::vector<std::string> all = GpuIds(*in.topology);
    size_t first = all.size() / 4;
    for (size_t i = 0; i < 8 && i < all.size(); ++i) {
      in.request.gpus.container_gpus.push_back(all[(first + i) % all.size()]);
    }
  }
  return in;
}

void Report(benchmark::State& state, const allocator::ExclusiveAllocator& a, const Input& in,
            const std::vector<std::string>& answer) {
  absl::StatusOr<allocator::Score> s = a.Evaluate(in.request, answer);
  if (!s.ok()) {
    state.SkipWithError("answer does not evaluate");
    return;
  }
  std::vector<int> set;
  for (const std::string& id : answer) set.push_back(in.topology->HcaIndex(id));
  state.counters["gpu_match"] = s->gpu_match;
  state.counters["numa_cover"] = s->numa_cover;
  state.counters["broken_groups"] =
      s->broken_numa_cost + s->broken_root_cost + s->broken_switch_cost;
  state.counters["peer_pair_score"] = PeerSetScore(*in.topology, set);
}

// Args: HCAs, size, with container GPUs (0/1), shape.
void BM_Exclusive(benchmark::State& state) {
  Input in = MakeInput(static_cast<Shape>(state.range(3)), state.range(0), state.range(1),
                       state.range(2) != 0);
  allocator::ExclusiveAllocator a(in.topology);
  std::vector<std::string> answer;
  for (auto _ : state) {
    answer = a.Prefer(in.request).value();
    benchmark::DoNotOptimize(answer.data());
  }
  Report(state, a, in, answer);
}

void BM_Peer(benchmark::State& state) {
  Input in = MakeInput(static_cast<Shape>(state.range(3)), state.range(0), state.range(1),
                       state.range(2) != 0);
  if (PeerPartitions(state.range(0), state.range(1)) > kPeerMaxPartitions) {
    state.SkipWithError("more than 1e7 partitions");
    for (auto _ : state) {
    }
    return;
  }
  allocator::ExclusiveAllocator a(in.topology);
  std::vector<std::string> answer;
  for (auto _ : state) {
    answer = PeerBestEffort(*in.topology, in.request.available, in.request.must_include,
                            in.request.size, kPeerMaxPartitions);
    benchmark::DoNotOptimize(answer.data());
  }
  Report(state, a, in, answer);
}

void BM_Placeholder(benchmark::State& state) {
  Input in = MakeInput(static_cast<Shape>(state.range(3)), state.range(0), state.range(1),
                       state.range(2) != 0);
  allocator::ExclusiveAllocator a(in.topology);
  std::vector<std::string> answer;
  for (auto _ : state) {
    answer = a.PreferPlaceholder(in.request).value();
    benchmark::DoNotOptimize(answer.data());
  }
  Report(state, a, in, answer);
}

void BM_Construct(benchmark::State& state) {
  topology::TopologyPtr t = ScaledDgx(state.range(0));
  for (auto _ : state) {
    allocator::ExclusiveAllocator a(t);
    benchmark::DoNotOptimize(&a);
  }
}

// Args: available IDs (the plugin's own, every one offered), size.
void BM_Shared(benchmark::State& state) {
  const auto count = static_cast<std::uint32_t>(state.range(0));
  std::vector<std::string> ids;
  for (std::uint32_t i = count; i-- > 0;) ids.push_back(allocator::SharedId(i));
  const std::vector<std::string_view> available(ids.begin(), ids.end());
  const int size = static_cast<int>(state.range(1));
  for (auto _ : state) {
    std::vector<std::string> answer = allocator::AnswerShared(available, {}, size, count).value();
    benchmark::DoNotOptimize(answer.data());
  }
}

const std::vector<int64_t> kHcas = {8, 16, 32, 64}, kSizes = {1, 2, 4, 8}, kGpus = {0, 1};

BENCHMARK(BM_Exclusive)
    ->ArgNames({"hcas", "size", "gpus", "shape"})
    ->ArgsProduct({kHcas, kSizes, kGpus, {kScaledDgx}})
    ->ArgsProduct({{64}, kSizes, kGpus, {kDistinct}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Peer)
    ->ArgNames({"hcas", "size", "gpus", "shape"})
    ->ArgsProduct({kHcas, kSizes, kGpus, {kScaledDgx}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Placeholder)
    ->ArgNames({"hcas", "size", "gpus", "shape"})
    ->ArgsProduct({{8, 64}, {2, 8}, {1}, {kScaledDgx}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Construct)->ArgName("hcas")->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Shared)->ArgNames({"ids", "size"})->Args({1000, 1})->Args({1000, 8})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace rdp::bench

BENCHMARK_MAIN();
