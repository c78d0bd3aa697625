#include "sim/fixture_node.h"

#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_join.h"
#include "sim/bundled_node.h"
#include "sim/sysfs_fixture.h"
#include "topology/discovery.h"

namespace rdp::sim {
namespace {

constexpr char kDefaultNode[] = "dgx-h100-like";
constexpr char kRolesNode[] = "dgx-roles";

absl::StatusOr<topology::TopologyPtr> DiscoverXml(const std::string& xml) {
  topology::DiscoveryOptions from_xml;
  from_xml.topology_xml = xml;
  return topology::Discover(from_xml);
}

absl::Status LayOut(const topology::Topology& node, const std::string& root) {
  SysfsFixture fixture(root);
  return fixture.AddTopology(node);
}

// `node` with the VFs of dgx-roles (NamedNodes): an export does not hold them.
absl::StatusOr<topology::TopologyPtr> WithRolesVfs(const topology::Topology& node) {
  const int pf = node.HcaIndex("0000:15:00.0");
  if (pf < 0) return absl::InternalError("dgx-roles: no compute HCA at 0000:15:00.0");
  std::vector<topology::Hca> hcas = node.hcas();
  const topology::Hca& parent = node.hcas()[pf];
  for (int i = 0; i < 2; ++i) {
    topology::Hca vf;
    vf.name = "mlx5_" + std::to_string(8 + i);
    vf.place = parent.place;
    vf.place.pci = "0000:15:00." + std::to_string(1 + i);
    vf.physfn = parent.place.pci;
    vf.vendor = "15b3";
    vf.device = "101e";
    vf.ports = parent.ports;
    if (i == 0) vf.netdevs = {"ibp21s0f1"};
    hcas.push_back(std::move(vf));
  }
  return std::make_shared<const topology::Topology>(
      topology::Topology::WithNumaNodes(node.all_numa_nodes(), std::move(hcas), node.gpus()));
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream file(path);
  file << text;
  return file.flush() ? absl::OkStatus() : absl::InternalError("cannot write " + path);
}

}  // namespace

absl::StatusOr<topology::TopologyPtr> LayOutXml(const std::string& xml, const std::string& root) {
  absl::StatusOr<topology::TopologyPtr> node = DiscoverXml(xml);
  if (!node.ok()) return node.status();
  if (absl::Status s = LayOut(**node, root); !s.ok()) return s;
  return node;
}

absl::StatusOr<FixtureNode> LayOutNode(const std::string& dir, const std::string& xml) {
  if (xml.empty()) return LayOutNamedNode(dir, kDefaultNode);
  FixtureNode node{xml, dir + "/node", nullptr};
  absl::StatusOr<topology::TopologyPtr> topology = LayOutXml(node.xml, node.root);
  if (!topology.ok()) return topology.status();
  node.topology = *topology;
  return node;
}

std::vector<std::string> NamedNodes() { return {kDefaultNode, kRolesNode}; }

absl::StatusOr<FixtureNode> LayOutNamedNode(const std::string& dir, const std::string& name) {
  return LayOutNamedNodeAt(name, dir + "/" + name + ".xml", dir + "/node");
}

absl::StatusOr<FixtureNode> LayOutNamedNodeAt(const std::string& name, const std::string& xml,
                                              const std::string& root) {
  const bool roles = name == kRolesNode;
  if (name != kDefaultNode && !roles) {
    return absl::InvalidArgumentError("no node named '" + name + "' (known: " +
                                      absl::StrJoin(NamedNodes(), ", ") + ")");
  }
  FixtureNode node{xml, root, nullptr};
  const std::string& text = roles ? BundledRolesNodeXml() : BundledNodeXml();
  if (text.empty()) return absl::NotFoundError("node " + name + " was not bundled at build time");
  if (absl::Status s = WriteFile(node.xml, text); !s.ok()) return s;
  absl::StatusOr<topology::TopologyPtr> topology = DiscoverXml(node.xml);
  if (topology.ok() && roles) topology = WithRolesVfs(**topology);
  if (!topology.ok()) return topology.status();
  if (absl::Status s = LayOut(**topology, node.root); !s.ok()) return s;
  node.topology = *topology;
  return node;
}

}  // namespace rdp::sim
