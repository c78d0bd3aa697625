// The built binary end to end: `serve` (the default subcommand) against a fake node and the
// kubelet simulator, stopped by SIGTERM; bad flags; `probe`. Child processes are awaited through
// a pidfd with a bounded timeout.

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/kubelet_sim.h"
#include "test/server/test_node.h"

extern char** environ;

namespace rdp::server {
namespace {

constexpr int kTimeoutMs = 20000;

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(RDP_BINARY));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, RDP_BINARY, nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// The child's exit code, or -1 when it did not exit within the timeout (then it is killed).
int Wait(pid_t pid, int timeout_ms = kTimeoutMs) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    struct pollfd p = {fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    ::close(fd);
    if (ready <= 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return -1;
    }
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int RunBinary(const std::vector<std::string>& args) { return Wait(Spawn(args)); }

TEST(ServeCmdTest, BadValuesExitTwo) {
  EXPECT_EQ(RunBinary({"--mode", "both"}), 2);
  EXPECT_EQ(RunBinary({"serve", "--shared-devices", "many"}), 2);
  EXPECT_EQ(RunBinary({"--health-interval", "soon"}), 2);
  EXPECT_EQ(RunBinary({"--resource-name", "hca"}), 2);
  EXPECT_EQ(RunBinary({"--sysfs-root", "/nonexistent-rdp-root"}), 2);
  EXPECT_EQ(RunBinary({"probe", "--timeout", "-1s"}), 2);
}

TEST(ServeCmdTest, ServesRegistersAndStopsOnSigterm) {
  testing::TestNode node;
  const Config config = node.MakeConfig(Mode::kExclusive);
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  const pid_t pid = Spawn({"--exclusive-label", "rdma.network.alibabacloud.com/exclusive",
                           "--node-name", "node-a", "--sysfs-root", config.discovery.sysfs_root,
                           "--dev-root", config.discovery.dev_root, "--kubelet-dir",
                           config.kubelet_dir, "--health-interval", "100ms", "--log-level",
                           "warn",
                           // Last and written with '=', as a chart's extraArgs has it: off.
                           "--pod-resources-socket="});
  ASSERT_GT(pid, 0);
  auto reg = kubelet.WaitForRegistration(0, absl::Seconds(20));
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
  EXPECT_EQ(RunBinary({"probe", "--kubelet-dir", config.kubelet_dir}), 0);

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  EXPECT_EQ(Wait(pid), 0);
  struct stat st;
  EXPECT_NE(::stat(config.SocketPath().c_str(), &st), 0) << "socket left behind";
  EXPECT_EQ(RunBinary({"probe", "--kubelet-dir", config.kubelet_dir, "--timeout", "200ms"}), 1);
}

}  // namespace
}  // namespace rdp::server
