// Fuzzes what we make of the kubelet's pod-resources answer: the input is a
// v1.ListPodResourcesResponse on the wire, parsed as gRPC would, turned into our PodList and
// fed to everything that reads it (mode-switch withholding in both modes, first-seen tracking,
// the GPU context) on the bundled dgx-h100-like node; the context must then be a hint the
// allocator accepts whatever it holds.

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/allocator.h"
#include "proto/podresources.pb.h"
#include "deviceplugin/config.h"
#include "sim/bundled_node.h"
#include "deviceplugin/gpu_context.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/withholding.h"
#include "test/fuzz/fuzz_util.h"
#include "topology/discovery.h"

namespace rdp::fuzz {
namespace {

struct Node {
  topology::TopologyPtr topology;
  std::set<std::string> hcas;
  std::set<std::string> gpus;
  std::map<std::string, std::string> gpu_ids;  // "GPU-<n>" -> PCI address
};

const Node& BundledNode() {
  static const Node* const node = [] {
    const std::string xml = ProcessScratch().path() + "/node.xml";
    std::ofstream(xml) << sim::BundledNodeXml();
    topology::DiscoveryOptions options;
    options.topology_xml = xml;
    auto t = topology::Discover(options);
    FUZZ_CHECK(t.ok(), t.status().ToString());
    auto* n = new Node{*t, {}, {}, {}};
    for (const auto& h : n->topology->hcas()) n->hcas.insert(h.place.pci);
    for (const auto& g : n->topology->gpus()) {
      n->gpus.insert(g.place.pci);
      n->gpu_ids[absl::StrCat("GPU-", n->gpu_ids.size())] = g.place.pci;
    }
    return n;
  }();
  return *node;
}

void CheckWithheld(const deviceplugin::PodList& pods, const Node& node) {
  deviceplugin::Withholding ex = deviceplugin::ComputeWithheld(pods, "rdma/hca", hca::Mode::kExclusive,
                                                   *node.topology);
  // Exclusive mode withholds all HCAs or none.
  FUZZ_CHECK(ex.pcis.empty() || ex.pcis == node.hcas, "exclusive withholds a part of the node");
  FUZZ_CHECK(ex.pcis.empty() == ex.reasons.empty(), "withholding without a reason");
  deviceplugin::Withholding sh =
      deviceplugin::ComputeWithheld(pods, "rdma/hca", hca::Mode::kShared, *node.topology);
  for (const std::string& pci : sh.pcis) FUZZ_CHECK(topology::NormalizePci(pci) == pci, pci);
  FUZZ_CHECK(sh.pcis.empty() == sh.reasons.empty(), "withholding without a reason");
}

void CheckGpuContext(const deviceplugin::PodList& pods, const Node& node) {
  deviceplugin::Config config;
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  std::map<std::string, absl::Time> first_seen;
  deviceplugin::UpdateFirstSeen(pods, config.gpu_resources, now - absl::Seconds(1), &first_seen);
  std::set<std::string> keys;
  for (const auto& c : pods) keys.insert(c.key);
  for (const auto& [key, t] : first_seen) FUZZ_CHECK(keys.count(key) == 1, key);

  deviceplugin::GpuSelection sel =
      deviceplugin::GpuContextFor(pods, first_seen, now, config, config.resource_name, node.gpu_ids, *node.topology);
  FUZZ_CHECK(sel.context.free_gpus_known, "free GPUs unknown");
  for (const auto& g : sel.context.free_gpus) FUZZ_CHECK(node.gpus.count(g) == 1, g);
  FUZZ_CHECK(std::is_sorted(sel.context.container_gpus.begin(), sel.context.container_gpus.end()),
             "container GPUs unsorted");
  FUZZ_CHECK((sel.candidates == 1) == !sel.container.empty(), sel.container);

  allocator::ExclusiveAllocator alloc(node.topology);
  allocator::Request request;
  request.available.assign(node.hcas.begin(), node.hcas.end());
  request.size = 2;
  request.gpus = sel.context;
  auto answer = alloc.Prefer(request);
  FUZZ_CHECK(answer.ok(), answer.status().ToString());
  FUZZ_CHECK(answer->size() == 2, "answer size");
}

}  // namespace
}  // namespace rdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  using namespace rdp;
  const fuzz::Node& node = fuzz::BundledNode();
  v1::ListPodResourcesResponse response;
  if (!response.ParseFromArray(data, static_cast<int>(size))) return 0;
  const deviceplugin::PodList pods = deviceplugin::ToPodList(response);
  size_t containers = 0;
  for (const auto& pod : response.pod_resources()) containers += pod.containers_size();
  FUZZ_CHECK(pods.size() == containers, "containers lost");
  fuzz::CheckWithheld(pods, node);
  fuzz::CheckGpuContext(pods, node);
  return 0;
}
