#include "sim/demo.h"

#include <sstream>

#include "gtest/gtest.h"

namespace rdp::sim {
namespace {

TEST(DemoTest, RunsAgainstTheBundledNode) {
  ASSERT_FALSE(BundledNodeXml().empty());
  std::ostringstream out;
  EXPECT_EQ(RunDemo({}, out), 0) << out.str();
  const std::string text = out.str();
  EXPECT_NE(text.find("Register(version=v1beta1, endpoint=rdma-hca.sock, resource=rdma/hca"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ListAndWatch -> 9 devices"), std::string::npos) << text;
  EXPECT_NE(text.find("ListAndWatch -> 1000 devices"), std::string::npos) << text;
  EXPECT_NE(text.find("env NCCL_IB_HCA==mlx5_"), std::string::npos) << text;
  EXPECT_NE(text.find("device /dev/infiniband/rdma_cm"), std::string::npos) << text;
}

}  // namespace
}  // namespace rdp::sim
