// The built binary end to end: `serve` (the default subcommand) against a fake node and the
// kubelet simulator, stopped by SIGTERM; bad flags; `probe`. Child processes: test/support/child.h.

#include <signal.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/kubelet_sim.h"
#include "test/support/child.h"
#include "test/support/temp_dir.h"
#include "test/support/test_node.h"

namespace rdp::cmd {
namespace {

using sim::KubeletSim;

constexpr absl::Duration kTimeout = absl::Seconds(20);

int RunBinary(const std::vector<std::string>& args) {
  return rdp::testing::RunToEnd(testing::PluginBinary(), args, kTimeout);
}

TEST(ServeCmdTest, BadValuesExitTwo) {
  EXPECT_EQ(RunBinary({"--mode", "both"}), 2);
  EXPECT_EQ(RunBinary({"serve", "--shared-devices", "many"}), 2);
  EXPECT_EQ(RunBinary({"--health-interval", "soon"}), 2);
  EXPECT_EQ(RunBinary({"--resource-name", "hca"}), 2);
  EXPECT_EQ(RunBinary({"--sysfs-root", "/nonexistent-rdp-root"}), 2);
  EXPECT_EQ(RunBinary({"probe", "--timeout", "-1s"}), 2);
  // The label key never chooses the mode: with shared mode (the default) it is a contradiction.
  EXPECT_EQ(RunBinary({"--exclusive-label", "rdma.network.alibabacloud.com/exclusive"}), 2);
  EXPECT_EQ(RunBinary({"--mode", "shared", "--exclusive-label", "x"}), 2);
}

TEST(ServeCmdTest, ServesRegistersAndStopsOnSigterm) {
  rdp::testing::TestNode node;
  const std::string kubelet_dir = node.dir().Sub("dp");
  KubeletSim kubelet(kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  rdp::testing::Child plugin(testing::PluginBinary(), {"--mode", "exclusive", "--exclusive-label",
                           "rdma.network.alibabacloud.com/exclusive",
                           "--node-name", "node-a", "--sysfs-root", node.root(),
                           "--dev-root", node.root(), "--kubelet-dir",
                           kubelet_dir, "--proc-root", node.root(),
                           "--health-interval", "100ms", "--log-level", "info",
                           // Last and written with '=', as a chart's extraArgs has it: off.
                           "--pod-resources-socket="});
  ASSERT_TRUE(plugin.running());
  auto reg = kubelet.WaitForRegistration(0, absl::Seconds(20));
  // The GPUDirect RDMA line at start, from the node's trees (--proc-root: the fixture's, empty).
  EXPECT_TRUE(plugin.WaitForOutput(
      "GPUDirect RDMA unavailable: nvidia-peermem no (not loaded); dma-buf no (no NVIDIA driver",
      kTimeout))
      << plugin.output();
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->resource_name, "rdma/hca");
  // Healthy: no pod-resources socket configured, so nothing is withheld.
  auto devices = kubelet.WaitForDevices(
      [](const KubeletSim::Devices& d) {
        if (d.size() != 4) return false;
        for (const auto& x : d) {
          if (x.health() != "Healthy") return false;
        }
        return true;
      },
      absl::Seconds(20));
  EXPECT_TRUE(devices.has_value());
  EXPECT_EQ(RunBinary({"probe", "--kubelet-dir", kubelet_dir}), 0);

  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(kTimeout), 0);
  struct stat st;
  EXPECT_NE(::stat((kubelet_dir + "/rdma-hca.sock").c_str(), &st), 0) << "socket left behind";
  EXPECT_EQ(RunBinary({"probe", "--kubelet-dir", kubelet_dir, "--timeout", "200ms"}), 1);
}

// The early-warning flags (docs/server.md): a value that cannot work exits 2 naming the flag.
TEST(ServeCmdTest, EarlyWarningFlagsExitTwoNamingTheFlag) {
  for (const auto& [flag, value] : {std::pair{"--degraded-window", "0s"},
                                    std::pair{"--flap-window", "soon"},
                                    std::pair{"--flap-stable", "-1m"},
                                    std::pair{"--flap-count", "-1"},
                                    std::pair{"--degraded-symbol-errors", "-3"}}) {
    // A flag that were taken would serve: in a directory of the test's, never the node's.
    rdp::testing::TempDir dir;
    rdp::testing::Child child(testing::PluginBinary(), {"serve", "--kubelet-dir", dir.path(),
                                           "--pod-resources-socket=", flag, value});
    EXPECT_EQ(child.Wait(kTimeout), 2) << flag;
    EXPECT_THAT(child.output(), ::testing::HasSubstr(flag)) << child.output();
  }
}

}  // namespace
}  // namespace rdp::cmd
