#include "sim/demo.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sim/child.h"
#include "sim/fake_pod_resources.h"
#include "sim/fixture_node.h"
#include "sim/http_get.h"
#include "sim/kubelet_sim.h"

namespace rdp::sim {
namespace {

namespace fs = std::filesystem;
// Every wait for the plugin: its registration, its first list, an RPC, its exit after SIGTERM.
constexpr absl::Duration kWait = absl::Seconds(10);

// The plugin as a child process: its stderr copied to ours as it comes; stopped with SIGTERM and
// reaped on every path (Stop, or the destructor).
class Plugin {
 public:
  Plugin(const std::string& binary, const std::vector<std::string>& args)
      : child_(binary, args, {{}, Child::Output::kCaptureAndForward}) {}
  ~Plugin() { (void)Stop(); }
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const Child& child() const { return child_; }
  // SIGTERM, then the exit within kWait (SIGKILL after it). OK when it exited 0.
  absl::Status Stop() {
    if (!child_.running()) return stopped_;
    child_.Signal(SIGTERM);
    const int code = child_.Wait(kWait);
    if (code != 0) {
      stopped_ = absl::InternalError(
          code < 0 ? absl::StrCat(child_.binary(), " did not exit within ", absl::FormatDuration(kWait),
                                  " of SIGTERM, or died of a signal")
                   : absl::StrCat(child_.binary(), " exited ", code, " on SIGTERM"));
    }
    return stopped_;
  }
  // What went wrong with a plugin that stopped answering: it exited, or it is still running.
  std::string Why() const {
    return child_.Exited() ? " (the plugin exited; its log is above)" : "";
  }

 private:
  Child child_;
  absl::Status stopped_;
};

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
  if (!status.ok()) {
    return absl::InternalError("GetPreferredAllocation: " + status.error_message());
  }
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
  if (!status.ok()) return absl::InternalError("Allocate: " + status.error_message());
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

std::vector<std::string> HealthyIds(const KubeletSim::Devices& devices) {
  std::vector<std::string> ids;
  for (const auto& d : devices) {
    if (d.health() == "Healthy") ids.push_back(d.id());
  }
  return ids;
}

// `ids` without those of `taken`.
std::vector<std::string> Without(std::vector<std::string> ids,
                                 const std::vector<std::vector<std::string>>& taken) {
  for (const auto& t : taken) {
    ids.erase(std::remove_if(ids.begin(), ids.end(),
                             [&t](const std::string& id) {
                               return std::find(t.begin(), t.end(), id) != t.end();
                             }),
              ids.end());
  }
  return ids;
}

// The plugin's --log-level: the user's, but at most info when the demo reads its metrics line.
std::string PluginLogLevel(const DemoOptions& options) {
  const std::string& level = options.log_level;
  const bool shows_info = level == "trace" || level == "debug" || level == "info";
  return options.metrics && !shows_info ? "info" : level;
}

// Exclusive mode's requests, after the plugin registered and listed `available`: two pods
// without GPUs context, one with must_include, one whose container holds GPUs; with --metrics, a
// scrape once pod-resources shows the containers holding their HCAs.
absl::Status RunExclusive(v1beta1::DevicePlugin::Stub& stub, const std::vector<std::string>& available,
                          const topology::Topology& node, FakePodResources& pods,
                          const std::string& metrics_address, std::ostream& out) {
  // A pod without GPUs asking for two HCAs.
  auto two = Prefer(stub, available, {}, 2, out);
  if (!two.ok()) return two.status();
  if (absl::Status s = Allocate(stub, *two, out); !s.ok()) return s;
  // The kubelet insists on one HCA (must_include) and asks for one more.
  auto pinned = Prefer(stub, available, {available.back()}, 2, out);
  if (!pinned.ok()) return pinned.status();
  // A pod whose container already holds the GPUs under the last PCIe root, as pod-resources
  // shows it: its HCAs should sit next to those GPUs.
  const auto& gpus = node.gpus();
  if (gpus.size() < 2) return absl::OkStatus();
  const std::string a = gpus[gpus.size() - 2].place.pci, b = gpus.back().place.pci;
  pods.Set({{"default/train-0/main", {{"nvidia.com/gpu", {a, b}}}}});
  out << "pod-resources: container default/train-0/main holds nvidia.com/gpu " << a << "," << b
      << "\n";
  auto aligned = Prefer(stub, available, {}, 2, out);
  if (!aligned.ok()) return aligned.status();
  if (absl::Status s = Allocate(stub, *aligned, out); !s.ok()) return s;
  if (metrics_address.empty()) return absl::OkStatus();

  // The containers as the kubelet's pod-resources shows them once they run. The plugin reads
  // pod-resources again before it answers the next pod's GetPreferredAllocation (within its
  // admission wait), so the scrape after that answer shows them.
  pods.Set({{"default/infer-0/main", {{"rdma/hca", *two}}},
            {"default/train-0/main", {{"nvidia.com/gpu", {a, b}}, {"rdma/hca", *aligned}}}});
  out << "pod-resources: containers default/infer-0/main and default/train-0/main run with "
         "their HCAs\n";
  std::vector<std::string> free = Without(available, {*two, *aligned});
  if (free.empty()) free = available;
  if (auto next = Prefer(stub, free, {}, 1, out); !next.ok()) return next.status();
  const std::string url = "http://" + metrics_address + "/metrics";
  HttpResponse scrape = HttpGet(url, kWait);
  if (scrape.code != 200) {
    return absl::UnavailableError(absl::StrCat("GET ", url, " answered ", scrape.code));
  }
  out << "\nGET /metrics\n" << scrape.body;
  return absl::OkStatus();
}

// The resources file the demo serves on the node with roles (dgx-roles): its compute rails and
// its storage NICs, each a resource of its own (docs/config.md).
constexpr char kRolesNode[] = "dgx-roles";
constexpr char kRolesConfig[] = R"(resources:
  - name: rdma/hca          # the compute rails
    selector:
      linkLayers: [InfiniBand]
  - name: rdma/storage      # the storage NICs
    selector:
      linkLayers: [Ethernet]
)";

// What the plugin serves: the resources file (empty: none, the one resource rdma/hca) and the
// resources it names, in its order.
struct Served {
  std::string config;
  std::vector<std::string> resources = {"rdma/hca"};
};

// One resource after the plugin registered it: its first list with a Healthy device, then what
// a kubelet asks of it. The first resource of an exclusive plugin gets RunExclusive's pods
// (and the scrape); the others, and every shared one, one device allocated.
absl::Status RunResource(const std::string& mode, const std::string& resource, bool first,
                         KubeletSim& kubelet, const Plugin& plugin, const FixtureNode& node,
                         FakePodResources& pods, const std::string& metrics_address,
                         std::ostream& out) {
  // Until its first pod-resources List answers, the plugin lists every HCA withheld.
  auto devices = kubelet.WaitForDevicesOf(
      resource, [](const KubeletSim::Devices& d) { return !HealthyIds(d).empty(); }, kWait);
  if (!devices) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no ListAndWatch list of ", resource, " with a Healthy device arrived", plugin.Why()));
  }
  PrintDevices(*devices, out);
  const std::vector<std::string> available = HealthyIds(*devices);
  auto stub = kubelet.PluginStubOf(resource);
  if (mode == "exclusive" && first) {
    return RunExclusive(*stub, available, *node.topology, pods, metrics_address, out);
  }
  auto ids = Prefer(*stub, available, {}, 1, out);
  if (!ids.ok()) return ids.status();
  return Allocate(*stub, *ids, out);
}

// One mode: the kubelet's side in <dir>/<mode>, the plugin serving `node` to it.
absl::Status RunMode(const std::string& mode, const std::string& dir, const FixtureNode& node,
                     const Served& served, const DemoOptions& options, std::ostream& out) {
  out << "\n== " << mode << " mode ==\n";
  const std::string here = (fs::path(dir) / mode).string();
  KubeletSim kubelet(here + "/device-plugins");
  if (absl::Status s = kubelet.Start(); !s.ok()) return s;
  FakePodResources pods(here + "/pod-resources.sock");
  if (absl::Status s = pods.Start(); !s.ok()) return s;
  const bool scrape = options.metrics && mode == "exclusive";
  std::vector<std::string> args = {
      "serve", "--mode", mode, "--kubelet-dir", kubelet.dir(),
      "--pod-resources-socket", here + "/pod-resources.sock", "--topology-xml", node.xml,
      "--sysfs-root", node.root, "--dev-root", node.root, "--proc-root", node.root,
      "--health-interval", "200ms", "--log-level", PluginLogLevel(options)};
  if (!served.config.empty()) args.insert(args.end(), {"--config", served.config});
  if (scrape) args.insert(args.end(), {"--metrics-address", "127.0.0.1:0"});
  Plugin plugin(options.plugin_binary, args);

  for (const std::string& resource : served.resources) {
    auto reg = kubelet.WaitForRegistrationOf(resource, kWait);
    if (!reg) {
      return absl::DeadlineExceededError(
          absl::StrCat("the plugin did not register ", resource, plugin.Why()));
    }
    out << "kubelet: Register(version=" << reg->version << ", endpoint=" << reg->endpoint
        << ", resource=" << reg->resource_name << ", get_preferred_allocation_available="
        << (reg->get_preferred_allocation_available ? "true" : "false") << ")\n";
  }
  std::string metrics_address;
  if (scrape) {
    metrics_address = WaitForMetricsAddress(plugin.child(), kWait);
    if (metrics_address.empty()) {
      return absl::DeadlineExceededError("the plugin logged no \"metrics: serving on\" line" +
                                         plugin.Why());
    }
  }
  for (std::size_t i = 0; i < served.resources.size(); ++i) {
    const std::string& resource = served.resources[i];
    if (served.resources.size() > 1) out << "-- " << resource << " --\n";
    absl::Status s = RunResource(mode, resource, i == 0, kubelet, plugin, node, pods,
                                 metrics_address, out);
    if (!s.ok()) return s;
  }
  return plugin.Stop();
}

// On the node with roles: its resources file written to <dir>/resources.yaml, and printed.
absl::StatusOr<Served> ServedOn(const std::string& node_name, const std::string& dir,
                                std::ostream& out) {
  Served served;
  if (node_name != kRolesNode) return served;
  served.config = (fs::path(dir) / "resources.yaml").string();
  std::ofstream file(served.config);
  file << kRolesConfig;
  if (!file.flush()) return absl::InternalError("cannot write " + served.config);
  served.resources = {"rdma/hca", "rdma/storage"};
  out << "resources: " << absl::StrJoin(served.resources, ", ") << " from " << served.config
      << ":\n" << kRolesConfig;
  return served;
}

}  // namespace

int RunDemo(const DemoOptions& options, std::ostream& out) {
  if (::access(options.plugin_binary.c_str(), X_OK) != 0) {
    out << "demo: no rdma-device-plugin binary at '" << options.plugin_binary
        << "' (build it with scripts/build.sh, or give --plugin-binary)\n";
    return 1;
  }
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
  out << "rdma-device-plugin demo in " << dir << ": " << options.plugin_binary
      << " serving a fixture node to this process, which plays the kubelet\n";
  absl::Status status;
  const std::string name = options.node.empty() ? NamedNodes().front() : options.node;
  absl::StatusOr<FixtureNode> node = options.topology_xml.empty()
                                         ? LayOutNamedNode(dir, name)
                                         : LayOutNode(dir, options.topology_xml);
  if (node.ok()) {
    out << "node fixture: "
        << (options.topology_xml.empty() ? "bundled " + name : options.topology_xml)
        << ", " << node->topology->hcas().size() << " HCAs, " << node->topology->gpus().size()
        << " GPUs, fake sysfs and /dev under " << node->root << "\n";
    absl::StatusOr<Served> served =
        ServedOn(options.topology_xml.empty() ? name : "", dir, out);
    status = served.status();
    for (const char* mode : {"exclusive", "shared"}) {
      if (status.ok()) status = RunMode(mode, dir, *node, *served, options, out);
    }
  } else {
    status = node.status();
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
