// `rdma-device-plugin demo` and `rdma-device-plugin fixture`, as scripts and the Go harness run
// them: the product binary runs rdma-device-plugin-sim from its directory with the same
// arguments, and without it (the image) exits 2 saying these tools are not shipped. (What the
// demo does: test/sim.)

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/support/child.h"
#include "test/support/temp_dir.h"

namespace rdp::cmd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::Child;
using testing::TempDir;
using testing::TestData;

constexpr absl::Duration kDemo = absl::Seconds(100);
constexpr absl::Duration kTimeout = absl::Seconds(20);

TEST(DevToolsCmdTest, DemoRunsTheSimulatorBesideTheBinary) {
  Child demo(testing::PluginBinary(), {"demo", "--log-level", "warn"});
  ASSERT_EQ(demo.Wait(kDemo), 0) << demo.output();
  EXPECT_THAT(demo.stdout_text(), HasSubstr("ListAndWatch -> 9 devices"));
  EXPECT_THAT(demo.stdout_text(), HasSubstr("demo finished"));
}

TEST(DevToolsCmdTest, FixtureLaysOutTheNodeOfAnExport) {
  TempDir dir;
  const std::string out = dir.Sub("node");
  Child fixture(testing::PluginBinary(),
                {"fixture", "--topology-xml", TestData("dgx-h100-like.xml"), "--out",
                             out, "--log-level", "warn"});
  ASSERT_EQ(fixture.Wait(kTimeout), 0) << fixture.output();
  EXPECT_EQ(fixture.stdout_text(), out + "\n");
  int hcas = 0;
  for (const auto& entry : fs::directory_iterator(out + "/sys/class/infiniband")) {
    hcas += entry.is_symlink();
  }
  EXPECT_EQ(hcas, 9);
  EXPECT_TRUE(fs::exists(out + "/dev/infiniband/rdma_cm"));
}

// --node: a bundled node by name, its XML written beside the trees; dgx-roles has 10 HCAs, two
// of them VFs with a physfn link.
TEST(DevToolsCmdTest, FixtureLaysOutANamedNode) {
  TempDir dir;
  const std::string out = dir.Sub("roles");
  Child fixture(testing::PluginBinary(),
                {"fixture", "--node", "dgx-roles", "--out", out, "--log-level", "warn"});
  ASSERT_EQ(fixture.Wait(kTimeout), 0) << fixture.output();
  EXPECT_EQ(fixture.stdout_text(), out + "\n" + out + "/dgx-roles.xml\n");
  EXPECT_TRUE(fs::exists(out + "/dgx-roles.xml"));
  int hcas = 0;
  for (const auto& entry : fs::directory_iterator(out + "/sys/class/infiniband")) {
    hcas += entry.is_symlink();
  }
  EXPECT_EQ(hcas, 10);
  EXPECT_EQ(fs::read_symlink(out + "/sys/bus/pci/devices/0000:15:00.1/physfn").filename(),
            "0000:15:00.0");
  // An unknown name is a usage error naming the known ones; --node and --topology-xml exclude
  // each other.
  Child unknown(testing::PluginBinary(), {"fixture", "--node", "dgx-nope", "--out", out});
  EXPECT_EQ(unknown.Wait(kTimeout), 2);
  EXPECT_THAT(unknown.output(), HasSubstr("dgx-roles"));
  EXPECT_EQ(testing::RunToEnd(testing::PluginBinary(),
                              {"fixture", "--node", "dgx-roles", "--topology-xml",
                               TestData("dgx-h100-like.xml"), "--out", out},
                              kTimeout),
            2);
}

// test/kubelet's BinaryWritesFixtures asks `fixture --help` for --out.
TEST(DevToolsCmdTest, HelpIsTheToolsOwn) {
  Child help(testing::PluginBinary(), {"fixture", "--help"});
  ASSERT_EQ(help.Wait(kTimeout), 0) << help.output();
  EXPECT_THAT(help.output(), HasSubstr("--out"));
  EXPECT_THAT(help.output(), HasSubstr("--topology-xml"));
}

TEST(DevToolsCmdTest, BadFlagsExitTwo) {
  EXPECT_EQ(testing::RunToEnd(testing::PluginBinary(), {"fixture", "--out", "/tmp/x"}, kTimeout),
            2);
  EXPECT_EQ(testing::RunToEnd(testing::PluginBinary(), {"demo", "--log-level", "loud"}, kTimeout),
            2);
}

// The image ships rdma-device-plugin alone: there, both exit 2 and say why.
TEST(DevToolsCmdTest, WithoutTheSimulatorBesideItExitsTwoSayingSo) {
  TempDir dir;
  const std::string alone = dir.Sub("rdma-device-plugin");
  // A hard link where it can be one (the binary is large); /proc/self/exe names it.
  std::error_code ec;
  fs::create_hard_link(testing::PluginBinary(), alone, ec);
  if (ec) {
    ASSERT_TRUE(fs::copy_file(testing::PluginBinary(), alone)) << alone;
  }
  for (const char* tool : {"demo", "fixture"}) {
    Child run(alone, {tool, "--out", dir.Sub("node")});
    EXPECT_EQ(run.Wait(kTimeout), 2) << tool;
    EXPECT_THAT(run.output(), HasSubstr("a development tool, not shipped in the image")) << tool;
    EXPECT_FALSE(fs::exists(dir.Sub("node"))) << tool;
  }
  // The product's own subcommands are all there.
  EXPECT_EQ(testing::RunToEnd(alone, {"--version"}, kTimeout), 0);
}

}  // namespace
}  // namespace rdp::cmd
