#include "dra/slices.h"

#include "gtest/gtest.h"

namespace rdp::dra {
namespace {

std::vector<nlohmann::json> Devices(int n) {
  std::vector<nlohmann::json> out;
  for (int i = 0; i < n; ++i) out.push_back({{"name", "hca-" + std::to_string(i)}});
  return out;
}

TEST(DRASlicesTest, NoDeviceNoSlice) {
  EXPECT_TRUE(BuildResourceSlices({}, {"rdma.example.com", "node-a", "", 1}).empty());
}

TEST(DRASlicesTest, OnePoolSplitAtTheLimitWithOwner) {
  const auto slices = BuildResourceSlices(Devices(kMaxDevicesPerSlice + 1),
                                          {"rdma.example.com", "node-a", "uid-1", 7});
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0]["metadata"]["name"], "node-a-rdma.example.com-0");
  EXPECT_EQ(slices[1]["metadata"]["name"], "node-a-rdma.example.com-1");
  EXPECT_EQ(slices[0]["spec"]["devices"].size(), kMaxDevicesPerSlice);
  EXPECT_EQ(slices[1]["spec"]["devices"][0]["name"], "hca-64");
  for (const auto& s : slices) {
    EXPECT_EQ(s["apiVersion"], "resource.k8s.io/v1");
    EXPECT_EQ(s["spec"]["driver"], "rdma.example.com");
    EXPECT_EQ(s["spec"]["nodeName"], "node-a");
    EXPECT_EQ(s["spec"]["pool"]["name"], "node-a");
    EXPECT_EQ(s["spec"]["pool"]["generation"], 7);
    EXPECT_EQ(s["spec"]["pool"]["resourceSliceCount"], 2);
    EXPECT_EQ(s["metadata"]["ownerReferences"][0]["kind"], "Node");
    EXPECT_EQ(s["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  }
}

TEST(DRASlicesTest, LongNodeNameKeepsTheNameADnsSubdomain) {
  const auto slices = BuildResourceSlices(Devices(1), {"rdma.example.com", std::string(250, 'n'), "", 1});
  ASSERT_EQ(slices.size(), 1u);
  const std::string name = slices[0]["metadata"]["name"];
  EXPECT_LE(name.size(), 253u);
  EXPECT_EQ(name.substr(name.size() - 19), "-rdma.example.com-0");
  EXPECT_FALSE(slices[0]["metadata"].contains("ownerReferences"));
}

}  // namespace
}  // namespace rdp::dra
