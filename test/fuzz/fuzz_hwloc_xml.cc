// Fuzzes our hwloc-XML loading path: the input is written as the --topology-xml file and
// discovered (hwloc's XML import, then our walk of its tree: NUMA nodes, PCIe roots, bridges and
// switches, GPUs by class and vendor, HCAs from OpenFabrics OS devices). A snapshot that loads
// must be self-consistent, and the allocator must build on it and answer a request over every
// HCA.

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "allocator/allocator.h"
#include "test/fuzz/fuzz_util.h"
#include "topology/discovery.h"

namespace rdp::fuzz {
namespace {

void CheckPlacement(const topology::PciPlacement& p, const topology::Topology& t) {
  FUZZ_CHECK(topology::NormalizePci(p.pci) == p.pci, p.pci);
  if (p.numa) {
    const auto& nodes = t.numa_nodes();
    FUZZ_CHECK(std::binary_search(nodes.begin(), nodes.end(), *p.numa),
               p.pci + " on a NUMA node the snapshot does not list");
  }
}

void Check(const topology::TopologyPtr& t) {
  std::set<std::string> pcis;
  for (size_t i = 0; i < t->hcas().size(); ++i) {
    const topology::Hca& h = t->hcas()[i];
    CheckPlacement(h.place, *t);
    FUZZ_CHECK(pcis.insert(h.place.pci).second, "two HCAs at " + h.place.pci);
    FUZZ_CHECK(t->HcaIndex(h.place.pci) == static_cast<int>(i), h.place.pci);
  }
  std::set<std::string> gpus;
  for (const topology::Gpu& g : t->gpus()) {
    CheckPlacement(g.place, *t);
    FUZZ_CHECK(gpus.insert(g.place.pci).second, "two GPUs at " + g.place.pci);
  }
  if (t->hcas().empty()) return;
  allocator::ExclusiveAllocator alloc(t);
  allocator::Request request;
  for (const auto& h : t->hcas()) request.available.push_back(h.place.pci);
  request.size = static_cast<int>((request.available.size() + 1) / 2);
  for (const auto& g : t->gpus()) request.gpus.container_gpus.push_back(g.place.pci);
  absl::StatusOr<std::vector<std::string>> answer = alloc.Prefer(request);
  FUZZ_CHECK(answer.ok(), answer.status().ToString());
  FUZZ_CHECK(answer->size() == static_cast<size_t>(request.size), "answer size");
  FUZZ_CHECK(alloc.Evaluate(request, *answer).ok(), "answer does not evaluate");
}

}  // namespace
}  // namespace rdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  using namespace rdp;
  fuzz::Scratch* const scratch = &fuzz::ProcessScratch();
  const std::string path = scratch->path() + "/topology.xml";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  topology::DiscoveryOptions options;
  options.topology_xml = path;
  absl::StatusOr<topology::TopologyPtr> t = topology::Discover(options);
  if (t.ok()) fuzz::Check(*t);
  return 0;
}
