#pragma once

// Discovery for a test: the snapshot, or null with the error reported as a test failure.

#include "gtest/gtest.h"
#include "topology/discovery.h"

namespace rdp::testing {

inline topology::TopologyPtr Load(const topology::DiscoveryOptions& o) {
  auto t = topology::Discover(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : nullptr;
}

}  // namespace rdp::testing
