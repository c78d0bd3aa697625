// `topology --json` schema and the matrix rendering.

#include "topology/report.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/support/temp_dir.h"
#include "topology/discovery.h"

namespace rdp::topology {
namespace {
using ::testing::HasSubstr;

TopologyPtr DgxH100() {
  DiscoveryOptions o;
  o.topology_xml = testing::TestData("dgx-h100-like.xml");
  auto t = Discover(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

TEST(ReportJsonTest, ExactSchemaOnDgxH100Like) {
  nlohmann::ordered_json j = ToJson(*DgxH100());
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"numa_nodes", "gpus", "hcas", "paths"}));
  EXPECT_EQ(j["numa_nodes"].dump(), "[0,1]");
  EXPECT_EQ(j["gpus"][0].dump(),
            R"({"pci":"0000:18:00.0","vendor":"10de","numa":0,"pcie_root":"pci0000:15","switch":"0000:16:00.0"})");
  EXPECT_EQ(j["hcas"][0].dump(),
            R"({"name":"mlx5_0","pci":"0000:1a:00.0","numa":0,"pcie_root":"pci0000:15","switch":"0000:16:00.0",)"
            R"("uverbs":null,"ports":[{"port":1,"state":"ACTIVE","link_layer":null}],"healthy":true})");
  EXPECT_EQ(j["hcas"][8]["name"], "mlx5_bond_0");
  EXPECT_TRUE(j["hcas"][8]["switch"].is_null());
  EXPECT_EQ(j["paths"]["mlx5_0"]["0000:18:00.0"], "PIX");
  EXPECT_EQ(j["paths"]["mlx5_0"]["0000:3a:00.0"], "NODE");
  EXPECT_EQ(j["paths"]["mlx5_7"]["0000:18:00.0"], "SYS");
  EXPECT_EQ(j["paths"]["mlx5_bond_0"].size(), 8u);
  // Arrays are in PCI-address order.
  for (std::size_t i = 1; i < j["hcas"].size(); ++i) {
    EXPECT_LT(j["hcas"][i - 1]["pci"].get<std::string>(), j["hcas"][i]["pci"].get<std::string>());
  }
}

TEST(ReportJsonTest, UnknownsAreNull) {
  Hca h;
  h.name = "mlx5_0";
  h.place.pci = "0000:1a:00.0";
  Topology t({}, {h}, {});
  nlohmann::ordered_json j = ToJson(t);
  EXPECT_TRUE(j["hcas"][0]["numa"].is_null());
  EXPECT_TRUE(j["hcas"][0]["pcie_root"].is_null());
  EXPECT_TRUE(j["hcas"][0]["uverbs"].is_null());
  EXPECT_FALSE(j["hcas"][0]["healthy"].get<bool>());
  EXPECT_EQ(j["paths"].dump(), R"({"mlx5_0":{}})");
}

TEST(ReportMatrixTest, RowsColumnsLegend) {
  std::string m = RenderMatrix(*DgxH100());
  EXPECT_THAT(m, HasSubstr("GPU0  GPU1  GPU2"));
  EXPECT_THAT(m, HasSubstr("mlx5_0       PIX   PIX   NODE  NODE  SYS   SYS   SYS   SYS   0     pci0000:15"));
  EXPECT_THAT(m, HasSubstr("Legend:"));
  EXPECT_THAT(m, HasSubstr("GPU7   0000:bf:00.0 vendor=10de NUMA=1"));
}

TEST(ReportDotTest, Clusters) {
  std::string d = RenderDot(*DgxH100());
  EXPECT_THAT(d, HasSubstr("graph topology {"));
  EXPECT_THAT(d, HasSubstr("label=\"NUMA 1\""));
  EXPECT_THAT(d, HasSubstr("\"pci0000:15\" -- \"switch 0000:16:00.0\""));
  EXPECT_THAT(d, HasSubstr("\"switch 0000:16:00.0\" -- \"mlx5_0\\n0000:1a:00.0\""));
}

}  // namespace
}  // namespace rdp::topology
