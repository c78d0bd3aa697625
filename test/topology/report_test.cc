// `topology --json` schema and the matrix rendering.

#include "topology/report.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/support/temp_dir.h"
#include "topology/discovery.h"

namespace rdp::topology {
namespace {
using ::testing::HasSubstr;
using ::testing::Not;

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
            R"("uverbs":null,"ports":[{"port":1,"state":"ACTIVE","link_layer":null}],"healthy":true,)"
            R"("vendor":"15b3","device":"1021","driver":null,"firmware_version":null,)"
            R"("node_guid":"a088:c203:0000:1a2b","vf":false,"pf":null})");
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

// A VF shows as one: "vf" true and its PF in JSON, "(VF of ...)" on its matrix row and in dot.
TEST(ReportJsonTest, VirtualFunctionNamesItsPf) {
  Hca pf;
  pf.name = "mlx5_0";
  pf.place.pci = "0000:1a:00.0";
  pf.vendor = "15b3";
  pf.device = "1021";
  pf.driver = "mlx5_core";
  pf.firmware_version = "28.39.1002";
  pf.node_guid = "b8ce:f603:001a:0000";
  Hca vf = pf;
  vf.name = "mlx5_8";
  vf.place.pci = "0000:1a:00.1";
  vf.device = "101e";
  vf.physfn = "0000:1a:00.0";
  Topology t({0}, {pf, vf}, {});
  nlohmann::ordered_json j = ToJson(t);
  EXPECT_EQ(j["hcas"][0]["vf"], false);
  EXPECT_TRUE(j["hcas"][0]["pf"].is_null());
  EXPECT_EQ(j["hcas"][0]["driver"], "mlx5_core");
  EXPECT_EQ(j["hcas"][0]["firmware_version"], "28.39.1002");
  EXPECT_EQ(j["hcas"][0]["node_guid"], "b8ce:f603:001a:0000");
  EXPECT_EQ(j["hcas"][1]["vf"], true);
  EXPECT_EQ(j["hcas"][1]["pf"], "0000:1a:00.0");
  EXPECT_EQ(j["hcas"][1]["device"], "101e");
  const std::string m = RenderMatrix(t);
  EXPECT_THAT(m, HasSubstr("0000:1a:00.1  (VF of 0000:1a:00.0)"));
  EXPECT_THAT(m, Not(HasSubstr("0000:1a:00.0  (VF")));
  EXPECT_THAT(RenderDot(t), HasSubstr("mlx5_8\\n0000:1a:00.1\\nVF of 0000:1a:00.0"));
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
