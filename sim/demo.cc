#include "sim/demo.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sim/fake_pod_resources.h"
#include "sim/kubelet_sim.h"
#include "metrics/metrics.h"
#include "deviceplugin/plugin_server.h"
#include "topology/discovery.h"
#include "sim/sysfs_fixture.h"

namespace rdp::sim {
namespace {

using deviceplugin::Config;
using hca::Mode;
using hca::ModeName;

namespace fs = std::filesystem;
constexpr absl::Duration kWait = absl::Seconds(10);

// Lays the node out under <dir>/node and returns the XML path used.
absl::StatusOr<std::string> LayOutNode(const DemoOptions& options, const std::string& dir,
                                       std::ostream& out) {
  std::string xml = options.topology_xml;
  if (xml.empty()) {
    xml = (fs::path(dir) / "dgx-h100-like.xml").string();
    std::ofstream(xml) << BundledNodeXml();
  }
  topology::DiscoveryOptions from_xml;
  from_xml.topology_xml = xml;
  absl::StatusOr<topology::TopologyPtr> node = topology::Discover(from_xml);
  if (!node.ok()) return node.status();
  SysfsFixture fixture((fs::path(dir) / "node").string());
  if (absl::Status s = fixture.AddTopology(**node); !s.ok()) return s;
  out << "node fixture: " << (options.topology_xml.empty() ? "bundled dgx-h100-like" : xml)
      << ", " << (*node)->hcas().size() << " HCAs, " << (*node)->gpus().size()
      << " GPUs, fake sysfs and /dev under " << fixture.sysfs_root() << "\n";
  return xml;
}

void PrintDevices(const KubeletSim::Devices& devices, std::ostream& out) {
  out << "kubelet: ListAndWatch -> " << devices.size() << " devices\n";
  const size_t shown = std::min<size_t>(devices.size(), 10);
  for (size_t i = 0; i < shown; ++i) {
    const auto& d = devices[i];
    out << "  " << d.id() << "  " << d.health();
    if (d.topology().nodes_size() > 0) out << "  NUMA " << d.topology().nodes(0).id();
    out << "\n";
  }
  if (shown < devices.size()) out << "  ... (" << devices.size() - shown << " more)\n";
}

absl::StatusOr<std::vector<std::string>> Prefer(v1beta1::DevicePlugin::Stub& stub,
                                                const std::vector<std::string>& available,
                                                const std::vector<std::string>& must, int size,
                                                std::ostream& out) {
  v1beta1::PreferredAllocationRequest request = PreferredRequest(available, must, size);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1beta1::PreferredAllocationResponse response;
  grpc::Status status = stub.GetPreferredAllocation(&context, request, &response);
  if (!status.ok()) return absl::InternalError(status.error_message());
  std::vector<std::string> ids(response.container_responses(0).deviceids().begin(),
                               response.container_responses(0).deviceids().end());
  out << "kubelet: GetPreferredAllocation(size=" << size << ", available=" << available.size()
      << (must.empty() ? "" : ", must_include=" + absl::StrJoin(must, ",")) << ") -> "
      << absl::StrJoin(ids, ",") << "\n";
  return ids;
}

absl::Status Allocate(v1beta1::DevicePlugin::Stub& stub, const std::vector<std::string>& ids,
                      std::ostream& out) {
  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : ids) c->add_devices_ids(id);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1beta1::AllocateResponse response;
  grpc::Status status = stub.Allocate(&context, request, &response);
  if (!status.ok()) return absl::InternalError(status.error_message());
  out << "kubelet: Allocate(" << absl::StrJoin(ids, ",") << ")\n";
  const auto& r = response.container_responses(0);
  for (const auto& d : r.devices()) {
    out << "  device " << d.host_path() << " -> " << d.container_path() << " (" << d.permissions()
        << ")\n";
  }
  std::map<std::string, std::string> envs(r.envs().begin(), r.envs().end());
  for (const auto& [k, v] : envs) out << "  env " << k << "=" << v << "\n";
  return absl::OkStatus();
}

std::vector<std::string> Ids(const KubeletSim::Devices& devices) {
  std::vector<std::string> ids;
  for (const auto& d : devices) {
    if (d.health() == "Healthy") ids.push_back(d.id());
  }
  return ids;
}

// One mode: plugin + kubelet simulator in <dir>/<mode>.
absl::Status RunMode(hca::Mode mode, const std::string& dir, const std::string& xml, bool metrics,
                     std::ostream& out) {
  out << "\n== " << hca::ModeName(mode) << " mode ==\n";
  Config config;
  config.mode = mode;
  config.kubelet_dir = (fs::path(dir) / hca::ModeName(mode) / "device-plugins").string();
  config.pod_resources_socket = (fs::path(dir) / hca::ModeName(mode) / "pod-resources.sock").string();
  config.discovery.sysfs_root = (fs::path(dir) / "node").string();
  config.discovery.dev_root = config.discovery.sysfs_root;
  config.discovery.topology_xml = xml;
  config.health_interval = absl::Milliseconds(200);

  KubeletSim kubelet(config.kubelet_dir);
  if (absl::Status s = kubelet.Start(); !s.ok()) return s;
  FakePodResources pods(config.pod_resources_socket);
  if (absl::Status s = pods.Start(); !s.ok()) return s;
  deviceplugin::PluginServer plugin(config, deviceplugin::DefaultSources(config));
  if (absl::Status s = plugin.Start(); !s.ok()) return s;

  auto reg = kubelet.WaitForRegistration(0, kWait);
  if (!reg) return absl::DeadlineExceededError("the plugin did not register");
  out << "kubelet: Register(version=" << reg->version << ", endpoint=" << reg->endpoint
      << ", resource=" << reg->resource_name << ", get_preferred_allocation_available="
      << (reg->get_preferred_allocation_available ? "true" : "false") << ")\n";
  auto devices = kubelet.WaitForDevices([](const auto& d) { return !d.empty(); }, kWait);
  if (!devices) return absl::DeadlineExceededError("no ListAndWatch list arrived");
  PrintDevices(*devices, out);

  auto stub = kubelet.PluginStub();
  const std::vector<std::string> available = Ids(*devices);
  if (mode == hca::Mode::kShared) {
    auto ids = Prefer(*stub, available, {}, 1, out);
    if (!ids.ok()) return ids.status();
    return Allocate(*stub, *ids, out);
  }
  // A pod without GPUs asking for two HCAs.
  auto two = Prefer(*stub, available, {}, 2, out);
  if (!two.ok()) return two.status();
  if (absl::Status s = Allocate(*stub, *two, out); !s.ok()) return s;
  // The kubelet insists on one HCA (must_include) and asks for one more.
  auto pinned = Prefer(*stub, available, {available.back()}, 2, out);
  if (!pinned.ok()) return pinned.status();
  // A pod whose container already holds the GPUs under the last PCIe root, as pod-resources
  // shows it: its HCAs should sit next to those GPUs.
  const auto gpus = plugin.node().topology()->gpus();
  if (gpus.size() >= 2) {
    const std::string a = gpus[gpus.size() - 2].place.pci, b = gpus.back().place.pci;
    pods.Set({{"default/train-0/main", {{"nvidia.com/gpu", {a, b}}}}});
    out << "pod-resources: container default/train-0/main holds nvidia.com/gpu " << a << "," << b
        << "\n";
    auto aligned = Prefer(*stub, available, {}, 2, out);
    if (!aligned.ok()) return aligned.status();
    if (absl::Status s = Allocate(*stub, *aligned, out); !s.ok()) return s;
    if (metrics) {
      // The containers as the kubelet's pod-resources shows them once they run.
      pods.Set({{"default/infer-0/main", {{"rdma/hca", *two}}},
                {"default/train-0/main", {{"nvidia.com/gpu", {a, b}}, {"rdma/hca", *aligned}}}});
      if (!plugin.node().RefreshPodsAndWait()) {
        return absl::UnavailableError("pod-resources did not answer");
      }
      metrics::Exposition scrape;
      plugin.node().WriteMetrics(scrape);
      out << "\nGET /metrics\n" << scrape.text();
    }
  }
  plugin.Stop();
  return absl::OkStatus();
}

}  // namespace

int RunDemo(const DemoOptions& options, std::ostream& out) {
  std::string dir = options.work_dir;
  const bool temp = dir.empty();
  if (temp) {
    std::string tmpl = (fs::temp_directory_path() / "rdp-demo-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      out << "demo: cannot create a temporary directory\n";
      return 1;
    }
    dir = tmpl;
  }
  out << "rdma-device-plugin demo in " << dir << "\n";
  absl::Status status;
  absl::StatusOr<std::string> xml = LayOutNode(options, dir, out);
  if (!xml.ok()) status = xml.status();
  for (Mode mode : {hca::Mode::kExclusive, hca::Mode::kShared}) {
    if (status.ok()) status = RunMode(mode, dir, *xml, options.metrics, out);
  }
  std::error_code ec;
  if (temp) fs::remove_all(dir, ec);
  if (!status.ok()) {
    out << "demo failed: " << status.ToString() << "\n";
    return 1;
  }
  out << "\ndemo finished: registered, listed and allocated in both modes\n";
  return 0;
}

}  // namespace rdp::sim
