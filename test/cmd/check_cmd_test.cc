// `rdma-device-plugin check` as the binary runs it: the allocation and the roots come from the
// environment, bad flags exit 2. (What it checks: test/check/container_check_test.cc.)

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sim/sysfs_fixture.h"
#include "test/support/child.h"
#include "test/support/temp_dir.h"

namespace rdp::cmd {
namespace {

using testing::Child;

class CheckCmdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim::SysfsFixture node(dir_.path());
    const char* pcis[] = {"0000:1a:00.0", "0000:3c:00.0"};
    for (int i = 0; i < 2; ++i) {
      sim::FixtureHca hca;
      hca.name = "mlx5_" + std::to_string(i);
      hca.pci = pcis[i];
      hca.pcie_root = "pci0000:" + std::string(pcis[i]).substr(5, 2);
      ASSERT_TRUE(node.AddHca(hca).ok());
    }
  }

  // The binary's environment for a check: allocation variables unset unless given.
  Child::Options Env(std::map<std::string, std::optional<std::string>> env) {
    Child::Options o;
    o.env = {{"RDMA_HCA_NAMES", std::nullopt}, {"NCCL_IB_HCA", std::nullopt},
             {"RDP_SYSFS_ROOT", std::nullopt}, {"RDP_DEV_ROOT", std::nullopt}};
    for (auto& [k, v] : env) o.env[k] = v;
    return o;
  }

  testing::TempDir dir_;
};

TEST_F(CheckCmdTest, ReadsTheAllocationFromTheEnvironment) {
  Child check(testing::PluginBinary(),
              {"check", "--sysfs-root", dir_.path(), "--dev-root", dir_.path(), "--json"},
              Env({{"RDMA_HCA_NAMES", "mlx5_0"}}));
  EXPECT_EQ(check.Wait(absl::Seconds(20)), 1) << "it can open mlx5_1 too";
  const auto report = nlohmann::json::parse(check.stdout_text(), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << check.stdout_text();
  EXPECT_EQ(report["allocated"], nlohmann::json::array({"mlx5_0"}));
  EXPECT_EQ(report["extra"], nlohmann::json::array({"mlx5_1"}));
}

TEST_F(CheckCmdTest, RootsComeFromTheEnvironmentToo) {
  EXPECT_EQ(testing::RunToEnd(testing::PluginBinary(), {"check"}, absl::Seconds(20),
                              Env({{"RDP_SYSFS_ROOT", dir_.path()},
                                   {"RDP_DEV_ROOT", dir_.path()},
                                   {"RDMA_HCA_NAMES", "mlx5_0,mlx5_1"}})),
            0);
}

TEST_F(CheckCmdTest, BadFlagsExitTwo) {
  EXPECT_EQ(testing::RunToEnd(testing::PluginBinary(), {"check", "--no-such-flag"}, absl::Seconds(20),
                              Env({})),
            2);
  Child bad_level(testing::PluginBinary(),
                  {"check", "--sysfs-root", dir_.path(), "--log-level", "loud"},
                  Env({}));
  EXPECT_EQ(bad_level.Wait(absl::Seconds(20)), 2);
  EXPECT_THAT(bad_level.output(), ::testing::HasSubstr("--log-level"));
}

}  // namespace
}  // namespace rdp::cmd
