#pragma once

// A fake node in a temp dir, for the tests of every module that reads one: HCAs laid out by
// sim::SysfsFixture under <dir>/node (its sys/ and dev/ trees; the node's /proc when a test writes
// one there), four of them unless a test gives its own.

#include <memory>
#include <string>
#include <vector>

#include "base/env.h"
#include "sim/sysfs_fixture.h"
#include "test/support/temp_dir.h"

namespace rdp::testing {

sim::FixtureHca FixtureCard(const std::string& name, const std::string& pci, int numa,
                            const std::string& root);

// Four HCAs: mlx5_0/1 on NUMA 0, mlx5_2/3 on NUMA 1; rdma_cm present.
std::vector<sim::FixtureHca> FourCards();

class TestNode {
 public:
  // Lays out `cards` and rdma_cm (a failure is a test failure).
  explicit TestNode(const std::vector<sim::FixtureHca>& cards = FourCards());

  sim::SysfsFixture& fixture() { return fixture_; }
  const TempDir& dir() const { return dir_; }
  // <dir>/node: pass as --sysfs-root, --dev-root and --proc-root.
  std::string root() const { return dir_.Sub("node"); }
  // The node's trees (sys, dev, proc) under root().
  std::shared_ptr<Env> NodeEnv() const;

 private:
  TempDir dir_;
  sim::SysfsFixture fixture_;
};

}  // namespace rdp::testing
