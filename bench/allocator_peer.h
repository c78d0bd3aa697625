#pragma once

// The peer baseline for bench_allocator: a partition search in the style of NVIDIA
// go-gpuallocator's best-effort policy, written here for HCAs. It enumerates every partition
// of `available` into sets of `size`, scores each set by the sum of its pairs' link scores, keeps
// the best partition that has a set holding all of `required`, and answers that partition's best
// such set. It knows nothing of GPUs or groups: that is the point of the comparison.

#include <string>
#include <vector>

#include "topology/topology.h"

namespace rdp::bench {

// Pair link score between two HCAs, go-gpuallocator's P2P ladder: PIX 50, PXB 40, PHB 30,
// NODE 20, SYS 10.
int PeerPairScore(const topology::Topology& t, int a, int b);

// Sum of pair scores over a set of HCA indices.
int PeerSetScore(const topology::Topology& t, const std::vector<int>& set);

// How many partitions the search would enumerate (a double: it overflows anything else).
double PeerPartitions(int available, int size);

// The peer's answer (sorted PCI addresses); empty when the IDs are unknown, the request is
// invalid, or the partition count exceeds max_partitions.
std::vector<std::string> PeerBestEffort(const topology::Topology& t,
                                        const std::vector<std::string>& available,
                                        const std::vector<std::string>& required, int size,
                                        double max_partitions);

}  // namespace rdp::bench
