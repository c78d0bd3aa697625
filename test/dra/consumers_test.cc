#include "dra/consumers.h"

#include "gtest/gtest.h"

namespace rdp::dra {
namespace {

using Devices = std::vector<std::string>;

PodClaims Pod(const std::string& uid, std::vector<PodClaims::Container> containers) {
  return {{"ns", "pod-" + uid, uid}, std::move(containers)};
}

ClaimTable Table() {
  ClaimTable t;
  t["ns/x"] = ClaimDevices{"ux", {{"a", {"hca-1"}}, {"b", {"hca-2", "hca-3"}}}};
  t["ns/y"] = ClaimDevices{"uy", {{"hca", {"hca-0"}}}};
  t["ns/gpu"] = ClaimDevices{"ugpu", {}};  // another driver's claim: nothing of ours
  t["ns/lost"] = std::nullopt;             // could not be read
  return t;
}

TEST(DRAConsumersTest, OneContainerPerRequest) {
  auto got = CommonDevices({Pod("p", {{"l", {{"x", "a"}}}, {"r", {{"x", "b"}}}})}, Table());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got.at({"ux", "a"}), Devices{"hca-1"});
  EXPECT_EQ(got.at({"ux", "b"}), (Devices{"hca-2", "hca-3"}));
}

TEST(DRAConsumersTest, AContainerWithSeveralPairsNamesTheirUnionSorted) {
  auto got = CommonDevices({Pod("p", {{"c", {{"y", ""}, {"x", ""}, {"gpu", ""}}}})}, Table());
  const Devices all{"hca-0", "hca-1", "hca-2", "hca-3"};
  EXPECT_EQ(got.at({"ux", "a"}), all);
  EXPECT_EQ(got.at({"ux", "b"}), all);
  EXPECT_EQ(got.at({"uy", "hca"}), all);
  EXPECT_EQ(got.count({"ugpu", "hca"}), 0u);
}

TEST(DRAConsumersTest, HoldersWithDifferentSetsGetNothing) {
  // Two pods share y: one uses it alone, the other beside x's a.
  auto got = CommonDevices({Pod("p1", {{"c", {{"y", ""}}}}),
                            Pod("p2", {{"c", {{"y", ""}, {"x", "a"}}}})},
                           Table());
  EXPECT_FALSE(got.at({"uy", "hca"}).has_value());
  EXPECT_EQ(got.at({"ux", "a"}), (Devices{"hca-0", "hca-1"}));
  EXPECT_EQ(got.count({"ux", "b"}), 0u);  // nobody holds it
}

TEST(DRAConsumersTest, SameSetsInTwoContainersAgree) {
  auto got = CommonDevices({Pod("p", {{"c1", {{"x", "a"}}}, {"c2", {{"x", "a"}}}})}, Table());
  EXPECT_EQ(got.at({"ux", "a"}), Devices{"hca-1"});
}

TEST(DRAConsumersTest, AnUnknownClaimBesideOursMakesItsPairsUnknown) {
  auto got = CommonDevices({Pod("p", {{"c", {{"x", "a"}, {"lost", ""}}}, {"d", {{"y", ""}, {"nowhere", ""}}}})},
                           Table());
  EXPECT_FALSE(got.at({"ux", "a"}).has_value());
  EXPECT_FALSE(got.at({"uy", "hca"}).has_value());
}

TEST(DRAConsumersTest, ARequestThatIsNotOursHoldsNothing) {
  auto got = CommonDevices({Pod("p", {{"c", {{"x", "gpu"}, {"y", "hca"}}}})}, Table());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got.at({"uy", "hca"}), Devices{"hca-0"});
}

// Per pair: the names every container holding it sets, none from containers that do not.
TEST(DRAConsumersTest, PodSetVariablesAreTheHoldersNames) {
  const std::vector<PodClaims> pods = {
      Pod("p1", {{"l", {{"x", "a"}}, {"NCCL_IB_HCA", "NCCL_DEBUG"}},
                 {"r", {{"x", "b"}}, {"UCX_NET_DEVICES"}},
                 {"other", {{"gpu", ""}}, {"NCCL_SOCKET_IFNAME"}}}),
      Pod("p2", {{"c", {{"x", "a"}, {"y", ""}}, {"NCCL_IB_GID_INDEX"}}})};
  using Names = std::set<std::string>;
  auto got = PodSetVariables(pods, Table());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got.at({"ux", "a"}), (Names{"NCCL_DEBUG", "NCCL_IB_GID_INDEX", "NCCL_IB_HCA"}));
  EXPECT_EQ(got.at({"ux", "b"}), Names{"UCX_NET_DEVICES"});
  EXPECT_EQ(got.at({"uy", "hca"}), Names{"NCCL_IB_GID_INDEX"});
  // A holder that sets nothing: its pair is there, with no names.
  EXPECT_EQ(PodSetVariables({Pod("p", {{"c", {{"y", ""}}}})}, Table()).at({"uy", "hca"}), Names{});
}

}  // namespace
}  // namespace rdp::dra
