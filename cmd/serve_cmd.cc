#include "cmd/serve_cmd.h"

#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/log.h"
#include "cmd/discovery_flags.h"
#include "cmd/flag_values.h"
#include "cmd/early_warning_flags.h"
#include "cmd/metrics_flags.h"
#include "cmd/run_server.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plugin_server.h"
#include "deviceplugin/probe.h"
#include "hca/hca.h"
#include "metrics/http_server.h"
#include "metrics/metrics.h"
#include "resources/config.h"
#include "resources/resources.h"
#include "topology/topology.h"

namespace rdp::cmd {
namespace {

struct ServeFlags {
  DiscoveryFlags discovery;
  deviceplugin::Config config;
  std::string mode = "shared";
  std::string health_interval = "5s";
  std::string admission_window = "10s";
  std::string gpu_resources = "nvidia.com/gpu,amd.com/gpu";
  MetricsFlags metrics;
  EarlyWarningFlags early_warning;
  std::string config_file;  // --config: the resources file; "" for --resource-name alone
};

// What Serve() needs beside the Config.
struct Resolved {
  deviceplugin::Config config;
  metrics::HttpOptions metrics;
};

// Flags -> a validated Config.
absl::StatusOr<Resolved> Resolve(const ServeFlags& f) {
  deviceplugin::Config c = f.config;
  auto discovery = f.discovery.Options();
  if (!discovery.ok()) return discovery.status();
  c.discovery = *discovery;
  auto mode = hca::ParseMode(f.mode);
  if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--mode: ", mode.status().message()));
  c.mode = *mode;
  // The label key is what the chart tells the plugin about why the node is exclusive (it is
  // logged); the mode is --mode alone. A label with shared mode is a deployment contradiction.
  if (!c.exclusive_label.empty() && c.mode != hca::Mode::kExclusive) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exclusive-label '", c.exclusive_label, "' names the node label that chose exclusive "
        "mode, but --mode is '", f.mode, "': give --mode exclusive with it, or drop it"));
  }
  auto interval = DurationFlag("--health-interval", f.health_interval);
  if (!interval.ok()) return interval.status();
  c.health_interval = *interval;
  auto window = DurationFlag("--admission-window", f.admission_window);
  if (!window.ok()) return window.status();
  c.admission_window = *window;
  c.gpu_resources = absl::StrSplit(f.gpu_resources, ',', absl::SkipWhitespace());
  absl::StatusOr<hca::EarlyWarningConfig> early_warning = f.early_warning.Config();
  if (!early_warning.ok()) return early_warning.status();
  c.early_warning = *early_warning;
  if (c.node_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0) c.node_name = host;
  }
  if (absl::Status s = deviceplugin::Validate(c); !s.ok()) return s;
  absl::StatusOr<metrics::HttpOptions> http = f.metrics.Options();
  if (!http.ok()) return http.status();
  return Resolved{c, *http};
}

// Serves `served` (empty: the one resource of the flags, --resource-name on --socket-name),
// each its own device plugin over one node. `refuse` (null: nothing to refuse) runs once the node
// is discovered, before anything is served: the place where resources that cannot be served
// together on this node (an HCA two exclusive resources select) are refused, its error ending
// serve with kExitUsage. One resource from flags alone has nothing to refuse.
int Serve(const Resolved& resolved, std::vector<resources::Resource> served,
          const deviceplugin::PluginServer::ResourceCheck& refuse) {
  const deviceplugin::Config& config = resolved.config;
  if (absl::Status s = deviceplugin::ValidateResources(config, served); !s.ok()) {
    Logger("server")->error("{}", std::string(s.message()));
    return kExitUsage;
  }
  deviceplugin::PluginServer plugin(config, deviceplugin::DefaultSources(config),
                                    std::move(served));
  const std::shared_ptr<Env> node = NewNodeEnv(config.Roots());
  ServerRun run;
  run.node = node.get();
  run.logger = "server";
  run.prepare = [&plugin, &refuse]() -> absl::Status {
    if (!refuse) return plugin.Prepare();
    return plugin.Prepare([&refuse](const std::vector<resources::Resource>& resources,
                                    const topology::Topology& topology) {
      absl::Status s = refuse(resources, topology);
      return s.ok() ? s : Refusal(s);
    });
  };
  run.start = [&plugin] { return plugin.Start(); };
  run.wait = [&plugin](int signals) { return plugin.Wait(signals); };
  run.stop = [&plugin] { plugin.Stop(); };
  run.stopped = "stopped; removed " + absl::StrJoin(plugin.SocketPaths(), ", ");
  run.metrics = resolved.metrics;
  // NodeState::WriteMetrics reads a snapshot: the kubelet's RPCs never wait for a scrape.
  run.render_metrics = [&plugin] {
    metrics::Exposition out;
    plugin.node().WriteMetrics(out);
    return out.Take();
  };
  // `probe`, in this process: GetDevicePluginOptions on each of our sockets.
  run.checks.livez = [&plugin]() -> absl::Status {
    for (const std::string& socket : plugin.SocketPaths()) {
      if (absl::Status s = deviceplugin::Probe(socket, kProbeTimeout); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  run.checks.readyz = run.checks.livez;
  return RunServer(run);
}

// Serves the resources of the file at `path` (resources/config.h): exit 2 naming the file and
// the key when it is wrong, and, in exclusive mode, when two resources select one HCA of this
// node (each exclusive HCA is sold once).
int ServeConfig(const Resolved& resolved, const std::string& path) {
  const auto log = Logger("server");
  absl::StatusOr<resources::Config> file = resources::LoadConfig(path);
  if (!file.ok()) {
    log->error("--config: {}", std::string(file.status().message()));
    return kExitUsage;
  }
  for (const std::string& w : file->warnings) log->warn("--config: {}", w);
  if (file->update_interval) {
    log->info("--config {}: periodicUpdateInterval {} read; the HCAs are polled every {} "
              "(--health-interval) whatever it says",
              path, absl::FormatDuration(*file->update_interval),
              absl::FormatDuration(resolved.config.health_interval));
  }
  std::vector<std::string> names;
  for (const resources::Resource& r : file->resources) names.push_back(r.name);
  log->info("--config {}: {} resource(s): {}", path, names.size(), absl::StrJoin(names, ", "));
  deviceplugin::PluginServer::ResourceCheck refuse = nullptr;
  if (resolved.config.mode == hca::Mode::kExclusive) {
    refuse = [path](const std::vector<resources::Resource>& served,
                    const topology::Topology& topology) -> absl::Status {
      absl::Status s = resources::CheckExclusiveOverlap(served, topology.hcas());
      if (s.ok()) return s;
      return absl::InvalidArgumentError(absl::StrCat("--config ", path, ": ", s.message()));
    };
  }
  return Serve(resolved, std::move(file->resources), refuse);
}

}  // namespace

void AddServeCommand(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  deviceplugin::Config& c = f->config;
  CLI::App* sub = app.add_subcommand(
      "serve", "Run the device plugin (the default when no subcommand is given)");
  f->discovery.Register(sub);
  sub->add_option("--mode", f->mode, "shared (1000 units, every pod sees every HCA) or exclusive")
      ->envname("RDP_MODE")
      ->capture_default_str();
  sub->add_option("--resource-name", c.resource_name, "Extended resource to advertise")
      ->envname("RDP_RESOURCE_NAME")
      ->capture_default_str();
  sub->add_option("--shared-devices", c.shared_devices, "Units advertised in shared mode")
      ->envname("RDP_SHARED_DEVICES")
      ->capture_default_str();
  sub->add_option("--kubelet-dir", c.kubelet_dir, "The kubelet's device-plugin directory")
      ->envname("RDP_KUBELET_DIR")
      ->capture_default_str();
  sub->add_option("--socket-name", c.socket_name, "Our socket's file name in --kubelet-dir")
      ->envname("RDP_SOCKET_NAME")
      ->capture_default_str();
  // An empty value, `--pod-resources-socket=` included (as operators write it in a chart's
  // extraArgs), turns the client off.
  sub->add_option("--pod-resources-socket", c.pod_resources_socket,
                  "The kubelet's pod-resources socket (default " + c.pod_resources_socket +
                      "). Until a List on it answers, no HCA is offered (fail closed); empty "
                      "turns withholding and the GPU context off")
      ->envname("RDP_POD_RESOURCES_SOCKET")
      ->expected(0, 1)
      ->default_str("");
  sub->add_option("--proc-root", c.proc_root, "Root under which proc/driver/nvidia is read")
      ->envname("RDP_PROC_ROOT")
      ->capture_default_str();
  sub->add_option("--allocation-dir", c.allocation_dir,
                  "Host directory (the same path in this container) for the files Allocate "
                  "mounts at /etc/rdma/allocation.json; empty: no file")
      ->envname("RDP_ALLOCATION_DIR");
  sub->add_option("--nvidia-gpu-list", c.nvidia_gpu_list,
                  "A file holding `nvidia-smi -L`'s output, re-read on each health poll: maps "
                  "NVIDIA GPU indexes and MIG device UUIDs to GPUs (docs/server.md, GPU IDs); "
                  "empty: indexes in PCI address order")
      ->envname("RDP_NVIDIA_GPU_LIST");
  sub->add_option("--health-interval", f->health_interval,
                  "Health poll and hotplug rescan period")
      ->envname("RDP_HEALTH_INTERVAL")
      ->capture_default_str();
  sub->add_option("--node-name", c.node_name, "This node's name (default: the host name)")
      ->envname("NODE_NAME");
  sub->add_option("--exclusive-label", c.exclusive_label,
                  "The node label key that chose exclusive mode, for the log "
                  "(needs --mode exclusive)")
      ->envname("RDP_EXCLUSIVE_LABEL");
  sub->add_option("--gpu-resources", f->gpu_resources,
                  "Comma-separated GPU resources whose devices guide placement")
      ->envname("RDP_GPU_RESOURCES")
      ->capture_default_str();
  sub->add_option("--admission-window", f->admission_window,
                  "How recently a container must have got its GPUs to count as being admitted")
      ->envname("RDP_ADMISSION_WINDOW")
      ->capture_default_str();
  f->metrics.Register(sub);
  f->early_warning.Register(sub);
  sub->add_option("--config", f->config_file,
                  "A resources file (docs/config.md), ours (YAML or JSON) or the Mellanox shared "
                  "device plugin's config.json: each resource its own device plugin, on the "
                  "socket <--socket-name without .sock>-<resource>.sock; --resource-name and "
                  "--shared-devices are then the file's")
      ->envname("RDP_CONFIG");
  sub->callback([f] {
    absl::StatusOr<Resolved> config = Resolve(*f);
    if (!config.ok()) {
      Logger("server")->error("{}", std::string(config.status().message()));
      Exit(kExitUsage);
    }
    if (f->config_file.empty()) {
      if (int code = Serve(*config, {}, nullptr); code != 0) Exit(code);
      return;
    }
    if (int code = ServeConfig(*config, f->config_file); code != 0) Exit(code);
  });
}

}  // namespace rdp::cmd
