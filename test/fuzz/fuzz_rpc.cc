// Fuzzes the handling of every DevicePlugin request the kubelet can send, through the service
// the gRPC server calls (server::DevicePluginService) on plugins in both modes serving the
// bundled dgx-h100-like node: raw request messages off the wire, and structured requests whose
// IDs, sizes, must-include sets and container counts come from the input (valid IDs, IDs of the
// other mode, GPU addresses, junk, and requests of thousands of IDs), with a pod-resources answer
// and a clock that also come from the input. Any answer must be a valid one or an error that is
// not INTERNAL (an exception escaped or a bug was caught).

#include <fuzzer/FuzzedDataProvider.h>

#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/demo.h"
#include "server/devices.h"
#include "server/plugin.h"
#include "server/service.h"
#include "test/fuzz/fuzz_util.h"
#include "topology/discovery.h"
#include "topology/sysfs_fixture.h"

namespace rdp::fuzz {
namespace {

// Answers List with whatever the current input set.
class InputPods : public server::PodResourcesSource {
 public:
  absl::StatusOr<server::PodList> List(absl::Duration) override { return pods; }
  absl::StatusOr<server::PodList> pods = server::PodList{};
};

struct Rig {
  Scratch scratch;
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  InputPods* pods[2] = {nullptr, nullptr};  // owned by the plugins
  std::unique_ptr<server::Plugin> plugins[2];  // shared, exclusive
  std::unique_ptr<server::DevicePluginService> services[2];
  std::vector<std::string> hcas, gpus, uuids;
};

Rig& TheRig() {
  static Rig* const rig = [] {
    QuietLogs();
    auto* r = new Rig();
    const std::string xml = r->scratch.path() + "/node.xml";
    std::ofstream(xml) << server::BundledNodeXml();
    topology::DiscoveryOptions from_xml;
    from_xml.topology_xml = xml;
    auto node = topology::Discover(from_xml);
    FUZZ_CHECK(node.ok(), node.status().ToString());
    const std::string root = r->scratch.path() + "/node";
    topology::SysfsFixture fixture(root);
    FUZZ_CHECK(fixture.AddTopology(**node).ok(), "fixture");
    for (const auto& h : (*node)->hcas()) r->hcas.push_back(h.place.pci);
    for (const auto& g : (*node)->gpus()) {
      r->gpus.push_back(g.place.pci);
      r->uuids.push_back(absl::StrCat("GPU-", r->uuids.size()));
      const std::string dir = root + "/proc/driver/nvidia/gpus/" + g.place.pci;
      std::filesystem::create_directories(dir);
      std::ofstream(dir + "/information") << "GPU UUID: " << r->uuids.back() << "\n";
    }
    for (int m = 0; m < 2; ++m) {
      server::Config config;
      config.mode = m == 0 ? server::Mode::kShared : server::Mode::kExclusive;
      config.pod_resources_socket = "";
      config.discovery.topology_xml = xml;
      config.discovery.sysfs_root = root;
      config.discovery.dev_root = root;
      config.proc_root = root;
      server::PluginDeps deps = server::DefaultDeps(config);
      auto pods = std::make_unique<InputPods>();
      r->pods[m] = pods.get();
      deps.pod_resources = std::move(pods);
      deps.now = [r] { return r->now; };
      r->plugins[m] = std::make_unique<server::Plugin>(config, std::move(deps));
      FUZZ_CHECK(r->plugins[m]->Init().ok(), "plugin init");
      r->services[m] = std::make_unique<server::DevicePluginService>(r->plugins[m].get());
    }
    return r;
  }();
  return *rig;
}

std::string SomeId(FuzzedDataProvider& fdp, const Rig& rig, bool exclusive) {
  switch (fdp.ConsumeIntegralInRange(0, 9)) {
    case 0:
      return fdp.ConsumeRandomLengthString(24);
    case 1:
      return rig.gpus[fdp.ConsumeIntegralInRange<size_t>(0, rig.gpus.size() - 1)];
    case 2:  // the other mode's IDs
      return exclusive ? server::SharedId(fdp.ConsumeIntegralInRange(0, 999))
                       : rig.hcas[fdp.ConsumeIntegralInRange<size_t>(0, rig.hcas.size() - 1)];
    case 3:
      return absl::StrCat("shared-", fdp.ConsumeIntegral<int>());
    default:
      return exclusive ? rig.hcas[fdp.ConsumeIntegralInRange<size_t>(0, rig.hcas.size() - 1)]
                       : server::SharedId(fdp.ConsumeIntegralInRange(0, 999));
  }
}

std::vector<std::string> SomeIds(FuzzedDataProvider& fdp, const Rig& rig, bool exclusive) {
  std::vector<std::string> ids;
  if (fdp.ConsumeIntegralInRange(0, 15) == 0) {  // huge: every ID of the mode and more
    const int n = fdp.ConsumeIntegralInRange(1, 5000);
    for (int i = 0; i < n; ++i) {
      ids.push_back(exclusive ? rig.hcas[i % rig.hcas.size()] : server::SharedId(i));
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

server::PodList SomePods(FuzzedDataProvider& fdp, const Rig& rig) {
  const char* const kResources[] = {"rdma/hca", "nvidia.com/gpu", "amd.com/gpu", "other/x"};
  server::PodList pods;
  for (int n = fdp.ConsumeIntegralInRange(0, 4); n > 0; --n) {
    server::ContainerDevices c;
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

void Prefer(server::DevicePluginService& service, const v1beta1::PreferredAllocationRequest& req) {
  grpc::ServerContext context;
  v1beta1::PreferredAllocationResponse resp;
  const grpc::Status s = service.GetPreferredAllocation(&context, &req, &resp);
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

void Allocate(server::DevicePluginService& service, const v1beta1::AllocateRequest& req,
              bool exclusive) {
  grpc::ServerContext context;
  v1beta1::AllocateResponse resp;
  const grpc::Status s = service.Allocate(&context, &req, &resp);
  CheckNotInternal(s, "Allocate");
  if (!s.ok()) return;
  FUZZ_CHECK(resp.container_responses_size() == req.container_requests_size(), "containers");
  for (int i = 0; i < req.container_requests_size(); ++i) {
    const auto& out = resp.container_responses(i);
    FUZZ_CHECK(out.devices_size() > 0, "no device specs");
    for (const auto& d : out.devices()) {
      FUZZ_CHECK(d.host_path().rfind("/dev/infiniband/", 0) == 0, d.host_path());
    }
    auto pci = out.envs().find("RDMA_HCA_PCI");
    FUZZ_CHECK(pci != out.envs().end(), "no RDMA_HCA_PCI");
    if (exclusive) {
      const std::vector<std::string> given = absl::StrSplit(pci->second, ',');
      FUZZ_CHECK(given.size() == static_cast<size_t>(req.container_requests(i).devices_ids_size()),
                 pci->second);
    }
  }
}

void Raw(FuzzedDataProvider& fdp, Rig& rig) {
  const int rpc = fdp.ConsumeIntegralInRange(0, 3);
  const bool exclusive = fdp.ConsumeBool();
  server::DevicePluginService& service = *rig.services[exclusive];
  const std::string bytes = fdp.ConsumeRemainingBytesAsString();
  grpc::ServerContext context;
  if (rpc == 0) {
    v1beta1::PreferredAllocationRequest req;
    if (req.ParseFromString(bytes)) Prefer(service, req);
  } else if (rpc == 1) {
    v1beta1::AllocateRequest req;
    if (req.ParseFromString(bytes)) Allocate(service, req, exclusive);
  } else if (rpc == 2) {
    v1beta1::PreStartContainerRequest req;
    v1beta1::PreStartContainerResponse resp;
    if (req.ParseFromString(bytes)) {
      FUZZ_CHECK(service.PreStartContainer(&context, &req, &resp).ok(), "PreStartContainer");
    }
  } else {
    v1beta1::Empty req;
    v1beta1::DevicePluginOptions resp;
    if (req.ParseFromString(bytes)) {
      FUZZ_CHECK(service.GetDevicePluginOptions(&context, &req, &resp).ok(), "options");
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
  if (fdp.ConsumeIntegralInRange(0, 15) == 0) rig.plugins[exclusive]->Poll();
  server::DevicePluginService& service = *rig.services[exclusive];
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
      Prefer(service, req);
    } else {
      v1beta1::AllocateRequest req;
      for (int c = 0; c < containers; ++c) {
        auto* r = req.add_container_requests();
        for (const auto& id : SomeIds(fdp, rig, exclusive)) r->add_devices_ids(id);
      }
      Allocate(service, req, exclusive);
    }
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
