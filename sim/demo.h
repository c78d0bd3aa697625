#pragma once

// `rdma-device-plugin demo`: the plugin against a fixture node and a built-in kubelet
// simulator, in a temporary directory. Registers, lists, makes a few allocations and prints
// what a kubelet would receive.

#include <ostream>
#include <string>

namespace rdp::sim {

struct DemoOptions {
  std::string topology_xml;  // empty: the bundled dgx-h100-like node
  std::string work_dir;      // empty: a fresh directory under $TMPDIR, removed at the end
  // After exclusive mode's allocations, print what a Prometheus scrape of the plugin returns
  // (docs/metrics.md), with pod-resources showing the demo's containers holding their HCAs.
  bool metrics = false;
};

// The bundled dgx-h100-like.xml (hwloc export; see test/data/).
const std::string& BundledNodeXml();

// Runs the demo, printing to `out`. Returns the process exit code: 0 when every step worked.
int RunDemo(const DemoOptions& options, std::ostream& out);

}  // namespace rdp::sim
