#pragma once

// The demo (`rdma-device-plugin-sim demo`, which `rdma-device-plugin demo` and scripts/demo.sh
// run): the built rdma-device-plugin, as a child process, serving a fixture node to this process,
// which plays the kubelet on unix sockets in a work directory: the Registration service, the
// device-plugin client and a pod-resources server. In exclusive mode, then in shared mode: the
// plugin registers, lists its devices, answers GetPreferredAllocation and Allocate; the demo
// prints what a kubelet receives. On the node with roles (`node` dgx-roles) the plugin serves a
// resources file (--config) of two resources, rdma/hca (its InfiniBand compute NICs) and
// rdma/storage (its Ethernet storage NICs): the demo prints each one's registration, list and
// allocations. The plugin's log goes to stderr as it comes.

#include <ostream>
#include <string>

namespace rdp::sim {

struct DemoOptions {
  std::string plugin_binary;  // the rdma-device-plugin to run (required)
  std::string topology_xml;   // empty: the bundled node named `node`
  std::string node;           // a name of NamedNodes() (sim/fixture_node.h); empty: the default
  std::string work_dir;       // empty: a fresh directory under $TMPDIR, removed at the end
  // After exclusive mode's allocations, print what a Prometheus scrape of the plugin returns
  // (docs/metrics.md), with pod-resources showing the demo's containers holding their HCAs. The
  // plugin then logs at info at least: its "metrics: serving on" line names the port.
  bool metrics = false;
  std::string log_level = "info";  // the plugin's --log-level
};

// Runs the demo, printing to `out`. Returns the process exit code: 0 when every step worked
// and the plugin exited 0 on SIGTERM each time, 1 otherwise (the reason printed). Every plugin
// it started has been stopped (SIGTERM, SIGKILL after 10 s) and reaped when it returns.
int RunDemo(const DemoOptions& options, std::ostream& out);

}  // namespace rdp::sim
