#include "test/support/test_node.h"

#include "gtest/gtest.h"

namespace rdp::testing {

sim::FixtureHca FixtureCard(const std::string& name, const std::string& pci, int numa,
                            const std::string& root) {
  sim::FixtureHca h;
  h.name = name;
  h.pci = pci;
  h.numa = numa;
  h.pcie_root = root;
  return h;
}

std::vector<sim::FixtureHca> FourCards() {
  return {FixtureCard("mlx5_0", "0000:1a:00.0", 0, "pci0000:15"),
          FixtureCard("mlx5_1", "0000:3a:00.0", 0, "pci0000:37"),
          FixtureCard("mlx5_2", "0000:9a:00.0", 1, "pci0000:97"),
          FixtureCard("mlx5_3", "0000:ba:00.0", 1, "pci0000:b7")};
}

TestNode::TestNode(const std::vector<sim::FixtureHca>& cards) : fixture_(dir_.Sub("node")) {
  for (const auto& c : cards) EXPECT_TRUE(fixture_.AddHca(c).ok()) << c.name;
  EXPECT_TRUE(fixture_.AddRdmaCm().ok());
}

std::shared_ptr<Env> TestNode::NodeEnv() const {
  const std::string r = root();
  return NewNodeEnv({r, r, r});
}

}  // namespace rdp::testing
