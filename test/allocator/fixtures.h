#pragma once

// Hand-built topologies for the allocator tests (test/support/node_builder.h), with the IDs of
// their parts at hand.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "test/support/node_builder.h"
#include "topology/topology.h"

namespace rdp::allocator::testing {

using rdp::testing::NodeBuilder;

// The shape of dgx-h100-like.xml: 2 NUMA nodes, 4 roots each with one switch holding 2 GPUs and
// 2 HCAs, plus one HCA alone on a fifth root (NUMA 1). Addresses ascend in this order:
// switch 0 (GPU, GPU, HCA, HCA), switch 1, ..., the lone HCA.
struct Dgx {
  topology::TopologyPtr topology;
  std::vector<std::vector<std::string>> switch_gpus;  // per switch
  std::vector<std::vector<std::string>> switch_hcas;  // per switch
  std::string lone_hca;
  std::vector<std::string> all_hcas;
  std::vector<std::string> all_gpus;
};

inline Dgx MakeDgx(std::vector<std::string> slow_hcas_by_position = {}) {
  NodeBuilder b;
  Dgx d;
  d.switch_gpus.resize(4);
  d.switch_hcas.resize(4);
  int position = 0;
  for (int s = 0; s < 4; ++s) {
    int root = b.Root(s / 2);
    int sw = b.Switch(root);
    for (int i = 0; i < 2; ++i) d.switch_gpus[s].push_back(b.Gpu(root, sw));
    for (int i = 0; i < 2; ++i, ++position) {
      bool slow = false;
      for (const std::string& p : slow_hcas_by_position) slow |= p == std::to_string(position);
      d.switch_hcas[s].push_back(b.Hca(root, sw, slow ? "200 Gb/sec (4X HDR)" : "400 Gb/sec"));
    }
  }
  d.lone_hca = b.Hca(b.Root(1), -1);
  d.topology = b.Build();
  for (const auto& hs : d.switch_hcas) d.all_hcas.insert(d.all_hcas.end(), hs.begin(), hs.end());
  d.all_hcas.push_back(d.lone_hca);
  for (const auto& gs : d.switch_gpus) d.all_gpus.insert(d.all_gpus.end(), gs.begin(), gs.end());
  return d;
}

}  // namespace rdp::allocator::testing
