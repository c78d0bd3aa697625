#include "sim/demo.h"

#include <sstream>

#include "gtest/gtest.h"
#include "sim/bundled_node.h"

namespace rdp::sim {
namespace {

// The demo runs the built binary (RDP_BINARY) as the plugin.
DemoOptions Options() {
  DemoOptions options;
  options.plugin_binary = RDP_BINARY;
  options.log_level = "warn";
  return options;
}

TEST(DemoTest, RunsTheBinaryAgainstTheBundledNode) {
  ASSERT_FALSE(BundledNodeXml().empty());
  std::ostringstream out;
  EXPECT_EQ(RunDemo(Options(), out), 0) << out.str();
  const std::string text = out.str();
  EXPECT_NE(text.find("Register(version=v1beta1, endpoint=rdma-hca.sock, resource=rdma/hca"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ListAndWatch -> 9 devices"), std::string::npos) << text;
  EXPECT_NE(text.find("ListAndWatch -> 1000 devices"), std::string::npos) << text;
  EXPECT_NE(text.find("env NCCL_IB_HCA==mlx5_"), std::string::npos) << text;
  EXPECT_NE(text.find("device /dev/infiniband/rdma_cm"), std::string::npos) << text;
  EXPECT_NE(text.find("demo finished"), std::string::npos) << text;
}

// --metrics: the scrape of the exclusive-mode plugin after the demo's allocations (the sample
// in docs/metrics.md).
TEST(DemoTest, PrintsAScrapeOfTheExclusivePlugin) {
  std::ostringstream out;
  DemoOptions options = Options();
  options.metrics = true;
  ASSERT_EQ(RunDemo(options, out), 0) << out.str();
  const std::string text = out.str();
  EXPECT_NE(text.find("\nrdma_device_plugin_hca_allocated{hca=\"mlx5_"), std::string::npos)
      << text;
  EXPECT_NE(text.find("namespace=\"default\",pod=\"train-0\",container=\"main\",resource=\"rdma/hca\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("namespace=\"default\",pod=\"infer-0\",container=\"main\",resource=\"rdma/hca\"} 1"),
            std::string::npos);
  // infer-0's allocation had no GPU context; train-0's sat next to its GPUs.
  EXPECT_NE(text.find(
      "rdma_device_plugin_allocation_alignment_total{resource=\"rdma/hca\","
      "path_class=\"unknown\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find(
      "rdma_device_plugin_allocation_alignment_total{resource=\"rdma/hca\","
      "path_class=\"PIX\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find(
      "rdma_device_plugin_rpc_duration_seconds_count{resource=\"rdma/hca\","
      "method=\"Allocate\"} 2"),
            std::string::npos);
}

TEST(DemoTest, NoPluginBinaryFailsNamingIt) {
  std::ostringstream out;
  DemoOptions options = Options();
  options.plugin_binary = "/nonexistent/rdma-device-plugin";
  EXPECT_EQ(RunDemo(options, out), 1);
  EXPECT_NE(out.str().find("no rdma-device-plugin binary at '/nonexistent/rdma-device-plugin'"),
            std::string::npos)
      << out.str();
}

}  // namespace
}  // namespace rdp::sim
