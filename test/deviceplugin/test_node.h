#pragma once

// Shared helpers for the server tests: a temp dir, a fake node laid out with SysfsFixture, and
// a Config with short intervals.

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "deviceplugin/config.h"
#include "deviceplugin/node_state.h"
#include "topology/discovery.h"
#include "sim/fake_pod_resources.h"
#include "sim/kubelet_sim.h"
#include "sim/sysfs_fixture.h"
#include "test/support/temp_dir.h"

namespace rdp::deviceplugin {

// The test doubles (sim/) by their short names in the server tests.
using sim::FakePodResources;
using sim::KubeletSim;
using sim::PreferredRequest;

namespace testing {

using rdp::testing::TempDir;

inline sim::FixtureHca FixtureCard(const std::string& name, const std::string& pci, int numa,
                                        const std::string& root) {
  sim::FixtureHca h;
  h.name = name;
  h.pci = pci;
  h.numa = numa;
  h.pcie_root = root;
  return h;
}

// Four HCAs: mlx5_0/1 on NUMA 0, mlx5_2/3 on NUMA 1; rdma_cm present.
inline std::vector<sim::FixtureHca> FourCards() {
  return {FixtureCard("mlx5_0", "0000:1a:00.0", 0, "pci0000:15"),
          FixtureCard("mlx5_1", "0000:3a:00.0", 0, "pci0000:37"),
          FixtureCard("mlx5_2", "0000:9a:00.0", 1, "pci0000:97"),
          FixtureCard("mlx5_3", "0000:ba:00.0", 1, "pci0000:b7")};
}

// Waits until `done()` holds or `deadline` passes, checking it again after every change of the
// node's device list, which it learns of as the plugin's own ListAndWatch streams do (a
// NodeState listener). The last value of `done()`.
inline bool WaitUntil(NodeState& node, const std::function<bool()>& done, absl::Time deadline) {
  absl::Mutex mu;
  absl::CondVar changed;
  std::uint64_t changes = 0;
  const int listener = node.AddListener([&] {
    absl::MutexLock lock(&mu);
    ++changes;
    changed.SignalAll();
  });
  bool ok = false;
  for (;;) {
    std::uint64_t seen;
    {
      absl::MutexLock lock(&mu);
      seen = changes;
    }
    ok = done();
    if (ok || absl::Now() >= deadline) break;
    absl::MutexLock lock(&mu);
    while (changes == seen && !changed.WaitWithDeadline(&mu, deadline)) {
    }
  }
  node.RemoveListener(listener);
  return ok;
}

// A node in a temp dir: fake sysfs + /dev under <dir>/node, kubelet dir <dir>/dp.
class TestNode {
 public:
  explicit TestNode(const std::vector<sim::FixtureHca>& cards = FourCards())
      : fixture_(dir_.Sub("node")) {
    for (const auto& c : cards) EXPECT_TRUE(fixture_.AddHca(c).ok()) << c.name;
    EXPECT_TRUE(fixture_.AddRdmaCm().ok());
  }
  sim::SysfsFixture& fixture() { return fixture_; }
  const TempDir& dir() const { return dir_; }

  Config MakeConfig(hca::Mode mode) const {
    Config c;
    c.mode = mode;
    c.kubelet_dir = dir_.Sub("dp");
    c.pod_resources_socket = "";
    c.discovery.sysfs_root = dir_.Sub("node");
    c.discovery.dev_root = dir_.Sub("node");
    c.proc_root = dir_.Sub("node");
    c.health_interval = absl::Milliseconds(50);
    c.register_backoff_min = absl::Milliseconds(10);
    c.register_backoff_max = absl::Milliseconds(200);
    return c;
  }

  // The node's trees (sys, dev, proc) under <dir>/node.
  std::shared_ptr<Env> NodeEnv() const {
    const std::string root = dir_.Sub("node");
    return NewNodeEnv({root, root, root});
  }

  // Discovery from sysfs alone (no hwloc), read through `env` (default: NodeEnv()): HCAs with
  // their NUMA nodes, no GPUs.
  NodeSources Sources(std::unique_ptr<PodResourcesSource> pods = nullptr,
                  std::shared_ptr<Env> env = nullptr) const {
    NodeSources sources;
    if (!env) env = NodeEnv();
    sources.env = env;
    sources.scan = [env] { return topology::ReadSysfsHcas(*env); };
    sources.discover = [env]() -> absl::StatusOr<topology::TopologyPtr> {
      auto hcas = topology::ReadSysfsHcas(*env);
      if (!hcas.ok()) return hcas.status();
      return std::make_shared<const topology::Topology>(std::vector<int>{0, 1}, *hcas,
                                                        std::vector<topology::Gpu>{});
    };
    sources.pod_resources = std::move(pods);
    return sources;
  }

 private:
  TempDir dir_;
  sim::SysfsFixture fixture_;
};

}  // namespace testing
}  // namespace rdp::deviceplugin
