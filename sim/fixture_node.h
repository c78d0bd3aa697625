#pragma once

// A node that is not this machine, from an hwloc XML export: its HCAs, GPUs and NUMA nodes laid
// out as sysfs and /dev trees (SysfsFixture::AddTopology) that the plugin reads through
// --sysfs-root and --dev-root. What `rdma-device-plugin-sim fixture` writes, and the node the
// demo and bench_load serve.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/topology.h"

namespace rdp::sim {

// Discovers the node of the XML at `xml` and lays out its trees under `root`. The snapshot, or
// the error naming what failed (discovery of the XML, a file under `root`).
absl::StatusOr<topology::TopologyPtr> LayOutXml(const std::string& xml, const std::string& root);

struct FixtureNode {
  std::string xml;   // the export it was laid out from: pass as --topology-xml
  std::string root;  // pass as --sysfs-root and --dev-root
  // What discovery finds on it (with --topology-xml and --sysfs-root): a named node's VFs too.
  topology::TopologyPtr topology;
};

// LayOutXml of `xml` under <dir>/node; `xml` empty: the bundled node (BundledNodeXml), written
// to <dir>/dgx-h100-like.xml first.
absl::StatusOr<FixtureNode> LayOutNode(const std::string& dir, const std::string& xml);

// The nodes laid out by name (`fixture --node`, `demo --node`), the default first:
//   dgx-h100-like  the bundled node (test/data/dgx-h100-like.xml): 8 InfiniBand HCAs beside
//                  GPUs and a RoCE bond
//   dgx-roles      test/data/dgx-roles.xml (4 compute InfiniBand HCAs, each on a switch with 2
//                  GPUs; 2 dual-port Ethernet storage NICs, 2 functions each) and 2 SR-IOV VFs
//                  (15b3:101e) of its first compute HCA bound on the host: mlx5_8 at
//                  0000:15:00.1 with netdev ibp21s0f1, mlx5_9 at 0000:15:00.2 with none. 10 HCAs.
std::vector<std::string> NamedNodes();

// The named node under <dir>/node, its XML written to <dir>/<name>.xml first. InvalidArgument
// naming `name` and the known names when it is none of NamedNodes().
absl::StatusOr<FixtureNode> LayOutNamedNode(const std::string& dir, const std::string& name);
// The same with the XML written to `xml` and the trees laid out under `root`.
absl::StatusOr<FixtureNode> LayOutNamedNodeAt(const std::string& name, const std::string& xml,
                                              const std::string& root);

}  // namespace rdp::sim
