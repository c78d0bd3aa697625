#include "allocator/allocator.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/allocator/fixtures.h"

namespace rdp::allocator {
namespace {

using ::rdp::allocator::testing::Dgx;
using ::rdp::allocator::testing::MakeDgx;
using ::rdp::allocator::testing::NodeBuilder;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

using Ids = std::vector<std::string>;

Request Req(Ids available, int size, Ids must = {}, Ids gpus = {}) {
  Request r;
  r.available = std::move(available);
  r.size = size;
  r.must_include = std::move(must);
  r.gpus.container_gpus = std::move(gpus);
  return r;
}

// AnswerShared on views of `r`'s IDs, `count` IDs offered.
absl::StatusOr<Ids> Shared(const Request& r, std::uint32_t count = 1000) {
  const std::vector<std::string_view> available(r.available.begin(), r.available.end());
  const std::vector<std::string_view> must(r.must_include.begin(), r.must_include.end());
  return AnswerShared(available, must, r.size, count);
}

// ExclusiveAllocator::Answer on views of `r`'s IDs.
absl::StatusOr<Ids> Answer(const ExclusiveAllocator& a, const Request& r,
                           const std::vector<bool>& degraded = {}) {
  const std::vector<std::string_view> available(r.available.begin(), r.available.end());
  const std::vector<std::string_view> must(r.must_include.begin(), r.must_include.end());
  return a.Answer(available, must, r.size, r.gpus, degraded);
}

Ids Without(Ids all, const Ids& gone) {
  Ids out;
  for (const std::string& id : all) {
    if (std::find(gone.begin(), gone.end(), id) == gone.end()) out.push_back(id);
  }
  return out;
}

Ids Prefer(const ExclusiveAllocator& a, const Request& r) {
  absl::StatusOr<Ids> got = a.Prefer(r);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : Ids{};
}

// ---- validation -------------------------------------------------------------------------

TEST(ValidateRequestTest, AcceptsAWellFormedRequest) {
  EXPECT_TRUE(ValidateRequest(Req({"a", "b"}, 2, {"a"})).ok());
}

TEST(ValidateRequestTest, RejectsEachMalformedRequest) {
  const std::vector<Request> bad = {
      Req({"a"}, 0),                  // size 0
      Req({"a"}, -3),                 // negative size
      Req({"a"}, 2),                  // more than available
      Req({}, 1),                     // nothing available
      Req({"a", "b"}, 1, {"a", "b"}), // must_include larger than size
      Req({"a", "b"}, 2, {"c"}),      // must_include not available
      Req({"a", "a"}, 1),             // duplicate available
      Req({"a", "b"}, 2, {"a", "a"}), // duplicate must_include
      Req({"a", ""}, 1),              // empty ID
  };
  for (const Request& r : bad) {
    EXPECT_EQ(ValidateRequest(r).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Shared(r).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// A node's few HCAs are checked pairwise, a long list by hashing: the same message either way.
TEST(ValidateRequestTest, SmallAndLargeRequestsNameTheSameProblem) {
  auto padded = [](Request r, int extra) {
    for (int i = 0; i < extra; ++i) r.available.push_back("pad-" + std::to_string(i));
    return r;
  };
  const std::vector<std::pair<Request, std::string>> bad = {
      {Req({"a", "b", "a"}, 1), "duplicate ID in available: a"},
      {Req({"a", "b"}, 2, {"b", "b"}), "duplicate ID in must_include: b"},
      {Req({"a", "b"}, 2, {"c"}), "must_include ID not available: c"},
      {Req({"a", ""}, 1), "empty ID in available"},
  };
  for (const auto& [r, message] : bad) {
    EXPECT_EQ(ValidateRequest(r).message(), message);
    EXPECT_EQ(ValidateRequest(padded(r, 40)).message(), message);
    // GetPreferredAllocation's paths name it the same way.
    EXPECT_EQ(Shared(r).status().message(), message);
    EXPECT_EQ(Shared(padded(r, 40)).status().message(), message);
    EXPECT_EQ(Answer(ExclusiveAllocator(MakeDgx().topology), r).status().message(), message);
  }
}

TEST(ExclusiveAllocatorTest, RejectsUnknownAndAliasedIds) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  Ids with_unknown = d.all_hcas;
  with_unknown.push_back("0000:ff:1f.7");
  EXPECT_EQ(a.Prefer(Req(with_unknown, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Prefer(Req({"not-a-pci-address"}, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A GPU is not an HCA.
  EXPECT_EQ(a.Prefer(Req({d.all_gpus[0]}, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Two spellings of one device.
  std::string upper = d.all_hcas[0];
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(a.Prefer(Req({d.all_hcas[0], upper}, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Prefer(Req(d.all_hcas, 0)).status().code(), absl::StatusCode::kInvalidArgument);
}

// GetPreferredAllocation's path: an ID that is no HCA of the snapshot (unknown, a GPU) is left
// out of the choice, kept when the kubelet must include it, and completes the answer only when
// the HCAs are too few; every ID is spelled as the request spelled it; a request of offered IDs
// gets Prefer's choice.
TEST(ExclusiveAnswerTest, IdsNotOfferedCompleteTheAnswerOnly) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  const std::string upper = d.all_hcas[0].substr(5);  // "bb:dd.f": another spelling
  const std::string gone = "0000:ff:1f.7";
  EXPECT_EQ(Answer(a, Req({gone, upper, d.all_gpus[0]}, 1)).value(), Ids{upper});
  EXPECT_EQ(Answer(a, Req({gone, upper, d.all_gpus[0]}, 3)).value(),
            (Ids{upper, gone, d.all_gpus[0]}));
  EXPECT_EQ(Answer(a, Req({upper, gone}, 1, {gone})).value(), Ids{gone});
  EXPECT_EQ(Answer(a, Req({upper, gone, d.all_hcas[1]}, 2, {gone})).value(),
            (Ids{gone, upper}));
  for (const Request& r : {Req(d.all_hcas, 2), Req(d.all_hcas, 3, {d.lone_hca}),
                           Req(d.all_hcas, 2, {}, {d.switch_gpus[2][0]})}) {
    EXPECT_EQ(Answer(a, r).value(), a.Prefer(r).value());
  }
  const absl::StatusOr<Ids> twice = Answer(a, Req({d.all_hcas[0], upper}, 1));
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.status().message(), "one device named twice in the request");
}

// HCAs flagged degraded are taken only to complete the answer; one the kubelet must include is
// kept.
TEST(ExclusiveAnswerTest, DegradedHcasOnlyComplete) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  const std::string& x = d.switch_hcas[0][0];
  const std::string& y = d.switch_hcas[3][1];
  std::vector<bool> degraded(d.topology->hcas().size(), true);
  degraded[d.topology->HcaIndex(x)] = false;
  degraded[d.topology->HcaIndex(y)] = false;
  EXPECT_EQ(Answer(a, Req(d.all_hcas, 2), degraded).value(), (Ids{x, y}));
  const Ids three = Answer(a, Req(d.all_hcas, 3), degraded).value();
  EXPECT_EQ(three.size(), 3u);
  EXPECT_EQ(std::count(three.begin(), three.end(), x), 1);
  EXPECT_EQ(std::count(three.begin(), three.end(), y), 1);
  EXPECT_EQ(Answer(a, Req(d.all_hcas, 1, {d.lone_hca}), degraded).value(), Ids{d.lone_hca});
  EXPECT_EQ(Answer(a, Req(d.all_hcas, 2, {d.lone_hca}), degraded).value().size(), 2u);
}

TEST(ExclusiveAllocatorTest, EmptyTopologyRejectsEverything) {
  ExclusiveAllocator a(std::make_shared<const topology::Topology>(
      std::vector<int>{}, std::vector<topology::Hca>{}, std::vector<topology::Gpu>{}));
  EXPECT_EQ(a.Prefer(Req({"0000:1a:00.0"}, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ExclusiveAllocatorTest, AcceptsAnyCaseAndAnswersInSnapshotSpelling) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  std::string upper = d.all_hcas[3];
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_THAT(Prefer(a, Req({upper}, 1)), ElementsAre(d.all_hcas[3]));
}

TEST(ExclusiveAllocatorTest, IgnoresUnknownGpusInTheContext) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  Request r = Req(d.all_hcas, 1, {}, {"0000:ee:00.0", "garbage", d.switch_gpus[2][0]});
  EXPECT_THAT(Prefer(a, r), ElementsAre(d.switch_hcas[2][0]));
}

// ---- GPU alignment ----------------------------------------------------------------------

TEST(ExclusiveAllocatorTest, ContainerGpusUnderOneSwitchGetThatSwitchsHcas) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  for (int s = 0; s < 4; ++s) {
    EXPECT_THAT(Prefer(a, Req(d.all_hcas, 1, {}, d.switch_gpus[s])),
                ElementsAre(d.switch_hcas[s][0]))
        << "switch " << s;
    EXPECT_THAT(Prefer(a, Req(d.all_hcas, 2, {}, d.switch_gpus[s])),
                ElementsAre(d.switch_hcas[s][0], d.switch_hcas[s][1]))
        << "switch " << s;
  }
}

TEST(ExclusiveAllocatorTest, OneGpuOneHcaEachSwitchIndependently) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  // The GPU's own switch mate is taken: the other HCA of that switch is next.
  Request r = Req(Without(d.all_hcas, {d.switch_hcas[1][0]}), 1, {}, {d.switch_gpus[1][1]});
  EXPECT_THAT(Prefer(a, r), ElementsAre(d.switch_hcas[1][1]));
}

TEST(ExclusiveAllocatorTest, SwitchFullFallsBackToSameNumaBeforeOtherSocket) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  // Switch 2 (NUMA 1) has no HCA left: NODE on NUMA 1 beats SYS, and among the NODE ones the
  // lone HCA, which keeps switch 3 intact for the pods that will get its GPUs.
  Request r = Req(Without(d.all_hcas, d.switch_hcas[2]), 1, {}, {d.switch_gpus[2][0]});
  EXPECT_THAT(Prefer(a, r), ElementsAre(d.lone_hca));
}

TEST(ExclusiveAllocatorTest, EightGpusTwoHcasSpreadOverBothNumaNodes) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  Ids got = Prefer(a, Req(d.all_hcas, 2, {}, d.all_gpus));
  // Lowest addresses that cover both sockets: first HCA of switch 0 and of switch 2.
  EXPECT_THAT(got, ElementsAre(d.switch_hcas[0][0], d.switch_hcas[2][0]));
}

TEST(ExclusiveAllocatorTest, EightGpusFourHcasOnePerSwitch) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  EXPECT_THAT(Prefer(a, Req(d.all_hcas, 4, {}, d.all_gpus)),
              ElementsAre(d.switch_hcas[0][0], d.switch_hcas[1][0], d.switch_hcas[2][0],
                          d.switch_hcas[3][0]));
}

TEST(ExclusiveAllocatorTest, EightGpusEightHcasTakesTheGpuHcasNotTheLoneOne) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  Ids got = Prefer(a, Req(d.all_hcas, 8, {}, d.all_gpus));
  EXPECT_EQ(got, Without(d.all_hcas, {d.lone_hca}));
}

TEST(ExclusiveAllocatorTest, MoreHcasThanGpusStayNextToThem) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  // One GPU on switch 3, two HCAs: both of switch 3 (PIX), not the lone HCA (NODE).
  EXPECT_THAT(Prefer(a, Req(d.all_hcas, 2, {}, {d.switch_gpus[3][1]})),
              ElementsAre(d.switch_hcas[3][0], d.switch_hcas[3][1]));
  // Two GPUs on different switches, four HCAs: two per GPU's switch.
  EXPECT_THAT(Prefer(a, Req(d.all_hcas, 4, {}, {d.switch_gpus[0][0], d.switch_gpus[3][0]})),
              ElementsAre(d.switch_hcas[0][0], d.switch_hcas[0][1], d.switch_hcas[3][0],
                          d.switch_hcas[3][1]));
}

TEST(ExclusiveAllocatorTest, TwoLevelSwitchesPreferPxbOverHostBridge) {
  NodeBuilder b;
  int root = b.Root(0);
  int top = b.Switch(root);
  int leaf_a = b.Switch(root, top);
  int leaf_b = b.Switch(root, top);
  int other_root = b.Root(0);
  std::string gpu = b.Gpu(root, leaf_a);
  std::string far = b.Hca(other_root, -1);  // NODE to the GPU
  std::string pxb = b.Hca(root, leaf_b);    // three switches, no host bridge
  std::string pix = b.Hca(root, leaf_a);
  ExclusiveAllocator a(b.Build());
  ASSERT_EQ(a.topology()->Path(a.topology()->HcaIndex(pxb), 0), topology::PathClass::kPXB);
  EXPECT_THAT(Prefer(a, Req({far, pxb}, 1, {}, {gpu})), ElementsAre(pxb));
  EXPECT_THAT(Prefer(a, Req({far, pxb, pix}, 1, {}, {gpu})), ElementsAre(pix));
}

TEST(ExclusiveAllocatorTest, FewerHcasThanGpus) {
  NodeBuilder b;
  std::vector<std::string> gpus, hcas;
  for (int numa = 0; numa < 2; ++numa) {
    int root = b.Root(numa);
    int sw = b.Switch(root);
    for (int i = 0; i < 4; ++i) gpus.push_back(b.Gpu(root, sw));
    hcas.push_back(b.Hca(root, sw));
  }
  ExclusiveAllocator a(b.Build());
  EXPECT_THAT(Prefer(a, Req(hcas, 1, {}, {gpus[5]})), ElementsAre(hcas[1]));
  EXPECT_THAT(Prefer(a, Req(hcas, 2, {}, gpus)), ElementsAre(hcas[0], hcas[1]));
}

// ---- must_include -----------------------------------------------------------------------

TEST(ExclusiveAllocatorTest, MustIncludeIsKeptAndTheRestStillAligns) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  Request r = Req(d.all_hcas, 2, {d.lone_hca}, {d.switch_gpus[1][0]});
  EXPECT_THAT(Prefer(a, r), UnorderedElementsAre(d.lone_hca, d.switch_hcas[1][0]));
  // must_include already fills the request.
  Request full = Req(d.all_hcas, 2, {d.switch_hcas[3][1], d.switch_hcas[0][0]});
  EXPECT_THAT(Prefer(a, full), ElementsAre(d.switch_hcas[0][0], d.switch_hcas[3][1]));
}

// ---- placing for the future -------------------------------------------------------------

TEST(ExclusiveAllocatorTest, WithoutGpuContextTakesAGpuNeighbourNotTheLoneHca) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  EXPECT_THAT(Prefer(a, Req(d.all_hcas, 1)), ElementsAre(d.switch_hcas[0][0]));
  // Only the lone HCA and one switch HCA left: still the GPU neighbour.
  EXPECT_THAT(Prefer(a, Req({d.lone_hca, d.switch_hcas[2][1]}, 1)),
              ElementsAre(d.switch_hcas[2][1]));
}

TEST(ExclusiveAllocatorTest, WithoutGpuContextFollowsFreeGpus) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  Request r = Req(d.all_hcas, 1);
  r.gpus.free_gpus_known = true;
  r.gpus.free_gpus = d.switch_gpus[3];
  EXPECT_THAT(Prefer(a, r), ElementsAre(d.switch_hcas[3][0]));
}

TEST(ExclusiveAllocatorTest, WithoutGpuContextBinPacksIntoAPartlyUsedSwitch) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  // Switch 2's first HCA is held by another pod: its mate is taken next, keeping switches
  // 0, 1 and 3 intact.
  EXPECT_THAT(Prefer(a, Req(Without(d.all_hcas, {d.switch_hcas[2][0]}), 1)),
              ElementsAre(d.switch_hcas[2][1]));
}

TEST(ExclusiveAllocatorTest, WithoutGpuContextCoversTheAvailableNumaNodes) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  // Two HCAs over two NUMA nodes: one each, whole-switch pairs stay intact elsewhere.
  EXPECT_THAT(Prefer(a, Req(d.all_hcas, 2)),
              ElementsAre(d.switch_hcas[0][0], d.switch_hcas[2][0]));
  // Four: a whole switch per NUMA node.
  EXPECT_THAT(Prefer(a, Req(d.all_hcas, 4)),
              ElementsAre(d.switch_hcas[0][0], d.switch_hcas[0][1], d.switch_hcas[2][0],
                          d.switch_hcas[2][1]));
  // The kubelet narrowed `available` to NUMA 0: both from one switch.
  Ids numa0 = {d.switch_hcas[0][0], d.switch_hcas[0][1], d.switch_hcas[1][0],
               d.switch_hcas[1][1]};
  EXPECT_THAT(Prefer(a, Req(numa0, 2)), ElementsAre(d.switch_hcas[0][0], d.switch_hcas[0][1]));
}

// ---- degraded ---------------------------------------------------------------------------

TEST(ExclusiveAllocatorTest, AvoidsSlowerAndPartlyDownHcas) {
  Dgx d = MakeDgx({"4"});  // switch 2's first HCA runs at 200 Gb/s
  ExclusiveAllocator a(d.topology);
  EXPECT_THAT(Prefer(a, Req(d.all_hcas, 1, {}, {d.switch_gpus[2][0]})),
              ElementsAre(d.switch_hcas[2][1]));

  NodeBuilder b;
  int root = b.Root(0);
  int sw = b.Switch(root);
  std::string gpu = b.Gpu(root, sw);
  std::string half_down = b.Hca(root, sw, "400 Gb/sec", 2, 1);
  std::string healthy = b.Hca(root, sw, "400 Gb/sec", 2, 2);
  ExclusiveAllocator two_port(b.Build());
  EXPECT_THAT(Prefer(two_port, Req({half_down, healthy}, 1, {}, {gpu})), ElementsAre(healthy));
}

// ---- determinism ------------------------------------------------------------------------

TEST(ExclusiveAllocatorTest, SameAnswerWhateverTheInputOrder) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  Request r = Req(d.all_hcas, 3, {}, {d.switch_gpus[0][0], d.switch_gpus[3][1]});
  Ids first = Prefer(a, r);
  std::reverse(r.available.begin(), r.available.end());
  std::reverse(r.gpus.container_gpus.begin(), r.gpus.container_gpus.end());
  EXPECT_EQ(Prefer(a, r), first);
  ExclusiveAllocator copy = a;
  EXPECT_EQ(Prefer(copy, r), first);
}

// ---- placeholder and Evaluate -----------------------------------------------------------

TEST(ExclusiveAllocatorTest, PlaceholderIsNumaCompactLowestAddresses) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  // NUMA 1 has five HCAs (two switches and the lone one), NUMA 0 four: NUMA 1 first.
  absl::StatusOr<Ids> got = a.PreferPlaceholder(Req(d.all_hcas, 2));
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(*got, ElementsAre(d.switch_hcas[2][0], d.switch_hcas[2][1]));
  // must_include's NUMA node comes first.
  got = a.PreferPlaceholder(Req(d.all_hcas, 2, {d.switch_hcas[1][1]}));
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(*got, ElementsAre(d.switch_hcas[0][0], d.switch_hcas[1][1]));
}

TEST(ExclusiveAllocatorTest, EvaluateScoresAndRejectsInvalidAnswers) {
  Dgx d = MakeDgx();
  ExclusiveAllocator a(d.topology);
  Request r = Req(d.all_hcas, 2, {}, d.switch_gpus[1]);
  absl::StatusOr<Score> good = a.Evaluate(r, d.switch_hcas[1]);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->gpu_match, 16);
  absl::StatusOr<Score> worse = a.Evaluate(r, {d.switch_hcas[1][0], d.lone_hca});
  ASSERT_TRUE(worse.ok());
  EXPECT_EQ(worse->gpu_match, 8);
  EXPECT_TRUE(*worse < *good);
  EXPECT_FALSE(a.Evaluate(r, {d.switch_hcas[1][0]}).ok());
  EXPECT_FALSE(a.Evaluate(r, {d.switch_hcas[1][0], d.switch_hcas[1][0]}).ok());
  EXPECT_FALSE(a.Evaluate(Req(d.switch_hcas[0], 1, {d.switch_hcas[0][0]}),
                          {d.switch_hcas[0][1]}).ok());
}

// ---- shared mode ------------------------------------------------------------------------

TEST(AnswerSharedTest, LowestIndicesAfterMustInclude) {
  Ids available;
  for (int i = 999; i >= 0; --i) available.push_back("shared-" + std::to_string(i));
  absl::StatusOr<Ids> got = Shared(Req(available, 3, {"shared-10"}));
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(*got, ElementsAre("shared-0", "shared-1", "shared-10"));
  got = Shared(Req(available, 3));
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(*got, ElementsAre("shared-0", "shared-1", "shared-2"));
}

// IDs not offered (at or above the count, another spelling): must_include kept as given and
// first, then the choice among the offered, then the others in the request's order when the
// offered are too few.
TEST(AnswerSharedTest, IdsNotOfferedCompleteTheAnswerOnly) {
  EXPECT_EQ(Shared(Req({"shared-7", "shared-1200", "shared-3"}, 2), 1000).value(),
            (Ids{"shared-3", "shared-7"}));
  EXPECT_EQ(Shared(Req({"shared-7", "shared-1200", "x", "shared-3"}, 4), 1000).value(),
            (Ids{"shared-3", "shared-7", "shared-1200", "x"}));
  EXPECT_EQ(Shared(Req({"shared-7", "shared-01", "shared-3"}, 2, {"shared-01"}), 1000).value(),
            (Ids{"shared-01", "shared-3"}));
  EXPECT_EQ(Shared(Req({"shared-5", "shared-4"}, 1), 5).value(), (Ids{"shared-4"}));
  EXPECT_EQ(Shared(Req({"shared-5", "shared-6"}, 1), 5).value(), (Ids{"shared-5"}));
}

TEST(SharedIndexTest, CanonicalIndicesBelowTheLimit) {
  EXPECT_EQ(SharedIndex("shared-0"), 0u);
  EXPECT_EQ(SharedIndex("shared-1048575"), kMaxSharedIndex - 1);
  EXPECT_EQ(SharedIndex("unit-12", "unit-"), 12u);
  for (const char* bad : {"shared-1048576", "shared-01", "shared--1", "shared-", "shared-x",
                          "shared-+1", "shared-1 ", "Shared-1", "xshared-1", "shared-99999999999",
                          ""}) {
    EXPECT_FALSE(SharedIndex(bad).has_value()) << bad;
  }
  EXPECT_EQ(SharedId(7), "shared-7");
}

}  // namespace
}  // namespace rdp::allocator
