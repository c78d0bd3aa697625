#pragma once

// Discovery for a test: the snapshot, or null with the error reported as a test failure.

#include <string>

#include "gtest/gtest.h"
#include "test/support/temp_dir.h"
#include "topology/discovery.h"

namespace rdp::testing {

inline topology::TopologyPtr Load(const topology::DiscoveryOptions& o) {
  auto t = topology::Discover(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : nullptr;
}

// The topology of test/data/<file> alone (no sysfs).
inline topology::TopologyPtr LoadXml(const std::string& file) {
  topology::DiscoveryOptions o;
  o.topology_xml = TestData(file);
  return Load(o);
}

}  // namespace rdp::testing
