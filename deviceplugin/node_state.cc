#include "deviceplugin/node_state.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "deviceplugin/gpu_context.h"
#include "deviceplugin/nvidia_gpus.h"
#include "topology/discovery.h"
#include "base/log.h"

namespace rdp::deviceplugin {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("server"); }

// The node core's options from the plugin's config; its lines go to the plugin's logger.
node::Options CoreOptions(const Config& config) {
  node::Options o;
  o.early_warning = config.early_warning;
  o.forget_after_polls = config.forget_after_polls;
  o.allocation_dir = config.allocation_dir;
  o.logger = "server";
  return o;
}

node::Sources CoreSources(const NodeSources& sources, const Config& config) {
  node::Sources s;
  s.env = sources.env ? sources.env : NewNodeEnv(config.Roots());
  s.discover = sources.discover;
  s.scan = sources.scan;
  s.now = sources.now;
  return s;
}

}  // namespace

resources::Resource DefaultResource(const Config& config) {
  resources::Resource r;
  r.name = config.resource_name;
  r.shared_devices = config.shared_devices;
  return r;
}

NodeSources DefaultSources(const Config& config) {
  NodeSources sources;
  node::Sources core = node::DefaultSources(config.discovery, NewNodeEnv(config.Roots()));
  sources.env = std::move(core.env);
  sources.discover = std::move(core.discover);
  sources.scan = std::move(core.scan);
  if (!config.pod_resources_socket.empty()) {
    sources.pod_resources = NewGrpcPodResources(config.pod_resources_socket);
  } else {
    Log()->info("no pod-resources socket: mode-switch withholding and GPU context off");
  }
  return sources;
}

NodeState::NodeState(Config config, NodeSources sources,
                     std::vector<resources::Resource> served)
    : config_(std::move(config)),
      sources_(std::move(sources)),
      core_(CoreOptions(config_), CoreSources(sources_, config_)),
      pod_refresh_([this](std::function<void()> finished) { StartList(std::move(finished)); }) {
  if (served.empty()) served.push_back(DefaultResource(config_));
  std::vector<AllocationNaming> naming = AllocationNamings(served);
  for (std::size_t i = 0; i < served.size(); ++i) {
    resources_.push_back(std::make_unique<ResourceState>(*this, std::move(served[i]),
                                                         config_.mode, std::move(naming[i])));
  }
}

NodeState::~NodeState() {
  StopPodLists();
  pod_refresh_.WaitIdle();
}

void NodeState::StopPodLists() {
  if (!sources_.pod_resources) return;
  sources_.pod_resources->Cancel();
}

absl::Status NodeState::Init() {
  if (!config_.exclusive_label.empty()) {
    Log()->info("node {} has exclusive label, enabling exclusive mode", config_.node_name);
  }
  if (config_.mode == hca::Mode::kExclusive) Log()->info("hca-exclusive mode");
  for (const auto& r : resources_) {
    if (r->mode() != hca::Mode::kShared) continue;
    if (r->resource().always_shared) {
      Log()->info("{} is always shared: {} devices, each sees every HCA of {}",
                  r->name(), r->resource().shared_devices, r->name());
    } else {
      Log()->info("hca-shared mode: {} {} devices, every pod sees every HCA",
                  r->resource().shared_devices, r->name());
    }
  }
  if (absl::Status s = core_.Init(); !s.ok()) return s;
  std::map<std::string, std::string> gpu_ids =
      ReadNvidiaGpuIds(core_.env(), config_.nvidia_gpu_list);
  {
    absl::MutexLock lock(&mu_);
    gpu_ids_ = std::move(gpu_ids);
    Recompute();
  }
  Notify();
  return absl::OkStatus();
}

std::optional<std::set<std::string>> NodeState::HeldNow() const {
  // Without the pod list nobody can tell who holds what: nothing is forgotten.
  absl::MutexLock lock(&mu_);
  if (!sources_.pod_resources || !pods_known_) return std::nullopt;
  std::set<std::string> held;
  for (const auto& r : resources_) {
    for (const std::string& id : HeldIds(pods_, r->name())) {
      if (auto pci = topology::NormalizePci(id)) held.insert(*pci);
    }
  }
  return held;
}

bool NodeState::Poll() {
  core_.Poll(HeldNow());
  std::map<std::string, std::string> gpu_ids =
      ReadNvidiaGpuIds(core_.env(), config_.nvidia_gpu_list);
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    gpu_ids_ = std::move(gpu_ids);
    changed = Recompute();
  }
  if (changed) Notify();
  return changed;
}

void NodeState::RefreshPods(std::function<void()> then) {
  if (!sources_.pod_resources) {
    then();
    return;
  }
  pod_refresh_.Request(std::move(then));
}

bool NodeState::RefreshPodsAndWait(absl::Duration at_most) {
  if (!sources_.pod_resources) return true;
  struct Outcome {
    absl::Notification done;
    std::atomic<bool> ok{false};
  };
  auto outcome = std::make_shared<Outcome>();
  // The callbacks of one List run after its OnPods and before the next List starts.
  RefreshPods([this, outcome] {
    outcome->ok = last_list_ok_.load();
    outcome->done.Notify();
  });
  // The List has a deadline; the bound here only guards against a source that breaks its word.
  return outcome->done.WaitForNotificationWithTimeout(
             std::min(at_most, config_.pod_resources_timeout * 2 + absl::Seconds(5))) &&
         outcome->ok;
}

bool NodeState::pods_known() const {
  absl::MutexLock lock(&mu_);
  return pods_known_;
}

void NodeState::StartList(std::function<void()> finished) {
  sources_.pod_resources->List(config_.pod_resources_timeout,
                               [this, finished](absl::StatusOr<PodList> pods) {
                                 OnPods(std::move(pods));
                                 finished();
                               });
}

void NodeState::OnPods(absl::StatusOr<PodList> pods) {
  last_list_ok_ = pods.ok();
  if (!pods.ok()) pod_resources_errors_.Add();
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    if (pods.ok()) {
      if (pods_known_ && pods_failing_) {
        Log()->info("pod-resources: answering again ({} containers)", pods->size());
      }
      pods_ = std::move(*pods);
      pods_known_ = true;
      pods_failing_ = false;
      UpdateFirstSeen(pods_, config_.gpu_resources, sources_.now(), &gpu_first_seen_);
    } else if (const absl::Time now = sources_.now();
               !pods_failing_ || now - failure_logged_ >= absl::Minutes(1)) {
      // Once when the failures start, then every minute while they go on, as a warning: a
      // kubelet that never answers keeps every HCA withheld.
      const bool repeat = pods_failing_;
      pods_failing_ = true;
      failure_logged_ = now;
      if (pods_known_) {
        Log()->warn("pod-resources refresh failed, using the last list: {}",
                    std::string(pods.status().message()));
      } else if (repeat) {
        Log()->warn("{}; the kubelet's pod list is still not known, so every HCA stays "
                    "withheld; retrying",
                    std::string(pods.status().message()));
      } else {
        Log()->info("{}; retrying with backoff",
                    std::string(pods.status().message()));
      }
    }
    if (view_) changed = Recompute();
  }
  if (changed) Notify();
}

bool NodeState::Recompute() {
  view_ = core_.Now();
  // Fail closed: while the pod list is not known, nothing says that no container holds the other
  // mode's IDs, so every HCA is withheld.
  const bool pending = sources_.pod_resources && !pods_known_;
  ResourceState::Pods pods;
  pods.list = pods_known_ ? &pods_ : nullptr;
  pods.pending = pending;
  if (pending) {
    pods.pending_reason = absl::StrCat(
        "the kubelet's pod list is not known yet (pod-resources socket ",
        config_.pod_resources_socket,
        "); no HCA is offered until it is, since a container may hold the other mode's IDs");
    if (!pods_pending_logged_) Log()->info("withholding every HCA: {}", pods.pending_reason);
  } else if (pods_pending_logged_) {
    Log()->info("pod-resources: the kubelet's pod list is known");
  }
  pods_pending_logged_ = pending;
  bool changed = false;
  for (const auto& r : resources_) changed = r->Recompute(view_, pods) || changed;
  return changed;
}

void NodeState::Notify() {
  absl::ReaderMutexLock lock(&listeners_mu_);
  for (const auto& [id, listener] : listeners_) listener();
}

int NodeState::AddListener(std::function<void()> listener) {
  absl::MutexLock lock(&listeners_mu_);
  const int id = next_listener_++;
  listeners_[id] = std::move(listener);
  return id;
}

void NodeState::RemoveListener(int id) {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.erase(id);
}

void NodeState::SetRescanRequest(std::function<void()> request) {
  core_.SetRescanRequest(std::move(request));
}

topology::TopologyPtr NodeState::topology() const {
  absl::MutexLock lock(&mu_);
  return view_->topology;
}

std::optional<GpuSelection> NodeState::GpuContext(const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  if (!pods_known_ || !view_ || view_->topology->gpus().empty()) return std::nullopt;
  return GpuContextFor(pods_, gpu_first_seen_, sources_.now(), config_, resource, gpu_ids_,
                       *view_->topology);
}

void NodeState::WriteMetrics(metrics::Exposition& out) const {
  std::vector<std::pair<std::string, const PluginMetrics*>> by_resource;
  for (const auto& r : resources_) by_resource.emplace_back(r->name(), &r->metrics());
  WritePluginMetrics(by_resource, out);
  metrics::WriteCounter(out, "pod_resources_errors_total",
                        "Calls to the kubelet's pod-resources List that failed.",
                        pod_resources_errors_);
  metrics::NodeMetricsInput door;
  door.mode = config_.mode;
  for (const auto& r : resources_) {
    for (const std::string& pci : r->Withheld()) door.withheld.insert(pci);
  }
  {
    absl::MutexLock lock(&mu_);
    door.pods_known = pods_known_;
    if (pods_known_) {
      for (const ContainerDevices& c : pods_) {
        for (const auto& r : resources_) {
          auto it = c.devices.find(r->name());
          if (it != c.devices.end() && !it->second.empty()) {
            door.holders.push_back({c.key, r->name(), it->second});
          }
        }
      }
    }
  }
  core_.WriteMetrics(out, std::move(door));
}

}  // namespace rdp::deviceplugin
