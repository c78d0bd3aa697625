#include "cmd/dra_serve_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/env.h"
#include "base/log.h"
#include "cmd/discovery_flags.h"
#include "cmd/flag_values.h"
#include "cmd/dra_cmd.h"
#include "cmd/early_warning_flags.h"
#include "cmd/metrics_flags.h"
#include "cmd/run_server.h"
#include "dra/cdi.h"
#include "dra/checkpoint.h"
#include "dra/claim_reader.h"
#include "dra/claim_status.h"
#include "dra/devices.h"
#include "dra/dra_server.h"
#include "dra/driver.h"
#include "dra/health.h"
#include "dra/kernel_pci.h"
#include "dra/kubelet_state.h"
#include "dra/model.h"
#include "dra/node_snapshot.h"
#include "dra/plugin_lock.h"
#include "dra/slice_publisher.h"
#include "dra/slice_sync.h"
#include "topology/gpudirect.h"
#include "dra/slices.h"
#include "hca/hca.h"
#include "kube/client.h"
#include "metrics/metrics.h"
#include "metrics/node_metrics.h"
#include "serving/fatal_latch.h"
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
  std::string health_interval = "5s";
  std::string resync = "30s";
  MetricsFlags metrics;
  EarlyWarningFlags early_warning;
  std::string proc_root = "/";  // GPUDirect RDMA's signals (/proc/modules, /proc/driver/nvidia)
  std::string allocation_dir;   // /etc/rdma/allocation.json's host files; empty: none
  // dra prepare-local
  std::string claim_ns = "default";
  std::string claim_name = "local";
  std::string claim_uid;
  std::vector<std::string> devices;
};

std::shared_ptr<spdlog::logger> Log() { return Logger("dra"); }

// `dra prepare-local`: the claim given on the command line, allocated as given, used by one
// container of one pod (so its CDI device sets the common variables too).
class StaticClaimReader final : public dra::ClaimReader {
 public:
  StaticClaimReader(dra::ClaimRef ref, std::vector<dra::AllocatedDevice> devices)
      : ref_(std::move(ref)), devices_(std::move(devices)) {}
  absl::StatusOr<dra::ClaimAllocation> Read(const dra::ClaimRef& ref, const std::string&,
                                            absl::Time) override {
    if (ref.ns != ref_.ns || ref.name != ref_.name || (!ref.uid.empty() && ref.uid != ref_.uid)) {
      return absl::NotFoundError(absl::StrCat("no claim ", ref.ns, "/", ref.name));
    }
    return dra::ClaimAllocation{ref_.uid, devices_, {{ref_.ns, "local", "local-pod"}}};
  }
  absl::StatusOr<dra::PodClaims> ReadPod(const dra::PodRef& pod, absl::Time) override {
    return dra::PodClaims{pod, {{"local", {{ref_.name, ""}}}}};
  }

 private:
  const dra::ClaimRef ref_;
  const std::vector<dra::AllocatedDevice> devices_;
};

struct Resolved {
  topology::DiscoveryOptions discovery;
  NodeRoots roots;  // discovery's, and --proc-root
  hca::Mode mode = hca::Mode::kExclusive;
  absl::Duration health_interval;
  absl::Duration resync;
  dra::DriverConfig driver;
  dra::DraServerConfig server;
  metrics::HttpOptions metrics;
  hca::EarlyWarningConfig early_warning;
};

absl::StatusOr<Resolved> Resolve(DraFlags& f) {
  Resolved r;
  auto discovery = f.discovery.Options();
  if (!discovery.ok()) return discovery.status();
  r.discovery = *discovery;
  r.roots = r.discovery.Roots();
  r.roots.proc = f.proc_root.empty() ? "/" : f.proc_root;
  absl::StatusOr<hca::Mode> mode = hca::ParseMode(f.mode);
  if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--mode: ", mode.status().message()));
  r.mode = *mode;
  absl::StatusOr<metrics::HttpOptions> http = f.metrics.Options();
  if (!http.ok()) return http.status();
  r.metrics = *http;
  absl::StatusOr<hca::EarlyWarningConfig> early_warning = f.early_warning.Config();
  if (!early_warning.ok()) return early_warning.status();
  r.early_warning = *early_warning;
  for (auto [flag, text, out] : {std::make_tuple("--health-interval", &f.health_interval,
                                                 &r.health_interval),
                                 std::make_tuple("--slice-resync", &f.resync, &r.resync)}) {
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
  r.driver.driver_name = f.driver_name;
  r.driver.node_name = f.node_name;
  r.driver.allocation_dir = f.allocation_dir;
  r.driver.kubelet_state =
      f.kubelet_state.empty()
          ? (std::filesystem::path(f.kubelet_dir) / dra::kKubeletDraStateFile).string()
          : f.kubelet_state;
  r.server.kubelet_dir = f.kubelet_dir;
  r.server.driver_name = f.driver_name;
  return r;
}

// The pieces every DRA run needs: the node, the CDI directory, the checkpoint, the driver.
struct Node {
  // Held for the process's life: one instance per plugin directory (declared first: released
  // last).
  std::optional<dra::PluginDirLock> lock;
  std::shared_ptr<Env> env;
  std::unique_ptr<dra::NodeSnapshot> snapshot;
  std::unique_ptr<dra::CdiStore> cdi;
  std::unique_ptr<dra::Checkpoint> checkpoint;
  std::unique_ptr<dra::Driver> driver;
};

// `serving`: the instance that serves the kubelet, which asks one that holds the plugin
// directory to hand over (dra/plugin_lock.h); prepare-local only waits.
// `status`: where prepared claims' status.devices go (none for prepare-local).
Node StartNode(const DraFlags& f, const Resolved& r, dra::ClaimReader& reader, bool serving,
               dra::ClaimStatusWriter* status = nullptr) {
  Node n;
  // Before the checkpoint is read: a second instance waits for the first to release the lock
  // (SIGTERM ends the wait: the stop signals are not blocked yet).
  absl::StatusOr<dra::PluginDirLock> lock = dra::PluginDirLock::Acquire(
      r.server.PluginDir(), nullptr, absl::Milliseconds(250), /*request_handover=*/serving);
  if (!lock.ok()) {
    Log()->error("cannot start: {}", lock.status().ToString());
    Exit(1);
  }
  n.lock.emplace(*std::move(lock));
  n.env = NewNodeEnv(r.roots);
  auto discoverer = std::make_shared<topology::Discoverer>(r.discovery, n.env);
  n.snapshot = std::make_unique<dra::NodeSnapshot>([discoverer] { return discoverer->Discover(); });
  if (absl::Status s = n.snapshot->Init(); !s.ok()) {
    Log()->error("discovery failed: {}", std::string(s.message()));
    Exit(1);
  }
  n.cdi = std::make_unique<dra::CdiStore>(f.cdi_root, r.driver.driver_name);
  n.checkpoint = std::make_unique<dra::Checkpoint>(
      (std::filesystem::path(r.server.PluginDir()) / dra::kCheckpointFile).string());
  dra::NodeSnapshot* snapshot = n.snapshot.get();
  n.driver = std::make_unique<dra::Driver>(
      r.driver, reader, *n.cdi, *n.checkpoint, [snapshot] { return snapshot->Current(); }, n.env,
      [snapshot] { return snapshot->Rediscover(); }, status);
  if (absl::Status s = n.driver->Start(); !s.ok()) {
    Log()->error("cannot start: {}", s.ToString());
    Exit(1);
  }
  return n;
}

// The API server: --kubeconfig, else the in-cluster service account (kube::NewClient); the
// error names the flag.
absl::StatusOr<std::shared_ptr<kube::Client>> ApiClient(const DraFlags& f) {
  absl::StatusOr<std::unique_ptr<kube::Client>> client = kube::NewClient(f.kubeconfig);
  if (!client.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.kubeconfig.empty() ? "no in-cluster API server (give --kubeconfig): "
                                          : "--kubeconfig: ",
                     client.status().message()));
  }
  return std::shared_ptr<kube::Client>(*std::move(client));
}

// What a scrape shows in DRA mode: the node's HCAs (health, placement) and their port counters,
// from the current snapshot, the same families device-plugin mode writes (docs/metrics.md). The
// driver knows claims, not pods: no hca_allocated series here (the claims' status has them).
std::string RenderDraMetrics(const Resolved& r, topology::TopologyPtr topo,
                             const hca::FlaggedHcas& flagged, Env& env,
                             metrics::PortCounterCache& counters,
                             bool registered, const dra::SliceSync::Status& sync,
                             std::map<std::string, std::uint64_t> dropped,
                             const dra::ApiClaimStatusWriter::Counts& claim_status,
                             int unprepared_at_start) {
  metrics::NodeMetricsInput in;
  in.mode = r.mode;
  in.topology = topo;
  for (const topology::Hca& h : topo->hcas()) {
    hca::AdvertisedHca health;
    health.pci = h.place.pci;
    health.name = h.name;
    health.numa = h.place.numa;
    health.present = true;
    health.healthy = hca::AssessWithHistory(h, flagged).usable;
    in.hcas.push_back(std::move(health));
  }
  in.early_warning = flagged;
  metrics::Exposition out;
  metrics::WriteNodeMetrics(in, env, counters, out);
  using Type = metrics::Exposition::Type;
  out.Family("rdma_device_plugin_dra_registered",
             "1 while the kubelet has the DRA driver registered (its last NotifyRegistrationStatus)",
             Type::kGauge);
  out.Sample({}, registered ? 1 : 0);
  out.Family("rdma_device_plugin_dra_slices_in_sync",
             "1 when the last publish of the node's ResourceSlices (or their withdrawal, when the "
             "kubelet refused the driver) succeeded",
             Type::kGauge);
  out.Sample({}, sync.in_sync ? 1 : 0);
  out.Family("rdma_device_plugin_dra_slice_watch_up",
             "1 while the watch on the node's ResourceSlices is up (an edit or deletion of them "
             "is repaired at once); 0 before the first publish and while it reconnects (the "
             "slices are then checked every --slice-resync)",
             Type::kGauge);
  out.Sample({}, sync.watching ? 1 : 0);
  out.Family("rdma_device_plugin_dra_slice_watch_failures_total",
             "Watches on the node's ResourceSlices that ended with an error (each is opened "
             "again after a jittered back-off)",
             Type::kCounter);
  out.Sample({}, static_cast<double>(sync.watch_failures));
  out.Family("rdma_device_plugin_dra_publishes_total",
             "Publishes of the node's ResourceSlices, by result", Type::kCounter);
  out.Sample({{"result", "success"}}, static_cast<double>(sync.successes));
  out.Sample({{"result", "failure"}}, static_cast<double>(sync.failures));
  out.Family("rdma_device_plugin_dra_claim_status_writes_total",
             "Writes of our entries of prepared and unprepared claims' status.devices, by result "
             "(a failure is retried or left for the claim's next prepare; it never fails one)",
             Type::kCounter);
  out.Sample({{"result", "success"}}, static_cast<double>(claim_status.successes));
  out.Sample({{"result", "failure"}}, static_cast<double>(claim_status.failures));
  out.Family("rdma_device_plugin_dra_claims_unprepared_at_start_total",
             "Prepared claims unprepared at the driver's start because the kubelet's DRA "
             "checkpoint no longer lists them (docs/dra.md, \"Claims the kubelet forgot\")",
             Type::kCounter);
  out.Sample({}, unprepared_at_start);
  out.Family("rdma_device_plugin_dra_dropped_fields_total",
             "Writes of a ResourceSlice whose answer from the API server lacked a field we sent "
             "(its feature gate is off on the control plane), by field",
             Type::kCounter);
  dropped.emplace("taints", 0);  // the fields we send that a gate controls, listed at 0
  dropped.emplace("allowMultipleAllocations", 0);
  for (const auto& [field, n] : dropped) {
    out.Sample({{"field", field}}, static_cast<double>(n));
  }
  return out.Take();
}

// /healthz in DRA mode: ok while the kubelet has the driver registered and the node's slices are
// published as wanted; else why not.
absl::Status DraHealth(bool registered, const dra::SliceSync::Status& sync) {
  if (!registered) {
    return absl::UnavailableError("the kubelet has not registered the DRA driver");
  }
  if (!sync.in_sync) {
    return absl::UnavailableError(absl::StrCat(
        "the node's ResourceSlices are not published",
        sync.last_error.empty() ? "" : absl::StrCat(": ", sync.last_error)));
  }
  return absl::OkStatus();
}

// The pool this node publishes now: its HCAs as devices (health as taints), in slices.
std::vector<nlohmann::json> DesiredSlices(const Resolved& r, const topology::Topology& topo,
                                          const hca::FlaggedHcas& flagged, Env& env,
                                          bool taints) {
  dra::DeviceOptions options;
  options.driver_name = r.driver.driver_name;
  options.mode = r.mode;
  options.taints = taints;
  options.kernel = dra::ReadKernelPci(env, topo);
  options.gpudirect_rdma = topology::ReadGpuDirect(env).Available();
  options.early_warning = flagged;
  return dra::BuildResourceSlices(dra::BuildDevices(topo, options),
                                  {r.driver.driver_name, r.driver.node_name, "", 1});
}

int Serve(const DraFlags& f, const Resolved& r) {
  absl::StatusOr<std::shared_ptr<kube::Client>> client = ApiClient(f);
  if (!client.ok()) {
    Log()->error("{}", std::string(client.status().message()));
    return kExitUsage;
  }
  dra::ApiClaimReader reader(*client);
  // Claims' status.devices, written on a thread of its own: a prepare never waits on it.
  dra::ApiClaimStatusWriter claim_status(*client, r.driver.driver_name);
  Node node = StartNode(f, r, reader, /*serving=*/true, &claim_status);
  // Publishing runs on its own thread: an API server that is slow or down delays the slices,
  // never a kubelet RPC.
  dra::ApiSlicePublisher publisher(*client, r.driver.driver_name, r.driver.node_name);
  dra::NodeSnapshot* snapshot = node.snapshot.get();
  Env* env = node.env.get();
  // Cleared when the API server drops device taints: unusable HCAs are then left out.
  std::atomic<bool> taints{true};
  // Early-warning health: the health poll updates it; publications, the health stream and
  // scrapes read it.
  hca::EarlyWarningMonitor early_warning(r.early_warning, "dra");
  dra::SliceSync sync(
      publisher,
      [&r, snapshot, env, &taints, &early_warning] {
        return DesiredSlices(r, *snapshot->Current(), early_warning.Flagged(), *env, taints);
      },
      {r.resync, absl::Seconds(10), absl::Seconds(1), absl::Seconds(30)});
  publisher.SetOnDropped([&taints, &sync](const std::string& field) {
    if (field == "taints" && taints.exchange(false)) {
      Log()->warn("device taints are not kept by this control plane: unusable HCAs are no longer "
                  "offered at all (not tainted) until the driver restarts");
      sync.Trigger();
    }
  });
  Log()->info("DRA driver {} on node {} ({} HCA(s)), CDI specs in {}, mode {}",
              r.driver.driver_name, r.driver.node_name, node.snapshot->Current()->hcas().size(),
              f.cdi_root, f.mode);
  dra::DraServerConfig server_config = r.server;
  server_config.handover = true;
  // The HCAs' health for the kubelet (pods' allocatedResourcesStatus): sent at least every poll,
  // kept by the kubelet for three polls (at least its default 30 s) before it says UNKNOWN.
  dra::HealthFeed health({r.health_interval, std::max(absl::Seconds(30), 3 * r.health_interval)});
  health.Publish(dra::DeviceHealthOf(*snapshot->Current(), r.driver.node_name));
  dra::DraServer server(server_config, node.driver.get(), &health);
  // Published only while the kubelet has the driver registered (a kubelet that (re)registers us
  // has wiped the node's slices at its start: publish again), withdrawn when it refuses it.
  server.registration().SetOnStatus([&sync](const dra::RegistrationState& state) {
    sync.SetRole(state.registered ? dra::SliceSync::Role::kPublish
                                  : dra::SliceSync::Role::kWithdraw);
  });
  // The health poll: a sysfs scan every --health-interval; a change of the HCAs' state (ports,
  // device nodes) is patched into the snapshot, a hotplug discovered in full, and either
  // published at once.
  absl::Notification stop_poll;
  std::thread poll;
  ServerRun run;
  run.logger = "dra";
  // The background threads start here, after RunServer blocked the stop signals.
  run.start = [&] {
    sync.Start();
    claim_status.Start();
    poll = std::thread([&] {
      while (!stop_poll.WaitForNotificationWithTimeout(r.health_interval)) {
        try {
          // The cheap sysfs scan each time; a full discovery only when PCI functions came or
          // went.
          absl::StatusOr<std::vector<topology::Hca>> scan = topology::ReadSysfsHcas(*env);
          if (scan.ok() && snapshot->Apply(*scan)) {
            Log()->info("the node's HCAs changed: publishing the pool again");
            sync.Trigger();
          }
          // An HCA degraded, flapping or clear again: its taints change.
          if (scan.ok() && early_warning.Poll(*scan, *env, absl::Now())) sync.Trigger();
          // Each poll (a Prepare may have rediscovered the node since); streams wake on a change.
          health.Publish(dra::DeviceHealthOf(*snapshot->Current(), r.driver.node_name,
                                             early_warning.Flagged()));
        } catch (const std::exception& e) {  // the next poll tries again; the process goes on
          Log()->error("the health poll failed: {}", e.what());
        }
      }
    });
    return server.Start();
  };
  bool stopped = false;  // the run's threads (the main thread only)
  auto stop = [&] {
    if (stopped) return;
    stopped = true;
    // First: every API call in flight ends now (a Prepare, a publish, a status write waiting out
    // an unreachable API server would otherwise each hold the stop up to its deadline, one after
    // the other: SIGTERM took over 10 s).
    (*client)->Shutdown();
    server.Stop();
    stop_poll.Notify();
    if (poll.joinable()) poll.join();
    sync.Stop();
    claim_status.Stop();
  };
  // Set once this instance has handed the plugin directory over; read by /metrics and /healthz.
  std::atomic<bool> handed_over{false};
  run.wait = [&](int signals) {
    absl::Status s = server.Wait(signals);
    if (!absl::IsAborted(s)) return s;
    // Another instance asks for the plugin directory (an upgrade with maxSurge, a relabel): stop
    // serving (the kubelet unregisters us; calls in flight finish), release the lock, stop
    // publishing, and idle until stopped: exiting now would only have the kubelet restart this
    // container, which would then ask the new instance to hand back.
    const absl::Time asked = absl::Now();
    server.Stop();  // calls in flight finish: nothing writes the checkpoint or a CDI spec after
    handed_over = true;
    node.lock.reset();  // the new instance goes on from here
    Log()->info("handed over in {}: not serving", absl::FormatDuration(absl::Now() - asked));
    // Then publishing: a publish in flight ends within its timeout (the new instance's watch
    // repairs what it wrote), and the health poll.
    stop();
    Log()->info("not publishing either; waiting to be stopped");
    serving::FatalLatch idle;  // never raised: waits for the stop signal alone
    return idle.Wait(signals);
  };
  run.stop = stop;
  run.stopped = absl::StrCat("stopped; removed ", r.server.RegistrationSocket(), " and ",
                             r.server.DraSocket());
  run.metrics = r.metrics;
  run.node = env;
  auto counters = std::make_shared<metrics::PortCounterCache>();
  dra::Driver* driver = node.driver.get();
  run.render_metrics = [&r, snapshot, env, counters, &server, &sync, &publisher, &handed_over,
                        &early_warning, &claim_status, driver] {
    return RenderDraMetrics(r, snapshot->Current(), early_warning.Flagged(), *env, *counters,
                            server.registered() && !handed_over, sync.status(),
                            publisher.DroppedCounts(), claim_status.counts(),
                            driver->UnpreparedAtStart());
  };
  run.health = [&server, &sync, &handed_over]() -> absl::Status {
    if (handed_over) {
      return absl::UnavailableError("handed the plugin directory over to another instance");
    }
    return DraHealth(server.registered(), sync.status());
  };
  return RunServer(run);
}

// Prepares one claim given on the command line (its devices allocated from this node's pool)
// through the driver, as NodePrepareResources would, and prints the answer as JSON.
int PrepareLocal(const DraFlags& f, const Resolved& r) {
  std::vector<dra::AllocatedDevice> devices;
  for (const std::string& d : f.devices) devices.push_back({"hca", r.driver.node_name, d});
  StaticClaimReader reader({f.claim_ns, f.claim_uid, f.claim_name}, devices);
  // The claims prepared here are not the kubelet's: none is unprepared for its not holding it.
  Resolved local = r;
  local.driver.kubelet_state.clear();
  Node node = StartNode(f, local, reader, /*serving=*/false);
  auto results = node.driver->Prepare({{f.claim_ns, f.claim_uid, f.claim_name}});
  const auto& result = results.begin()->second;
  if (!result.ok()) {
    std::cout << nlohmann::json({{"error", result.status().ToString()}}).dump(2) << "\n";
    return 1;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const dra::PreparedDevice& d : *result) {
    out.push_back({{"requestNames", d.requests},
                   {"poolName", d.pool},
                   {"deviceName", d.device},
                   {"cdiDeviceIds", d.cdi_ids}});
  }
  std::cout << nlohmann::json({{"devices", out}, {"cdiSpec", node.cdi->PathOf(f.claim_uid)}})
                   .dump(2)
            << "\n";
  return 0;
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
