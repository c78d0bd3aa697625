#include "cmd/dra_serve_cmd.h"

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/env.h"
#include "base/log.h"
#include "cmd/discovery_flags.h"
#include "cmd/dra_cmd.h"
#include "cmd/early_warning_flags.h"
#include "cmd/flag_values.h"
#include "cmd/metrics_flags.h"
#include "cmd/run_server.h"
#include "dra/devices.h"
#include "dra/kubelet_state.h"
#include "dra/plugin.h"
#include "dra/probe.h"
#include "hca/hca.h"
#include "kube/client.h"
#include "node/node.h"
#include "topology/discovery.h"

namespace rdp::cmd {
namespace {

struct DraFlags {
  DiscoveryFlags discovery;
  std::string kubelet_dir = "/var/lib/kubelet";
  std::string kubelet_state;  // "": <kubelet_dir>/dra_manager_state
  std::string driver_name = dra::kDefaultDriverName;
  std::string node_name;
  std::string cdi_root = dra::kDefaultCdiRoot;
  std::string kubeconfig;
  std::string mode = "exclusive";
  int shared_devices = static_cast<int>(dra::kDefaultSharedUnits);
  std::string health_interval = "5s";
  std::string resync = "30s";
  MetricsFlags metrics;
  EarlyWarningFlags early_warning;
  std::string proc_root = "/";  // GPUDirect RDMA's signals (/proc/modules, /proc/driver/nvidia)
  std::string allocation_dir;   // /etc/rdma/allocation.json's host files; empty: none
  bool read_pods = true;        // the pods claims are reserved for (dra::PodReads)
  // dra prepare-local
  std::string claim_ns = "default";
  std::string claim_name = "local";
  std::string claim_uid;
  std::vector<std::string> devices;
};

std::shared_ptr<spdlog::logger> Log() { return Logger("dra"); }

struct Resolved {
  topology::DiscoveryOptions discovery;
  NodeRoots roots;  // discovery's, and --proc-root
  node::Options node;
  dra::PluginConfig plugin;
  metrics::HttpOptions metrics;
};

// The node core on these roots, logging as the DRA door.
std::unique_ptr<node::Node> MakeNode(const Resolved& r) {
  return std::make_unique<node::Node>(r.node,
                                      node::DefaultSources(r.discovery, NewNodeEnv(r.roots)));
}

absl::StatusOr<Resolved> Resolve(DraFlags& f) {
  Resolved r;
  auto discovery = f.discovery.Options();
  if (!discovery.ok()) return discovery.status();
  r.discovery = *discovery;
  r.roots = r.discovery.Roots();
  r.roots.proc = f.proc_root.empty() ? "/" : f.proc_root;
  absl::StatusOr<hca::Mode> mode = hca::ParseMode(f.mode);
  if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--mode: ", mode.status().message()));
  r.plugin.mode = *mode;
  absl::StatusOr<std::int64_t> units = SharedUnitsFlag(f.shared_devices);
  if (!units.ok()) return units.status();
  r.plugin.shared_units = *units;
  absl::StatusOr<metrics::HttpOptions> http = f.metrics.Options();
  if (!http.ok()) return http.status();
  r.metrics = *http;
  absl::StatusOr<hca::EarlyWarningConfig> early_warning = f.early_warning.Config();
  if (!early_warning.ok()) return early_warning.status();
  r.node.early_warning = *early_warning;
  r.node.logger = "dra";
  r.node.allocation_dir = f.allocation_dir;
  for (auto [flag, text, out] : {std::make_tuple("--health-interval", &f.health_interval,
                                                 &r.plugin.health_interval),
                                 std::make_tuple("--slice-resync", &f.resync, &r.plugin.resync)}) {
    absl::StatusOr<absl::Duration> d = DurationFlag(flag, *text);
    if (!d.ok()) return d.status();
    *out = *d;
  }
  // As `dra slices` and the kubelet name the node: a host name "Node-A" is the Node "node-a".
  if (f.node_name.empty()) f.node_name = HostNodeName();
  if (f.node_name.empty()) {
    return absl::InvalidArgumentError("--node-name (or NODE_NAME) is required");
  }
  if (absl::Status s = dra::ValidateDriverName(f.driver_name); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--driver-name: ", s.message()));
  }
  if (absl::Status s = dra::ValidateNodeName(f.node_name); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--node-name: ", s.message()));
  }
  if (f.kubelet_dir.empty() || f.cdi_root.empty()) {
    return absl::InvalidArgumentError("--kubelet-dir and --cdi-root must not be empty");
  }
  if (std::error_code ec;
      !f.allocation_dir.empty() && !std::filesystem::is_directory(f.allocation_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--allocation-dir '", f.allocation_dir, "': is not a directory"));
  }
  r.plugin.driver.driver_name = f.driver_name;
  r.plugin.driver.node_name = f.node_name;
  r.plugin.driver.kubelet_state =
      f.kubelet_state.empty()
          ? (std::filesystem::path(f.kubelet_dir) / dra::kKubeletDraStateFile).string()
          : f.kubelet_state;
  r.plugin.server.kubelet_dir = f.kubelet_dir;
  r.plugin.server.driver_name = f.driver_name;
  r.plugin.cdi_root = f.cdi_root;
  r.plugin.read_pods = f.read_pods;
  return r;
}

int Serve(const DraFlags& f, const Resolved& r) {
  // The API server: --kubeconfig, else the in-cluster service account.
  absl::StatusOr<std::unique_ptr<kube::Client>> client = kube::NewClient(f.kubeconfig);
  if (!client.ok()) {
    Log()->error("{}{}",
                 f.kubeconfig.empty() ? "no in-cluster API server (give --kubeconfig): "
                                      : "--kubeconfig: ",
                 std::string(client.status().message()));
    return kExitUsage;
  }
  std::unique_ptr<node::Node> node = MakeNode(r);
  dra::Plugin plugin(r.plugin, *node, std::shared_ptr<kube::Client>(*std::move(client)));
  if (absl::Status s = plugin.Init(); !s.ok()) {
    Log()->error("cannot start: {}", s.ToString());
    return 1;
  }
  ServerRun run{"dra"};
  run.start = [&plugin] { return plugin.Start(); };  // after RunServer blocked the signals
  run.wait = [&plugin](int signals) { return plugin.Wait(signals); };
  run.stop = [&plugin] { plugin.Stop(); };
  run.stopped = plugin.StoppedLine();
  run.metrics = r.metrics;
  run.node = &node->env();
  run.render_metrics = [&plugin] { return plugin.Metrics(); };
  run.checks.healthz = [&plugin] { return plugin.Health(); };
  // `probe --dra` and `probe --dra --ready`, in this process.
  const dra::DraServerConfig& server = r.plugin.server;
  run.checks.livez = [&server] {
    return dra::Probe(server.kubelet_dir, server.driver_name, kProbeTimeout, /*ready=*/false);
  };
  run.checks.readyz = [&server] {
    return dra::Probe(server.kubelet_dir, server.driver_name, kProbeTimeout, /*ready=*/true);
  };
  return RunServer(run);
}

// dra::PrepareLocal's answer as JSON on stdout.
int PrepareLocal(const DraFlags& f, const Resolved& r) {
  std::unique_ptr<node::Node> node = MakeNode(r);
  absl::StatusOr<std::pair<int, nlohmann::json>> out =
      dra::PrepareLocal(r.plugin, *node, {f.claim_ns, f.claim_uid, f.claim_name}, f.devices);
  if (!out.ok()) {
    Log()->error("cannot start: {}", out.status().ToString());
    return 1;
  }
  std::cout << out->second.dump(2) << "\n";
  return out->first;
}

void AddCommonFlags(CLI::App* app, DraFlags& f) {
  app->add_option("--kubelet-dir", f.kubelet_dir,
                  "The kubelet's root directory (plugins/ and plugins_registry/ below it)")
      ->envname("RDP_KUBELET_DIR")
      ->capture_default_str();
  app->add_option("--kubelet-state-file", f.kubelet_state,
                  "The kubelet's DRA checkpoint, read at start: prepared claims it no longer "
                  "holds are unprepared (default: <kubelet-dir>/dra_manager_state)")
      ->envname("RDP_KUBELET_STATE_FILE");
  app->add_option("--driver-name", f.driver_name, "The DRA driver name")
      ->envname("RDP_DRIVER_NAME")
      ->capture_default_str();
  app->add_option("--node-name", f.node_name, "This node's name: our pool (default: host name)")
      ->envname("NODE_NAME");
  app->add_option("--cdi-root", f.cdi_root, "Where the claims' CDI spec files are written")
      ->envname("RDP_CDI_ROOT")
      ->capture_default_str();
}

}  // namespace

void AddDraServeFlags(CLI::App* dra) {
  auto f = std::make_shared<DraFlags>();
  f->discovery.Register(dra);
  AddCommonFlags(dra, *f);
  dra->add_option("--kubeconfig", f->kubeconfig,
                  "kubeconfig for the API server (default: the in-cluster service account)")
      ->envname("KUBECONFIG");
  dra->add_option("--mode", f->mode, "shared or exclusive")
      ->envname("RDP_MODE")
      ->capture_default_str();
  dra->add_option("--shared-devices", f->shared_devices,
                  "Shared mode: the claims one HCA serves at most (its pods capacity)")
      ->envname("RDP_SHARED_DEVICES")
      ->capture_default_str();
  dra->add_option("--health-interval", f->health_interval,
                  "How often the HCAs are discovered again (health as device taints and in the kubelet's health stream, hotplug)")
      ->envname("RDP_HEALTH_INTERVAL")
      ->capture_default_str();
  f->metrics.Register(dra);
  f->early_warning.Register(dra);
  dra->add_option("--proc-root", f->proc_root,
                  "Root under which proc/ is read (GPUDirect RDMA: modules, driver/nvidia)")
      ->envname("RDP_PROC_ROOT")
      ->capture_default_str();
  dra->add_option("--allocation-dir", f->allocation_dir,
                  "Host directory (the same path in this container) for the files the CDI "
                  "devices mount at /etc/rdma/allocation.json; empty: no file")
      ->envname("RDP_ALLOCATION_DIR");
  dra->add_option("--read-pods", f->read_pods,
                  "Read the pods a claim is reserved for (RBAC get on pods, cluster-wide; only "
                  "this node's are used): without them a claim's CDI devices set no common "
                  "variable (NCCL_IB_HCA, ...) and mount no /etc/rdma/allocation.json")
      ->envname("RDP_READ_PODS")
      ->capture_default_str();
  dra->add_option("--slice-resync", f->resync,
                  "How often the published ResourceSlices are checked against the node's while "
                  "no watch of them is up (the watch says when someone else changed them)")
      ->envname("RDP_SLICE_RESYNC")
      ->capture_default_str();
  dra->callback([f, dra] {
    if (!dra->get_subcommands().empty()) return;  // `dra slices` and the like
    absl::StatusOr<Resolved> r = Resolve(*f);
    if (!r.ok()) {
      Log()->error("{}", std::string(r.status().message()));
      Exit(kExitUsage);
    }
    if (int code = Serve(*f, *r); code != 0) Exit(code);
  });

  CLI::App* local = dra->add_subcommand(
      "prepare-local",
      "Prepare one claim given here (devices of this node's pool) as NodePrepareResources "
      "would: write its CDI spec and checkpoint entry, print the answer");
  local->group("");  // hidden: a tool for tests and debugging
  local->fallthrough();  // `dra`'s flags after it too
  local->add_option("--claim-uid", f->claim_uid, "The claim's UID")->required();
  local->add_option("--claim-namespace", f->claim_ns, "The claim's namespace")
      ->capture_default_str();
  local->add_option("--claim-name", f->claim_name, "The claim's name")->capture_default_str();
  local->add_option("--device", f->devices, "A device name of our pool (repeatable)")
      ->required();
  local->callback([f] {
    absl::StatusOr<Resolved> r = Resolve(*f);
    if (!r.ok()) {
      Log()->error("{}", std::string(r.status().message()));
      Exit(kExitUsage);
    }
    if (int code = PrepareLocal(*f, *r); code != 0) Exit(code);
  });
}

}  // namespace rdp::cmd
