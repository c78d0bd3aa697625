#pragma once

// A node that is not this machine, from an hwloc XML export: its HCAs, GPUs and NUMA nodes laid
// out as sysfs and /dev trees (SysfsFixture::AddTopology) that the plugin reads through
// --sysfs-root and --dev-root. What `rdma-device-plugin-sim fixture` writes, and the node the
// demo and bench_load serve.

#include <string>

#include "absl/status/statusor.h"
#include "topology/topology.h"

namespace rdp::sim {

// Discovers the node of the XML at `xml` and lays out its trees under `root`. The snapshot, or
// the error naming what failed (discovery of the XML, a file under `root`).
absl::StatusOr<topology::TopologyPtr> LayOutXml(const std::string& xml, const std::string& root);

struct FixtureNode {
  std::string xml;   // the export it was laid out from: pass as --topology-xml
  std::string root;  // pass as --sysfs-root and --dev-root
  topology::TopologyPtr topology;
};

// LayOutXml of `xml` under <dir>/node; `xml` empty: the bundled node (BundledNodeXml), written
// to <dir>/dgx-h100-like.xml first.
absl::StatusOr<FixtureNode> LayOutNode(const std::string& dir, const std::string& xml);

}  // namespace rdp::sim
