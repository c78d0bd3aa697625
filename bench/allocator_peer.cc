#include "bench/allocator_peer.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace rdp::bench {

int PeerPairScore(const topology::Topology& t, int a, int b) {
  static constexpr int kScore[] = {50, 40, 30, 20, 10};  // PIX, PXB, PHB, NODE, SYS
  return kScore[static_cast<int>(topology::Classify(t.hcas()[a].place, t.hcas()[b].place))];
}

int PeerSetScore(const topology::Topology& t, const std::vector<int>& set) {
  int score = 0;
  for (size_t i = 0; i < set.size(); ++i) {
    for (size_t j = i + 1; j < set.size(); ++j) {
      if (set[i] >= 0 && set[j] >= 0) score += PeerPairScore(t, set[i], set[j]);
    }
  }
  return score;
}

double PeerPartitions(int available, int size) {
  // Padded to a multiple of size, as go-gpuallocator pads with empty slots:
  // n! / (size!^(n/size) * (n/size)!).
  int n = (available + size - 1) / size * size;
  int sets = n / size;
  double log = std::lgamma(n + 1.0) - sets * std::lgamma(size + 1.0) - std::lgamma(sets + 1.0);
  return std::exp(log);
}

std::vector<std::string> PeerBestEffort(const topology::Topology& t,
                                        const std::vector<std::string>& available,
                                        const std::vector<std::string>& required, int size,
                                        double max_partitions) {
  std::vector<int> devices, must;
  for (const std::string& id : available) devices.push_back(t.HcaIndex(id));
  for (const std::string& id : required) must.push_back(t.HcaIndex(id));
  if (size < 1 || static_cast<int>(devices.size()) < size ||
      std::count(devices.begin(), devices.end(), -1) > 0 ||
      std::count(must.begin(), must.end(), -1) > 0 ||
      PeerPartitions(static_cast<int>(devices.size()), size) > max_partitions) {
    return {};
  }
  std::sort(devices.begin(), devices.end());
  while (devices.size() % size != 0) devices.push_back(-1);  // empty slots
  const int n = static_cast<int>(devices.size());

  auto holds_must = [&](const std::vector<int>& set) {
    return std::all_of(must.begin(), must.end(), [&](int m) {
      return std::find(set.begin(), set.end(), m) != set.end();
    });
  };
  std::vector<std::vector<int>> partition, best;
  int best_score = -1;
  std::vector<char> used(n, 0);
  // Each set starts at the lowest unused slot and takes size-1 more, in order.
  std::function<void(int)> fill_set;
  std::function<void()> next_set = [&]() {
    int first = static_cast<int>(std::find(used.begin(), used.end(), 0) - used.begin());
    if (first == n) {
      if (std::none_of(partition.begin(), partition.end(), holds_must)) return;
      int score = 0;
      for (const auto& set : partition) score += PeerSetScore(t, set);
      if (score > best_score) {
        best_score = score;
        best = partition;
      }
      return;
    }
    used[first] = 1;
    partition.push_back({devices[first]});
    fill_set(first + 1);
    partition.pop_back();
    used[first] = 0;
  };
  fill_set = [&](int from) {
    if (static_cast<int>(partition.back().size()) == size) {
      next_set();
      return;
    }
    for (int i = from; i < n; ++i) {
      if (used[i]) continue;
      used[i] = 1;
      partition.back().push_back(devices[i]);
      fill_set(i + 1);
      partition.back().pop_back();
      used[i] = 0;
    }
  };
  next_set();

  const std::vector<int>* pick = nullptr;
  int pick_score = -1;
  for (const auto& set : best) {
    if (std::count(set.begin(), set.end(), -1) > 0 || !holds_must(set)) continue;
    if (int s = PeerSetScore(t, set); s > pick_score) {
      pick_score = s;
      pick = &set;
    }
  }
  if (pick == nullptr) return {};
  std::vector<std::string> out;
  for (int h : *pick) out.push_back(t.hcas()[h].place.pci);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace rdp::bench
