#include "dra/plugin.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "dra/devices.h"
#include "dra/kernel_pci.h"
#include "dra/slices.h"
#include "metrics/metrics.h"
#include "serving/fatal_latch.h"
#include "topology/gpudirect.h"

namespace rdp::dra {
namespace {

std::shared_ptr<spdlog::logger> Log() { return Logger("dra"); }

// `dra prepare-local`'s claim: the one given on the command line, allocated as given, used by
// one container of one pod (so its CDI device sets the common variables too).
class StaticClaimReader final : public ClaimReader {
 public:
  StaticClaimReader(ClaimRef ref, std::vector<AllocatedDevice> devices)
      : ref_(std::move(ref)), devices_(std::move(devices)) {}
  absl::StatusOr<ClaimAllocation> Read(const ClaimRef& ref, const std::string&,
                                       absl::Time) override {
    if (ref.ns != ref_.ns || ref.name != ref_.name || (!ref.uid.empty() && ref.uid != ref_.uid)) {
      return absl::NotFoundError(absl::StrCat("no claim ", ref.ns, "/", ref.name));
    }
    return ClaimAllocation{ref_.uid, devices_, {{ref_.ns, "local", "local-pod"}}};
  }
  absl::StatusOr<PodClaims> ReadPod(const PodRef& pod, absl::Time) override {
    return PodClaims{pod, {{"local", {{ref_.name, ""}}}}};
  }

 private:
  const ClaimRef ref_;
  const std::vector<AllocatedDevice> devices_;
};

void WriteDriverMetrics(metrics::Exposition& out, bool registered, const SliceSync::Status& sync,
                        std::map<std::string, std::uint64_t> dropped,
                        const ApiClaimStatusWriter::Counts& claim_status,
                        int unprepared_at_start) {
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
  dropped.emplace(kCapacityRequestPolicyField, 0);
  dropped.emplace(kTaintEffectNoneField, 0);
  for (const auto& [field, n] : dropped) {
    out.Sample({{"field", field}}, static_cast<double>(n));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NodeClaims>> NodeClaims::Start(const PluginConfig& config,
                                                              node::Node& node,
                                                              ClaimReader& reader,
                                                              ClaimStatusWriter* status,
                                                              bool serving) {
  std::unique_ptr<NodeClaims> claims(new NodeClaims());
  // Before the checkpoint is read: a second instance waits for the first to release the lock
  // (SIGTERM ends the wait: the stop signals are not blocked yet).
  absl::StatusOr<PluginDirLock> lock = PluginDirLock::Acquire(
      config.server.PluginDir(), nullptr, absl::Milliseconds(250), /*request_handover=*/serving);
  if (!lock.ok()) return lock.status();
  claims->lock_.emplace(*std::move(lock));
  if (absl::Status s = node.Init(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("discovery failed: ", s.message()));
  }
  claims->cdi_ = std::make_unique<CdiStore>(config.cdi_root, config.driver.driver_name);
  claims->metadata_ = std::make_unique<MetadataStore>(
      (std::filesystem::path(config.server.PluginDir()) / kMetadataSubDir).string());
  claims->checkpoint_ = std::make_unique<Checkpoint>(
      (std::filesystem::path(config.server.PluginDir()) / kCheckpointFile).string());
  DriverConfig driver = config.driver;
  if (!driver.published_devices) {
    driver.published_devices = [config, &node](const node::View& view) {
      return BuildDevices(view, PublishedDeviceOptions(config, node, view));
    };
  }
  claims->driver_ = std::make_unique<Driver>(std::move(driver), reader, *claims->cdi_,
                                             *claims->metadata_, *claims->checkpoint_, node,
                                             status);
  if (absl::Status s = claims->driver_->Start(); !s.ok()) return s;
  return claims;
}

std::set<std::string> HeldHcas(const PreparedClaims& claims, const node::View& view) {
  std::set<std::string> names;
  for (const auto& [uid, claim] : claims) {
    for (const AllocatedDevice& d : claim.devices) {
      if (!d.admin_access) names.insert(d.device);
    }
  }
  std::set<std::string> held;
  for (const auto& [pci, a] : view.hcas) {
    if (names.count(DeviceNameOfPci(pci))) held.insert(pci);
  }
  return held;
}

Plugin::Plugin(PluginConfig config, node::Node& node, std::shared_ptr<kube::Client> client)
    : config_(std::move(config)),
      node_(node),
      client_(std::move(client)),
      reader_(client_, PodReads{config_.driver.node_name, config_.read_pods}),
      claim_status_(client_, config_.driver.driver_name),
      publisher_(client_, config_.driver.driver_name, config_.driver.node_name),
      // The kubelet keeps a device's health for three polls (at least its default 30 s) before
      // it says UNKNOWN; the list is sent at least every poll.
      health_({config_.health_interval,
               std::max(absl::Seconds(30), 3 * config_.health_interval)}) {}

Plugin::~Plugin() { Stop(); }

absl::Status Plugin::Init() {
  absl::StatusOr<std::unique_ptr<NodeClaims>> claims =
      NodeClaims::Start(config_, node_, reader_, &claim_status_, /*serving=*/true);
  if (!claims.ok()) return claims.status();
  claims_ = *std::move(claims);
  sync_ = std::make_unique<SliceSync>(
      publisher_, [this] { return DesiredSlices(); },
      SliceSync::Options{config_.resync, absl::Seconds(10), absl::Seconds(1), absl::Seconds(30)});
  publisher_.SetOnDropped([this](const std::string& field) {
    if (field == "taints" && taints_.exchange(false)) {
      Log()->warn("device taints are not kept by this control plane: unusable HCAs are no longer "
                  "offered at all (not tainted) until the driver restarts");
      sync_->Trigger();
    }
    if (field == kTaintEffectNoneField && taint_effect_none_.exchange(false)) {
      sync_->Trigger();  // published again without the taints that only inform
    }
  });
  const node::ViewPtr view = node_.Now();
  Log()->info("DRA driver {} on node {} ({} HCA(s)), CDI specs in {}, mode {}",
              config_.driver.driver_name, config_.driver.node_name,
              view->topology->hcas().size(), config_.cdi_root, hca::ModeName(config_.mode));
  health_.Publish(DeviceHealthOf(*view, config_.driver.node_name));
  DraServerConfig server_config = config_.server;
  server_config.handover = true;
  server_ = std::make_unique<DraServer>(server_config, &claims_->driver(), &health_);
  // Published only while the kubelet has the driver registered (a kubelet that (re)registers us
  // has wiped the node's slices at its start: publish again), withdrawn when it refuses it.
  server_->registration().SetOnStatus([this](const RegistrationState& state) {
    sync_->SetRole(state.registered ? SliceSync::Role::kPublish : SliceSync::Role::kWithdraw);
  });
  // A change of the node (the poll, a Prepare's discovery): the pool is published again and the
  // health stream says it.
  listener_ = node_.AddListener([this] {
    sync_->Trigger();
    health_.Publish(DeviceHealthOf(*node_.Now(), config_.driver.node_name));
  });
  return absl::OkStatus();
}

DeviceOptions PublishedDeviceOptions(const PluginConfig& config, node::Node& node,
                                     const node::View& view) {
  DeviceOptions options;
  options.driver_name = config.driver.driver_name;
  options.mode = config.mode;
  options.shared_units = config.shared_units;
  options.kernel = ReadKernelPci(node.env(), *view.topology);
  options.gpudirect_rdma = topology::ReadGpuDirect(node.env()).Available();
  return options;
}

std::vector<nlohmann::json> Plugin::DesiredSlices() const {
  const node::ViewPtr view = node_.Now();
  DeviceOptions options = PublishedDeviceOptions(config_, node_, *view);
  options.taints = taints_;
  options.taint_effect_none = taint_effect_none_;
  return BuildResourceSlices(BuildDevices(*view, options),
                             {config_.driver.driver_name, config_.driver.node_name, "", 1});
}

absl::Status Plugin::Start() {
  sync_->Start();
  claim_status_.Start();
  poll_ = std::thread([this] { PollLoop(); });
  return server_->Start();
}

void Plugin::PollLoop() {
  while (!stop_poll_.WaitForNotificationWithTimeout(config_.health_interval)) {
    try {
      // A change publishes through the listener; the health stream is sent each poll all the
      // same (a stream that joined since has its heartbeat from it).
      const bool away = !node_.Now()->driver_away.empty();
      node_.Poll(HeldHcas(claims_->driver().Prepared(), *node_.Now()));
      // Back from a driver reload: the prepared claims' specs name the new device nodes.
      if (away && node_.Now()->driver_away.empty()) claims_->driver().RefreshSpecs();
    } catch (const std::exception& e) {  // the next poll tries again; the process goes on
      Log()->error("the health poll failed: {}", e.what());
    }
  }
}

void Plugin::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // First: every API call in flight ends now (a Prepare, a publish, a status write waiting out
  // an unreachable API server would otherwise each hold the stop up to its deadline, one after
  // the other).
  client_->Shutdown();
  if (server_) server_->Stop();
  stop_poll_.Notify();
  if (poll_.joinable()) poll_.join();
  if (listener_ >= 0) node_.RemoveListener(listener_);
  listener_ = -1;
  if (sync_) sync_->Stop();
  claim_status_.Stop();
}

absl::Status Plugin::Wait(int signal_fd) {
  absl::Status s = server_->Wait(signal_fd);
  if (!absl::IsAborted(s)) return s;
  // Another instance asks for the plugin directory: stop serving (the kubelet unregisters us;
  // calls in flight finish), release the lock, stop publishing, and idle until stopped: exiting
  // now would only have the kubelet restart this container, which would then ask the new
  // instance to hand back.
  const absl::Time asked = absl::Now();
  server_->Stop();  // calls in flight finish: nothing writes the checkpoint or a CDI spec after
  handed_over_ = true;
  claims_->ReleaseLock();  // the new instance goes on from here
  Log()->info("handed over in {}: not serving", absl::FormatDuration(absl::Now() - asked));
  // Then publishing: a publish in flight ends within its timeout (the new instance's watch
  // repairs what it wrote), and the health poll.
  Stop();
  Log()->info("not publishing either; waiting to be stopped");
  serving::FatalLatch idle;  // never raised: waits for the stop signal alone
  return idle.Wait(signal_fd);
}

std::string Plugin::Metrics() const {
  metrics::Exposition out;
  metrics::NodeMetricsInput door;
  door.mode = config_.mode;
  node_.WriteMetrics(out, std::move(door));
  WriteDriverMetrics(out, server_ && server_->registered() && !handed_over_,
                     sync_ ? sync_->status() : SliceSync::Status{}, publisher_.DroppedCounts(),
                     claim_status_.counts(), claims_ ? claims_->driver().UnpreparedAtStart() : 0);
  return out.Take();
}

absl::Status Plugin::Health() const {
  if (handed_over_) {
    return absl::UnavailableError("handed the plugin directory over to another instance");
  }
  if (!server_ || !server_->registered()) {
    return absl::UnavailableError("the kubelet has not registered the DRA driver");
  }
  const SliceSync::Status sync = sync_->status();
  if (!sync.in_sync) {
    return absl::UnavailableError(absl::StrCat(
        "the node's ResourceSlices are not published",
        sync.last_error.empty() ? "" : absl::StrCat(": ", sync.last_error)));
  }
  return absl::OkStatus();
}

std::string Plugin::StoppedLine() const {
  return absl::StrCat("stopped; removed ", config_.server.RegistrationSocket(), " and ",
                      config_.server.DraSocket());
}

absl::StatusOr<std::pair<int, nlohmann::json>> PrepareLocal(
    PluginConfig config, node::Node& node, const ClaimRef& claim,
    const std::vector<std::string>& devices) {
  std::vector<AllocatedDevice> allocated;
  for (const std::string& d : devices) allocated.push_back({"hca", config.driver.node_name, d, ""});
  StaticClaimReader reader(claim, allocated);
  // The claims prepared here are not the kubelet's: none is unprepared for its not holding it.
  config.driver.kubelet_state.clear();
  absl::StatusOr<std::unique_ptr<NodeClaims>> claims =
      NodeClaims::Start(config, node, reader, nullptr, /*serving=*/false);
  if (!claims.ok()) return claims.status();
  auto results = (*claims)->driver().Prepare({claim});
  const auto& result = results.begin()->second;
  if (!result.ok()) {
    return std::make_pair(1, nlohmann::json({{"error", result.status().ToString()}}));
  }
  nlohmann::json out = nlohmann::json::array();
  for (const PreparedDevice& d : *result) {
    out.push_back({{"requestNames", d.requests},
                   {"poolName", d.pool},
                   {"deviceName", d.device},
                   {"cdiDeviceIds", d.cdi_ids}});
  }
  return std::make_pair(
      0, nlohmann::json({{"devices", out}, {"cdiSpec", (*claims)->cdi().PathOf(claim.uid)}}));
}

}  // namespace rdp::dra
