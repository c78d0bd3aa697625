#pragma once

// The device plugin's side of the tests' fake node (test/support/test_node.h): a Config with short
// intervals on it, its NodeSources, and a wait on the node's device list.

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
#include "deviceplugin/config.h"
#include "deviceplugin/node_state.h"
#include "gtest/gtest.h"
#include "topology/discovery.h"
#include "sim/fake_pod_resources.h"
#include "sim/kubelet_sim.h"
#include "test/support/test_node.h"

namespace rdp::deviceplugin {

// The test doubles (sim/) by their short names in the server tests.
using sim::FakePodResources;
using sim::KubeletSim;
using sim::PreferredRequest;

namespace testing {

using rdp::testing::FixtureCard;
using rdp::testing::FourCards;
using rdp::testing::TempDir;

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

// The fake node (kubelet dir <dir>/dp) with the device plugin's Config and sources on it.
class TestNode : public rdp::testing::TestNode {
 public:
  using rdp::testing::TestNode::TestNode;

  Config MakeConfig(hca::Mode mode) const {
    Config c;
    c.mode = mode;
    c.kubelet_dir = dir().Sub("dp");
    c.pod_resources_socket = "";
    c.discovery.sysfs_root = root();
    c.discovery.dev_root = root();
    c.proc_root = root();
    c.health_interval = absl::Milliseconds(50);
    c.register_backoff_min = absl::Milliseconds(10);
    c.register_backoff_max = absl::Milliseconds(200);
    return c;
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
};

}  // namespace testing
}  // namespace rdp::deviceplugin
