// Fuzzes the handling of every DevicePlugin request the kubelet can send, through the handlers
// the gRPC service calls (deviceplugin::HandleAllocate, HandlePreferredAllocation) on plugins in both
// modes serving the bundled dgx-h100-like node: raw request messages off the wire, and
// structured requests whose IDs, sizes, must-include sets and container counts come from the
// input (valid IDs, other spellings of them, IDs of the other mode, GPU addresses, junk, and
// requests of thousands of IDs), with a pod-resources answer, a clock and a vanished device node
// that also come from the input. Any answer must be a valid one (an Allocate answer: one device
// spec per present device node of exactly the HCAs asked for, none twice) or an error that is
// not INTERNAL (an exception escaped or a bug was caught).

#include <fuzzer/FuzzedDataProvider.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "sim/bundled_node.h"
#include "hca/hca.h"
#include "deviceplugin/node_state.h"
#include "deviceplugin/service.h"
#include "test/fuzz/fuzz_util.h"
#include "topology/discovery.h"
#include "sim/sysfs_fixture.h"

namespace rdp::fuzz {
namespace {

// Answers List with whatever the current input set, at once.
class InputPods : public deviceplugin::PodResourcesSource {
 public:
  void List(absl::Duration, Done done) override { done(pods); }
  absl::StatusOr<deviceplugin::PodList> pods = deviceplugin::PodList{};
};

struct Rig {
  Scratch scratch;
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  InputPods* pods[2] = {nullptr, nullptr};  // owned by the plugins
  std::unique_ptr<deviceplugin::NodeState> plugins[2];  // shared, exclusive
  std::vector<std::string> hcas, gpus, uuids;
  topology::TopologyPtr node;
  std::string dev_root;
};

Rig& TheRig() {
  static Rig* const rig = [] {
    QuietLogs();
    auto* r = new Rig();
    const std::string xml = r->scratch.path() + "/node.xml";
    std::ofstream(xml) << sim::BundledNodeXml();
    topology::DiscoveryOptions from_xml;
    from_xml.topology_xml = xml;
    auto node = topology::Discover(from_xml);
    FUZZ_CHECK(node.ok(), node.status().ToString());
    const std::string root = r->scratch.path() + "/node";
    sim::SysfsFixture fixture(root);
    FUZZ_CHECK(fixture.AddTopology(**node).ok(), "fixture");
    for (const auto& h : (*node)->hcas()) r->hcas.push_back(h.place.pci);
    r->dev_root = root;
    for (const auto& g : (*node)->gpus()) {
      r->gpus.push_back(g.place.pci);
      r->uuids.push_back(absl::StrCat("GPU-", r->uuids.size()));
      const std::string dir = root + "/proc/driver/nvidia/gpus/" + g.place.pci;
      std::filesystem::create_directories(dir);
      std::ofstream(dir + "/information") << "GPU UUID: " << r->uuids.back() << "\n";
    }
    for (int m = 0; m < 2; ++m) {
      deviceplugin::Config config;
      config.mode = m == 0 ? hca::Mode::kShared : hca::Mode::kExclusive;
      config.pod_resources_socket = "";
      config.discovery.topology_xml = xml;
      config.discovery.sysfs_root = root;
      config.discovery.dev_root = root;
      config.proc_root = root;
      deviceplugin::NodeSources sources = deviceplugin::DefaultSources(config);
      auto pods = std::make_unique<InputPods>();
      r->pods[m] = pods.get();
      sources.pod_resources = std::move(pods);
      sources.now = [r] { return r->now; };
      r->plugins[m] = std::make_unique<deviceplugin::NodeState>(config, std::move(sources));
      FUZZ_CHECK(r->plugins[m]->Init().ok(), "plugin init");
      FUZZ_CHECK(r->plugins[m]->RefreshPodsAndWait(), "first pod list");
    }
    r->node = r->plugins[1]->topology();  // sysfs + XML: uverbs, umad and issm names
    for (const auto& h : r->node->hcas()) FUZZ_CHECK(!h.uverbs.empty(), h.name);
    return r;
  }();
  return *rig;
}

// Another spelling of a PCI address: upper case, or without the domain.
std::string Respelled(FuzzedDataProvider& fdp, const std::string& pci) {
  std::string out = fdp.ConsumeBool() ? pci.substr(5) : pci;
  if (fdp.ConsumeBool()) {
    for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string SomeId(FuzzedDataProvider& fdp, const Rig& rig, bool exclusive) {
  switch (fdp.ConsumeIntegralInRange(0, 10)) {
    case 0:
      return fdp.ConsumeRandomLengthString(24);
    case 10:  // one HCA in another spelling
      return Respelled(fdp, rig.hcas[fdp.ConsumeIntegralInRange<size_t>(0, rig.hcas.size() - 1)]);
    case 1:
      return rig.gpus[fdp.ConsumeIntegralInRange<size_t>(0, rig.gpus.size() - 1)];
    case 2:  // the other mode's IDs
      return exclusive ? deviceplugin::SharedId(fdp.ConsumeIntegralInRange(0, 999))
                       : rig.hcas[fdp.ConsumeIntegralInRange<size_t>(0, rig.hcas.size() - 1)];
    case 3:
      return absl::StrCat("shared-", fdp.ConsumeIntegral<int>());
    default:
      return exclusive ? rig.hcas[fdp.ConsumeIntegralInRange<size_t>(0, rig.hcas.size() - 1)]
                       : deviceplugin::SharedId(fdp.ConsumeIntegralInRange(0, 999));
  }
}

std::vector<std::string> SomeIds(FuzzedDataProvider& fdp, const Rig& rig, bool exclusive) {
  std::vector<std::string> ids;
  if (fdp.ConsumeIntegralInRange(0, 15) == 0) {  // huge: every ID of the mode and more
    const int n = fdp.ConsumeIntegralInRange(1, 5000);
    for (int i = 0; i < n; ++i) {
      ids.push_back(exclusive ? rig.hcas[i % rig.hcas.size()] : deviceplugin::SharedId(i));
    }
    return ids;
  }
  for (int n = fdp.ConsumeIntegralInRange(0, 12); n > 0; --n) {
    ids.push_back(SomeId(fdp, rig, exclusive));
  }
  return ids;
}

int SomeSize(FuzzedDataProvider& fdp, size_t available) {
  if (fdp.ConsumeIntegralInRange(0, 7) == 0) return fdp.ConsumeIntegral<int>();
  return fdp.ConsumeIntegralInRange<int>(0, static_cast<int>(available) + 1);
}

deviceplugin::PodList SomePods(FuzzedDataProvider& fdp, const Rig& rig) {
  const char* const kResources[] = {"rdma/hca", "nvidia.com/gpu", "amd.com/gpu", "other/x"};
  deviceplugin::PodList pods;
  for (int n = fdp.ConsumeIntegralInRange(0, 4); n > 0; --n) {
    deviceplugin::ContainerDevices c;
    c.key = absl::StrCat("ns/pod-", fdp.ConsumeIntegralInRange(0, 3), "/c");
    for (int r = fdp.ConsumeIntegralInRange(0, 2); r > 0; --r) {
      const std::string resource = fdp.PickValueInArray(kResources);
      auto& ids = c.devices[resource];
      for (int i = fdp.ConsumeIntegralInRange(0, 4); i > 0; --i) {
        if (resource == "nvidia.com/gpu" && fdp.ConsumeBool()) {
          ids.push_back(rig.uuids[fdp.ConsumeIntegralInRange<size_t>(0, rig.uuids.size() - 1)]);
        } else {
          ids.push_back(SomeId(fdp, rig, fdp.ConsumeBool()));
        }
      }
    }
    pods.push_back(std::move(c));
  }
  return pods;
}

void CheckNotInternal(const grpc::Status& s, const char* rpc) {
  FUZZ_CHECK(s.error_code() != grpc::StatusCode::INTERNAL &&
                 s.error_code() != grpc::StatusCode::UNKNOWN,
             absl::StrCat(rpc, ": ", s.error_message()));
  FUZZ_CHECK(s.ok() || !s.error_message().empty(), absl::StrCat(rpc, " error without a message"));
}

void Prefer(deviceplugin::NodeState& plugin, const v1beta1::PreferredAllocationRequest& req) {
  v1beta1::PreferredAllocationResponse resp;
  grpc::Status s(grpc::StatusCode::UNKNOWN, "never finished");
  int finished = 0;
  deviceplugin::HandlePreferredAllocation(plugin.resource(), req, &resp, [&](grpc::Status got) {
    s = got;
    ++finished;
  });
  FUZZ_CHECK(finished == 1, "GetPreferredAllocation finished " + std::to_string(finished) +
                                " times (the input's pod list answers at once)");
  CheckNotInternal(s, "GetPreferredAllocation");
  if (!s.ok()) return;
  FUZZ_CHECK(resp.container_responses_size() == req.container_requests_size(), "containers");
  for (int i = 0; i < req.container_requests_size(); ++i) {
    const auto& in = req.container_requests(i);
    const auto& out = resp.container_responses(i).deviceids();
    FUZZ_CHECK(out.size() == in.allocation_size(), "answer size");
    const std::set<std::string> got(out.begin(), out.end());
    const std::set<std::string> available(in.available_deviceids().begin(),
                                          in.available_deviceids().end());
    FUZZ_CHECK(got.size() == static_cast<size_t>(out.size()), "duplicate in the answer");
    for (const auto& id : got) FUZZ_CHECK(available.count(id) == 1, "not available: " + id);
    for (const auto& id : in.must_include_deviceids()) {
      FUZZ_CHECK(got.count(id) == 1, "must_include left out: " + id);
    }
  }
}

// The device specs of an Allocate answer are exactly the present device nodes of the HCAs it
// names (RDMA_HCA_PCI), each once, then rdma_cm; in exclusive mode those HCAs are exactly the
// ones asked for, whatever their spelling.
void CheckAllocation(const Rig& rig, const v1beta1::ContainerAllocateRequest& in,
                     const v1beta1::ContainerAllocateResponse& out, bool exclusive) {
  auto pci = out.envs().find("RDMA_HCA_PCI");
  FUZZ_CHECK(pci != out.envs().end(), "no RDMA_HCA_PCI");
  const std::vector<std::string> given = absl::StrSplit(pci->second, ',');
  const std::set<std::string> given_set(given.begin(), given.end());
  FUZZ_CHECK(given_set.size() == given.size(), "an HCA twice: " + pci->second);
  if (exclusive) {
    std::set<std::string> asked;
    for (const auto& id : in.devices_ids()) {
      auto normal = topology::NormalizePci(id);
      FUZZ_CHECK(normal.has_value(), "allocated an ID that is no PCI address: " + id);
      asked.insert(*normal);
    }
    FUZZ_CHECK(asked == given_set, "allocated other HCAs than asked: " + pci->second);
  }
  std::vector<std::string> want;
  for (const std::string& p : given) {
    const int idx = rig.node->HcaIndex(p);
    FUZZ_CHECK(idx >= 0, "no such HCA: " + p);
    const topology::Hca& h = rig.node->hcas()[idx];
    std::vector<std::string> nodes = {h.uverbs};
    nodes.insert(nodes.end(), h.umad.begin(), h.umad.end());
    nodes.insert(nodes.end(), h.issm.begin(), h.issm.end());
    for (const std::string& n : nodes) {
      if (std::filesystem::exists(rig.dev_root + "/dev/infiniband/" + n)) {
        want.push_back("/dev/infiniband/" + n);
      } else {
        FUZZ_CHECK(n != h.uverbs, "allocated " + p + " whose uverbs node is missing");
      }
    }
  }
  want.push_back("/dev/infiniband/rdma_cm");
  std::vector<std::string> got;
  for (const auto& d : out.devices()) {
    FUZZ_CHECK(d.host_path() == d.container_path(), d.host_path());
    FUZZ_CHECK(d.permissions() == "rw", d.permissions());
    got.push_back(d.host_path());
  }
  FUZZ_CHECK(got == want, "device specs " + absl::StrJoin(got, ",") + " for HCAs " +
                              pci->second + ", want " + absl::StrJoin(want, ","));
}

void Allocate(const Rig& rig, deviceplugin::NodeState& plugin, const v1beta1::AllocateRequest& req,
              bool exclusive) {
  v1beta1::AllocateResponse resp;
  const grpc::Status s = deviceplugin::HandleAllocate(plugin.resource(), req, &resp);
  CheckNotInternal(s, "Allocate");
  if (!s.ok()) return;
  FUZZ_CHECK(resp.container_responses_size() == req.container_requests_size(), "containers");
  for (int i = 0; i < req.container_requests_size(); ++i) {
    CheckAllocation(rig, req.container_requests(i), resp.container_responses(i), exclusive);
  }
}

void Raw(FuzzedDataProvider& fdp, Rig& rig) {
  const int rpc = fdp.ConsumeIntegralInRange(0, 3);
  const bool exclusive = fdp.ConsumeBool();
  deviceplugin::NodeState& plugin = *rig.plugins[exclusive];
  const std::string bytes = fdp.ConsumeRemainingBytesAsString();
  if (rpc == 0 || rpc == 2) {
    v1beta1::PreferredAllocationRequest req;
    if (req.ParseFromString(bytes)) Prefer(plugin, req);
  } else if (rpc == 1) {
    v1beta1::AllocateRequest req;
    if (req.ParseFromString(bytes)) Allocate(rig, plugin, req, exclusive);
  } else {
    v1beta1::Empty req;
    v1beta1::DevicePluginOptions resp;
    if (req.ParseFromString(bytes)) {
      deviceplugin::FillOptions(&resp);
      FUZZ_CHECK(resp.get_preferred_allocation_available(), "options");
    }
  }
}

void Structured(FuzzedDataProvider& fdp, Rig& rig) {
  const bool exclusive = fdp.ConsumeBool();
  if (fdp.ConsumeIntegralInRange(0, 7) == 0) {
    rig.pods[exclusive]->pods = absl::UnavailableError("pod-resources down");
  } else {
    rig.pods[exclusive]->pods = SomePods(fdp, rig);
  }
  rig.now += absl::Milliseconds(fdp.ConsumeIntegralInRange(0, 20000));
  // Sometimes an HCA's uverbs node vanishes before the calls (a driver reload), and comes back
  // after them: no device spec may name it meanwhile.
  std::string vanished;
  if (fdp.ConsumeIntegralInRange(0, 7) == 0) {
    const auto& h = rig.node->hcas()[fdp.ConsumeIntegralInRange<size_t>(0, rig.hcas.size() - 1)];
    vanished = rig.dev_root + "/dev/infiniband/" + h.uverbs;
    std::filesystem::remove(vanished);
  }
  if (fdp.ConsumeIntegralInRange(0, 15) == 0) rig.plugins[exclusive]->Poll();
  deviceplugin::NodeState& plugin = *rig.plugins[exclusive];
  for (int calls = fdp.ConsumeIntegralInRange(1, 4); calls > 0 && fdp.remaining_bytes() > 0;
       --calls) {
    const int containers = fdp.ConsumeIntegralInRange(0, 3);
    if (fdp.ConsumeBool()) {
      v1beta1::PreferredAllocationRequest req;
      for (int c = 0; c < containers; ++c) {
        auto* r = req.add_container_requests();
        const std::vector<std::string> available = SomeIds(fdp, rig, exclusive);
        for (const auto& id : available) r->add_available_deviceids(id);
        for (int m = fdp.ConsumeIntegralInRange(0, 3); m > 0; --m) {
          r->add_must_include_deviceids(
              !available.empty() && fdp.ConsumeBool()
                  ? available[fdp.ConsumeIntegralInRange<size_t>(0, available.size() - 1)]
                  : SomeId(fdp, rig, exclusive));
        }
        r->set_allocation_size(SomeSize(fdp, available.size()));
      }
      Prefer(plugin, req);
    } else {
      v1beta1::AllocateRequest req;
      for (int c = 0; c < containers; ++c) {
        auto* r = req.add_container_requests();
        for (const auto& id : SomeIds(fdp, rig, exclusive)) r->add_devices_ids(id);
      }
      Allocate(rig, plugin, req, exclusive);
    }
  }
  if (!vanished.empty()) {
    std::ofstream(vanished).put('\n');
    if (fdp.ConsumeBool()) rig.plugins[exclusive]->Poll();
  }
}

}  // namespace
}  // namespace rdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  rdp::fuzz::Rig& rig = rdp::fuzz::TheRig();
  FuzzedDataProvider fdp(data, size);
  if (fdp.ConsumeIntegralInRange(0, 3) == 0) {
    rdp::fuzz::Raw(fdp, rig);
  } else {
    rdp::fuzz::Structured(fdp, rig);
  }
  return 0;
}
