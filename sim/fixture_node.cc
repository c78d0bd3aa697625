#include "sim/fixture_node.h"

#include <fstream>

#include "sim/bundled_node.h"
#include "sim/sysfs_fixture.h"
#include "topology/discovery.h"

namespace rdp::sim {

absl::StatusOr<topology::TopologyPtr> LayOutXml(const std::string& xml, const std::string& root) {
  topology::DiscoveryOptions from_xml;
  from_xml.topology_xml = xml;
  absl::StatusOr<topology::TopologyPtr> node = topology::Discover(from_xml);
  if (!node.ok()) return node.status();
  SysfsFixture fixture(root);
  if (absl::Status s = fixture.AddTopology(**node); !s.ok()) return s;
  return node;
}

absl::StatusOr<FixtureNode> LayOutNode(const std::string& dir, const std::string& xml) {
  FixtureNode node{xml, dir + "/node", nullptr};
  if (node.xml.empty()) {
    node.xml = dir + "/dgx-h100-like.xml";
    std::ofstream file(node.xml);
    file << BundledNodeXml();
    if (!file.flush()) return absl::InternalError("cannot write " + node.xml);
  }
  absl::StatusOr<topology::TopologyPtr> topology = LayOutXml(node.xml, node.root);
  if (!topology.ok()) return topology.status();
  node.topology = *topology;
  return node;
}

}  // namespace rdp::sim
