#include "sim/demo.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/bundled_node.h"
#include "test/support/temp_dir.h"

namespace rdp::sim {
namespace {

using ::testing::AnyOfArray;
using ::testing::Each;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// The demo runs this build's binary as the plugin.
DemoOptions Options() {
  DemoOptions options;
  options.plugin_binary = testing::PluginBinary();
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

// The PCI addresses of every "env <variable>=" line of `text`, in order, duplicates kept.
std::vector<std::string> AllocatedPci(const std::string& text, const std::string& variable) {
  const std::string prefix = "  env " + variable + "=";
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, prefix)) {
      for (absl::string_view pci : absl::StrSplit(line, ',')) out.emplace_back(pci);
    }
  }
  return out;
}

// The node with roles: one plugin serves its compute and storage NICs as two resources, each
// registered on its own socket and listing exactly its 4 NICs (exclusive) or 1000 units of its
// own (shared); what each allocates is its own NICs, and in shared mode a unit all of them. Each
// resource names its NICs in its own variables; the plain ones are the first resource's only.
TEST(DemoTest, ServesTwoResourcesOnTheNodeWithRoles) {
  std::ostringstream out;
  DemoOptions options = Options();
  options.node = "dgx-roles";
  ASSERT_EQ(RunDemo(options, out), 0) << out.str();
  const std::string text = out.str();
  const std::vector<std::string> compute = {"0000:15:00.0", "0000:25:00.0", "0000:45:00.0",
                                            "0000:55:00.0"};
  const std::vector<std::string> storage = {"0000:31:00.0", "0000:31:00.1", "0000:61:00.0",
                                            "0000:61:00.1"};
  const std::size_t shared = text.find("== shared mode ==");
  ASSERT_NE(shared, std::string::npos) << text;
  for (const std::string mode : {"exclusive", "shared"}) {
    SCOPED_TRACE(mode);
    const std::string part = mode == "exclusive" ? text.substr(0, shared) : text.substr(shared);
    for (const std::string resource : {"hca", "storage"}) {
      EXPECT_THAT(part, HasSubstr("Register(version=v1beta1, endpoint=rdma-" + resource +
                                  ".sock, resource=rdma/" + resource + ","))
          << text;
    }
    const std::size_t hca_at = part.find("-- rdma/hca --\n");
    const std::size_t storage_at = part.find("-- rdma/storage --\n");
    ASSERT_NE(hca_at, std::string::npos) << text;
    ASSERT_NE(storage_at, std::string::npos) << text;
    ASSERT_LT(hca_at, storage_at) << text;
    const std::string hca_part = part.substr(hca_at, storage_at - hca_at);
    const std::string storage_part = part.substr(storage_at);
    const std::string list = mode == "exclusive" ? "kubelet: ListAndWatch -> 4 devices\n"
                                                 : "kubelet: ListAndWatch -> 1000 devices\n";
    EXPECT_THAT(hca_part, HasSubstr(list)) << text;
    EXPECT_THAT(storage_part, HasSubstr(list)) << text;
    const std::vector<std::string> from_hca = AllocatedPci(hca_part, "RDMA_HCA_PCI_RDMA_HCA");
    const std::vector<std::string> from_storage =
        AllocatedPci(storage_part, "RDMA_HCA_PCI_RDMA_STORAGE");
    EXPECT_EQ(AllocatedPci(hca_part, "RDMA_HCA_PCI"), from_hca) << text;
    EXPECT_THAT(AllocatedPci(storage_part, "RDMA_HCA_PCI"), IsEmpty()) << text;
    EXPECT_THAT(from_hca, Each(AnyOfArray(compute))) << text;
    EXPECT_THAT(from_storage, Each(AnyOfArray(storage))) << text;
    if (mode == "exclusive") {
      EXPECT_EQ(from_hca.size(), 4u) << "two allocations of two compute NICs\n" << text;
      EXPECT_EQ(from_storage.size(), 1u) << text;
      EXPECT_THAT(storage_part, Not(HasSubstr("umad"))) << "RoCE functions have no umad\n"
                                                        << text;
    } else {
      EXPECT_THAT(from_hca, ElementsAreArray(compute)) << text;
      EXPECT_THAT(from_storage, ElementsAreArray(storage)) << text;
    }
  }
  EXPECT_THAT(text, HasSubstr("demo finished")) << text;
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
