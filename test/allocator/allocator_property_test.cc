// Property tests over random topologies and requests: every answer is valid, deterministic,
// never worse than the placeholder, and equal to brute force where the search is exact.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/allocator.h"
#include "allocator/model.h"
#include "gtest/gtest.h"
#include "test/allocator/fixtures.h"

namespace rdp::allocator {
namespace {

using ::rdp::allocator::testing::NodeBuilder;
using Ids = std::vector<std::string>;

struct Node {
  topology::TopologyPtr topology;
  Ids hcas, gpus;
};

// 1-4 NUMA nodes (sometimes unknown), 1-3 roots each, switches nested up to two levels, GPUs
// and HCAs under switches or on root ports, some HCAs slow or with a port down.
Node RandomNode(std::mt19937& rng, int max_hcas) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  NodeBuilder b;
  Node n;
  int numa_nodes = pick(1, 4);
  for (int numa = 0; numa < numa_nodes; ++numa) {
    for (int r = pick(1, 3); r > 0; --r) {
      int root = b.Root(pick(0, 9) == 0 ? std::nullopt : std::optional<int>(numa));
      std::vector<int> places = {-1};
      for (int s = pick(0, 2); s > 0; --s) {
        int sw = b.Switch(root);
        places.push_back(sw);
        if (pick(0, 2) == 0) places.push_back(b.Switch(root, sw));
      }
      for (int where : places) {
        for (int g = pick(0, 2); g > 0; --g) n.gpus.push_back(b.Gpu(root, where));
        for (int h = pick(0, 2); h > 0 && static_cast<int>(n.hcas.size()) < max_hcas; --h) {
          int kind = pick(0, 7);
          n.hcas.push_back(kind == 0   ? b.Hca(root, where, "200 Gb/sec")
                           : kind == 1 ? b.Hca(root, where, "400 Gb/sec", 2, 1)
                                       : b.Hca(root, where));
        }
      }
    }
  }
  if (n.hcas.empty()) n.hcas.push_back(b.Hca(b.Root(0), -1));
  n.topology = b.Build();
  std::sort(n.hcas.begin(), n.hcas.end());
  return n;
}

// A random valid request over `node`: a random available subset, must_include within it, a GPU
// context that is sometimes empty, sometimes known free GPUs.
Request RandomRequest(std::mt19937& rng, const Node& node) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Request r;
  for (const std::string& h : node.hcas) {
    if (pick(0, 3) != 0) r.available.push_back(h);
  }
  if (r.available.empty()) r.available.push_back(node.hcas[0]);
  std::shuffle(r.available.begin(), r.available.end(), rng);
  r.size = pick(1, static_cast<int>(r.available.size()));
  int must = pick(0, 3) == 0 ? pick(0, r.size) : 0;
  r.must_include.assign(r.available.begin(), r.available.begin() + must);
  for (const std::string& g : node.gpus) {
    if (pick(0, 2) == 0) r.gpus.container_gpus.push_back(g);
    if (pick(0, 1) == 0) r.gpus.free_gpus.push_back(g);
  }
  if (pick(0, 2) == 0) r.gpus.container_gpus.clear();
  r.gpus.free_gpus_known = pick(0, 1) == 0;
  return r;
}

void ExpectValid(const Request& r, const Ids& answer) {
  ASSERT_EQ(static_cast<int>(answer.size()), r.size);
  EXPECT_TRUE(std::is_sorted(answer.begin(), answer.end()));
  EXPECT_EQ(std::adjacent_find(answer.begin(), answer.end()), answer.end());
  for (const std::string& id : answer) {
    EXPECT_NE(std::find(r.available.begin(), r.available.end(), id), r.available.end()) << id;
  }
  for (const std::string& id : r.must_include) {
    EXPECT_NE(std::find(answer.begin(), answer.end(), id), answer.end()) << id;
  }
}

// The best answer by Evaluate over every subset, ties to the lowest addresses.
Ids BruteForce(const ExclusiveAllocator& a, const Request& r) {
  Ids rest;
  for (const std::string& id : r.available) {
    if (std::find(r.must_include.begin(), r.must_include.end(), id) == r.must_include.end()) {
      rest.push_back(id);
    }
  }
  std::sort(rest.begin(), rest.end());
  int want = r.size - static_cast<int>(r.must_include.size());
  std::vector<bool> take(rest.size(), false);
  std::fill(take.begin(), take.begin() + want, true);
  Ids best;
  Score best_score;
  do {
    Ids answer = r.must_include;
    for (size_t i = 0; i < rest.size(); ++i) {
      if (take[i]) answer.push_back(rest[i]);
    }
    std::sort(answer.begin(), answer.end());
    absl::StatusOr<Score> s = a.Evaluate(r, answer);
    EXPECT_TRUE(s.ok()) << s.status();
    if (best.empty() || best_score < *s || (!(*s < best_score) && answer < best)) {
      best = answer;
      best_score = *s;
    }
  } while (std::prev_permutation(take.begin(), take.end()));
  return best;
}

class AllocatorPropertyTest : public ::testing::TestWithParam<int> {};

TEST_P(AllocatorPropertyTest, ValidDeterministicAndNeverWorseThanThePlaceholder) {
  std::mt19937 rng(GetParam());
  Node node = RandomNode(rng, 64);
  ExclusiveAllocator exact(node.topology);
  ExclusiveAllocator bounded(node.topology, Options{/*exact_limit=*/0, /*max_work=*/3000});
  for (int i = 0; i < 20; ++i) {
    Request r = RandomRequest(rng, node);
    for (const ExclusiveAllocator* a : {&exact, &bounded}) {
      absl::StatusOr<Ids> got = a->Prefer(r);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectValid(r, *got);

      Request shuffled = r;
      std::shuffle(shuffled.available.begin(), shuffled.available.end(), rng);
      std::shuffle(shuffled.must_include.begin(), shuffled.must_include.end(), rng);
      std::shuffle(shuffled.gpus.container_gpus.begin(), shuffled.gpus.container_gpus.end(), rng);
      EXPECT_EQ(a->Prefer(shuffled).value(), *got);

      absl::StatusOr<Ids> floor = a->PreferPlaceholder(r);
      ASSERT_TRUE(floor.ok());
      ExpectValid(r, *floor);
      EXPECT_FALSE(a->Evaluate(r, *got).value() < a->Evaluate(r, *floor).value());
    }
  }
}

TEST_P(AllocatorPropertyTest, ExactSearchEqualsBruteForce) {
  std::mt19937 rng(GetParam() + 1000);
  Node node = RandomNode(rng, 11);
  ExclusiveAllocator a(node.topology);
  for (int i = 0; i < 10; ++i) {
    Request r = RandomRequest(rng, node);
    EXPECT_EQ(a.Prefer(r).value(), BruteForce(a, r)) << "request " << i;
  }
}

// Many HCAs alone on their root (the search merges those by what their groups are, not which):
// 1-3 NUMA nodes, 2-5 roots each with 0-2 HCAs on the root port or under either of two
// switches, some slow or half down, and 0-1 GPUs beside them.
Node SparseNode(std::mt19937& rng) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  NodeBuilder b;
  Node n;
  for (int numa = pick(1, 3); numa-- > 0;) {
    for (int r = pick(2, 5); r > 0 && n.hcas.size() < 11; --r) {
      const int root = b.Root(numa);
      // Each HCA on the root port or under one of two switches, so that HCAs of one root may
      // share no switch.
      const int switches[] = {-1, b.Switch(root), b.Switch(root)};
      for (int h = pick(0, 2); h > 0; --h) {
        const int sw = switches[pick(0, 2)];
        const int kind = pick(0, 5);
        n.hcas.push_back(kind == 0   ? b.Hca(root, sw, "200 Gb/sec")
                         : kind == 1 ? b.Hca(root, sw, "400 Gb/sec", 2, 1)
                                     : b.Hca(root, sw));
      }
      if (pick(0, 1) == 0) n.gpus.push_back(b.Gpu(root, switches[pick(0, 2)]));
    }
  }
  if (n.hcas.empty()) n.hcas.push_back(b.Hca(b.Root(0), -1));
  n.topology = b.Build();
  std::sort(n.hcas.begin(), n.hcas.end());
  return n;
}

// Without container GPUs, on nodes where most HCAs are alone on their root: the search's merged
// classes lose nothing against brute force over every subset.
TEST_P(AllocatorPropertyTest, IsolatedHcasMergedEqualBruteForce) {
  std::mt19937 rng(GetParam() + 5000);
  for (int round = 0; round < 4; ++round) {
    Node node = SparseNode(rng);
    ExclusiveAllocator a(node.topology);
    for (int i = 0; i < 10; ++i) {
      Request r = RandomRequest(rng, node);
      r.gpus.container_gpus.clear();
      EXPECT_EQ(a.Prefer(r).value(), BruteForce(a, r)) << "round " << round << " request " << i;
    }
  }
}

// The exact search among the candidates that can reach the best gpu_match (what Search uses when
// the whole enumeration is too large) answers what brute force over every subset answers,
// whenever it answers. Requests always carry container GPUs here, and it must decide most of
// them, or this test would check nothing.
TEST_P(AllocatorPropertyTest, ExactAmongReachingEqualsBruteForce) {
  std::mt19937 rng(GetParam() + 4000);
  Node node = RandomNode(rng, 11);
  if (node.gpus.empty()) GTEST_SKIP() << "no GPUs drawn";
  ExclusiveAllocator a(node.topology);
  const Model model(*node.topology);
  int decided = 0;
  constexpr int kRequests = 10;
  for (int i = 0; i < kRequests; ++i) {
    Request r = RandomRequest(rng, node);
    if (r.gpus.container_gpus.empty()) r.gpus.container_gpus.push_back(node.gpus[i % node.gpus.size()]);
    absl::StatusOr<Problem> p = MakeProblem(*node.topology, model, r);
    ASSERT_TRUE(p.ok()) << p.status();
    std::optional<std::vector<int>> got = ExactAmongReaching(*p, Options{});
    if (!got) continue;
    ++decided;
    Ids names;
    for (int h : *got) names.push_back(node.topology->hcas()[h].place.pci);
    EXPECT_EQ(names, BruteForce(a, r)) << "request " << i;
  }
  EXPECT_GE(decided, kRequests / 2);
}

TEST_P(AllocatorPropertyTest, GarbageIsRejectedNeverACrash) {
  std::mt19937 rng(GetParam() + 2000);
  Node node = RandomNode(rng, 16);
  ExclusiveAllocator a(node.topology);
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 50; ++i) {
    Request r;
    for (int j = pick(0, 5); j > 0; --j) {
      switch (pick(0, 3)) {
        case 0: r.available.push_back(node.hcas[pick(0, node.hcas.size() - 1)]); break;
        case 1: r.available.push_back(""); break;
        case 2: r.available.push_back("0000:zz:00.0"); break;
        default: r.available.push_back(std::string(pick(0, 40), static_cast<char>(pick(1, 255))));
      }
    }
    if (!r.available.empty() && pick(0, 1)) r.must_include.push_back(r.available[0]);
    if (pick(0, 1)) r.must_include.push_back("0000:00:00.0");
    r.size = pick(-2, 7);
    absl::StatusOr<Ids> got = a.Prefer(r);
    if (got.ok()) {
      ExpectValid(r, *got);
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

// The best matching of `hcas` to `gpus`, each GPU taking up to `capacity`, by trying every
// assignment (each HCA to one GPU or to none).
int BruteMatching(const topology::Topology& t, const std::vector<int>& hcas,
                  const std::vector<int>& gpus, int capacity) {
  static constexpr int kWeight[] = {8, 6, 2, 1, 0};
  std::vector<int> load(gpus.size(), 0);
  std::function<int(size_t)> best = [&](size_t i) {
    if (i == hcas.size()) return 0;
    int result = best(i + 1);  // this HCA unmatched
    for (size_t g = 0; g < gpus.size(); ++g) {
      if (load[g] == capacity) continue;
      ++load[g];
      int w = kWeight[static_cast<int>(t.Path(hcas[i], gpus[g]))];
      result = std::max(result, w + best(i + 1));
      --load[g];
    }
    return result;
  };
  return best(0);
}

TEST_P(AllocatorPropertyTest, MatchingTermsEqualBruteForce) {
  std::mt19937 rng(GetParam() + 3000);
  Node node = RandomNode(rng, 12);
  if (node.gpus.empty()) GTEST_SKIP() << "no GPUs drawn";
  ExclusiveAllocator a(node.topology);
  const topology::Topology& t = *node.topology;
  for (int i = 0; i < 20; ++i) {
    Request r;
    r.available = node.hcas;
    std::vector<std::string> hcas = node.hcas;
    std::shuffle(hcas.begin(), hcas.end(), rng);
    r.size = std::uniform_int_distribution<int>(1, std::min<int>(6, hcas.size()))(rng);
    std::vector<std::string> answer(hcas.begin(), hcas.begin() + r.size);
    std::sort(answer.begin(), answer.end());
    std::vector<std::string> gpus = node.gpus;
    std::shuffle(gpus.begin(), gpus.end(), rng);
    gpus.resize(std::uniform_int_distribution<size_t>(1, std::min<size_t>(3, gpus.size()))(rng));
    r.gpus.container_gpus = gpus;

    std::vector<int> h, g;
    for (const std::string& id : answer) h.push_back(t.HcaIndex(id));
    for (const std::string& id : gpus) g.push_back(t.GpuIndex(id));
    int capacity = (r.size + static_cast<int>(g.size()) - 1) / static_cast<int>(g.size());
    Score s = a.Evaluate(r, answer).value();
    EXPECT_EQ(s.gpu_match, BruteMatching(t, h, g, 1));
    EXPECT_EQ(s.gpu_spread_match, BruteMatching(t, h, g, capacity));
  }
}

// A random shared-mode request: up to `most` IDs of `prefix`, each index kept with probability
// 2/3 and, with `spread`, multiplied by 1 to 3 (so duplicates within available can occur),
// shuffled; sometimes an odd ID besides (a leading zero, another prefix, an empty ID, a
// duplicate); a size from 0 to one above available; up to three must_include, sometimes one not
// available.
Request RandomSharedRequest(std::mt19937& rng, const std::string& prefix, int most, bool spread) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Request r;
  const int n = pick(1, most);
  for (int i = 0; i < n; ++i) {
    if (pick(0, 2) != 0) r.available.push_back(prefix + std::to_string(spread ? i * pick(1, 3) : i));
  }
  if (r.available.empty()) r.available.push_back(prefix + "0");
  std::shuffle(r.available.begin(), r.available.end(), rng);
  switch (pick(0, 9)) {
    case 0: r.available.push_back(prefix + "007"); break;
    case 1: r.available.push_back("other-" + std::to_string(pick(0, 50))); break;
    case 2: r.available.push_back(""); break;
    case 3: r.available.push_back(r.available.front()); break;
    default: break;
  }
  r.size = pick(0, static_cast<int>(r.available.size()) + 1);
  for (int m = pick(0, 3); m > 0; --m) {
    r.must_include.push_back(pick(0, 7) == 0 ? prefix + "999999"
                                             : r.available[pick(0, r.available.size() - 1)]);
  }
  return r;
}

// Shared mode (AnswerShared, the device plugin's one path) on requests of every shape:
// shuffled, sparse, with must_include, with IDs not offered (at or above the count, a leading
// zero, another prefix), malformed ones (a duplicate, an empty ID, must_include outside
// available, a size out of range). Malformed: refused as ValidateRequest names it. Otherwise: the
// size asked for, within available, no ID twice, must_include kept, the same answer again; the
// offered IDs besides must_include are the lowest ones, and an ID not offered is taken only when
// every offered one is.
TEST_P(AllocatorPropertyTest, SharedAnswersAreValidAndPreferTheLowestOffered) {
  std::mt19937 rng(GetParam());
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::string prefixes[] = {std::string(kSharedIdPrefix), std::string(kSharedIdPrefix),
                                  "rdma/hca-", "x1y"};
  int answered = 0;
  for (int round = 0; round < 200; ++round) {
    const auto count = static_cast<std::uint32_t>(pick(1, 1600));
    const Request r = RandomSharedRequest(rng, prefixes[rng() % 4], 1500, round % 2 == 0);
    const std::vector<std::string_view> available(r.available.begin(), r.available.end());
    const std::vector<std::string_view> must(r.must_include.begin(), r.must_include.end());
    const absl::StatusOr<Ids> got = AnswerShared(available, must, r.size, count);
    const absl::Status valid = ValidateRequest(r);
    ASSERT_EQ(got.status(), valid) << "round " << round;
    if (!got.ok()) continue;
    ++answered;
    EXPECT_EQ(AnswerShared(available, must, r.size, count).value(), *got) << "round " << round;
    ASSERT_EQ(got->size(), static_cast<std::size_t>(r.size)) << "round " << round;
    const std::set<std::string> in(got->begin(), got->end());
    EXPECT_EQ(in.size(), got->size()) << "round " << round;
    for (const std::string& id : *got) {
      EXPECT_EQ(std::count(r.available.begin(), r.available.end(), id), 1) << id;
    }
    for (const std::string& id : r.must_include) EXPECT_EQ(in.count(id), 1u) << id;
    auto offered = [count](const std::string& id) {
      const std::optional<std::uint32_t> i = SharedIndex(id);
      return i && *i < count;
    };
    const std::set<std::string> must_set(r.must_include.begin(), r.must_include.end());
    std::int64_t highest_taken = -1, lowest_left = INT64_MAX;
    bool all_offered_taken = true, other_taken = false;
    for (const std::string& id : r.available) {
      if (must_set.count(id)) continue;
      if (!offered(id)) {
        other_taken = other_taken || in.count(id);
        continue;
      }
      const std::int64_t i = *SharedIndex(id);
      if (in.count(id)) {
        highest_taken = std::max(highest_taken, i);
      } else {
        lowest_left = std::min(lowest_left, i);
        all_offered_taken = false;
      }
    }
    EXPECT_LT(highest_taken, lowest_left) << "round " << round;
    EXPECT_TRUE(!other_taken || all_offered_taken) << "round " << round;
  }
  EXPECT_GT(answered, 20);
}

INSTANTIATE_TEST_SUITE_P(Seeds, AllocatorPropertyTest, ::testing::Range(1, 41));

}  // namespace
}  // namespace rdp::allocator
