// quality_sim: how often the allocator's bounded search (greedy construction + local search)
// finds the exhaustive optimum, on nodes too large for the default exact search. Allocation
// quality over pod streams is measured through the real kubelet instead, by the Go harness's
// TestQualityReplay (test/kubelet/quality_test.go); results and commands: docs/allocator.md.

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "allocator/allocator.h"
#include "test/support/node_builder.h"

namespace rdp::bench {
namespace {

using testing::DistinctHcas;
using testing::GpuIds;
using testing::HcaIds;
using testing::ScaledDgx;

// 100 random requests per node (a quarter of the HCAs taken, size 1-4, half of them with 8 of
// the node's GPUs): "optimal" counts answers of the default (bounded) search that score no
// worse than the exhaustive search's, "same GPU match" those with its gpu_match.
void SearchGap(unsigned seed) {
  std::printf("| node | requests | bounded search optimal | same GPU match |\n"
              "|---|---|---|---|\n");
  struct Case {
    const char* name;
    topology::TopologyPtr topology;
  };
  for (const Case& c : {Case{"scaled DGX, 32 HCAs", ScaledDgx(32)},
                        Case{"scaled DGX, 64 HCAs", ScaledDgx(64)},
                        Case{"64 distinct HCAs", DistinctHcas(64)}}) {
    allocator::ExclusiveAllocator bounded(c.topology);
    allocator::ExclusiveAllocator exhaustive(c.topology, allocator::Options{1 << 30, 1LL << 50});
    std::vector<std::string> hcas = HcaIds(*c.topology), gpus = GpuIds(*c.topology);
    std::mt19937 rng(seed);
    int optimal = 0, same_match = 0, total = 0;
    for (int i = 0; i < 100; ++i) {
      allocator::Request r;
      for (const std::string& h : hcas) {
        if (rng() % 4 != 0) r.available.push_back(h);
      }
      r.size = 1 + static_cast<int>(rng() % 4);
      if (rng() % 2 == 0) {
        size_t first = rng() % gpus.size(), stride = 1 + rng() % 3;
        for (size_t g = 0; g < 8; ++g) {
          r.gpus.container_gpus.push_back(gpus[(first + g * stride) % gpus.size()]);
        }
      }
      std::vector<std::string> a = bounded.Prefer(r).value();
      std::vector<std::string> b = exhaustive.Prefer(r).value();
      allocator::Score sa = bounded.Evaluate(r, a).value(), sb = bounded.Evaluate(r, b).value();
      ++total;
      optimal += !(sa < sb);
      same_match += sa.gpu_match == sb.gpu_match;
    }
    std::printf("| %s | %d | %d | %d |\n", c.name, total, optimal, same_match);
  }
}

}  // namespace
}  // namespace rdp::bench

int main(int argc, char** argv) {
  CLI::App app{"How often the bounded search finds the exhaustive optimum."};
  unsigned seed = 1;
  app.add_option("--seed", seed, "seed of the random requests");
  CLI11_PARSE(app, argc, argv);
  rdp::bench::SearchGap(seed);
  return 0;
}
