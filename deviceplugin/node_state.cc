#include "deviceplugin/node_state.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "deviceplugin/gpu_context.h"
#include "deviceplugin/nvidia_gpus.h"
#include "deviceplugin/withholding.h"
#include "topology/discovery.h"
#include "base/log.h"

namespace rdp::deviceplugin {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("server"); }

absl::Status Invalid(const std::string& what, const std::string& id) {
  return absl::InvalidArgumentError(absl::StrCat(what, " '", id, "'"));
}

std::string Describe(const topology::Hca& hca) {
  return absl::StrCat(hca.name, " (PCI=", hca.place.pci, ")");
}

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

NodeState::NodeState(Config config, NodeSources sources)
    : config_(std::move(config)),
      sources_(std::move(sources)),
      core_(CoreOptions(config_), CoreSources(sources_, config_)),
      pod_refresh_([this](std::function<void()> finished) { StartList(std::move(finished)); }) {}

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
  if (config_.mode == hca::Mode::kExclusive) {
    Log()->info("hca-exclusive mode");
  } else {
    Log()->info("hca-shared mode: {} {} devices, every pod sees every HCA",
                config_.shared_devices, config_.resource_name);
  }
  if (absl::Status s = core_.Init(); !s.ok()) return s;
  std::map<std::string, std::string> gpu_ids =
      ReadNvidiaGpuIds(core_.env(), config_.nvidia_gpu_list);
  {
    absl::MutexLock lock(&mu_);
    gpu_ids_ = std::move(gpu_ids);
    Recompute();
    version_ = std::max<std::uint64_t>(version_, 1);
  }
  Notify();
  return absl::OkStatus();
}

std::optional<std::set<std::string>> NodeState::HeldNow() const {
  // Without the pod list nobody can tell who holds what: nothing is forgotten.
  absl::MutexLock lock(&mu_);
  if (!sources_.pod_resources || !pods_known_) return std::nullopt;
  std::set<std::string> held;
  for (const std::string& id : HeldIds(pods_, config_.resource_name)) {
    if (auto pci = topology::NormalizePci(id)) held.insert(*pci);
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

void NodeState::KeepPreferred(std::optional<std::vector<std::string>> answer) {
  if (answer) std::sort(answer->begin(), answer->end());
  absl::MutexLock lock(&mu_);
  preferred_ = std::move(answer);
}

bool NodeState::TakePreferred(std::vector<std::string> ids) {
  std::sort(ids.begin(), ids.end());
  absl::MutexLock lock(&mu_);
  const bool same = preferred_ && *preferred_ == ids;
  preferred_.reset();
  return same;
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
  if (!pods.ok()) metrics_.pod_resources_errors.Add();
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
  const node::ViewPtr view = core_.Now();
  if (!allocator_ || view->topology != allocator_->topology()) {
    allocator_ = std::make_shared<const allocator::ExclusiveAllocator>(view->topology);
  }
  view_ = view;
  // Fail closed: while the pod list is not known, nothing says that no container holds the other
  // mode's IDs, so every HCA is withheld.
  const bool pending = sources_.pod_resources && !pods_known_;
  Withholding w;
  if (pending) {
    for (const auto& [pci, a] : view_->hcas) w.pcis.insert(pci);
    w.reasons.push_back(absl::StrCat(
        "the kubelet's pod list is not known yet (pod-resources socket ",
        config_.pod_resources_socket,
        "); no HCA is offered until it is, since a container may hold the other mode's IDs"));
  } else if (pods_known_) {
    w = ComputeWithheld(pods_, config_.resource_name, config_.mode, *view_->topology);
  }
  // The withheld set decides; the reasons only explain it (their wording may change with the
  // order pod-resources lists IDs in, which is no change).
  std::set<std::string> before;
  for (const auto& [pci, reason] : withheld_) before.insert(pci);
  const bool withholding_changed = w.pcis != before || pending != withholding_pending_;
  if (withholding_changed) {
    if (pending) {
      Log()->info("withholding every HCA: {}", w.reasons.front());
    } else {
      if (withholding_pending_) Log()->info("pod-resources: the kubelet's pod list is known");
      for (const std::string& reason : w.reasons) Log()->info("mode switch: {}", reason);
      if (w.pcis.empty() && !before.empty() && !withholding_pending_) {
        Log()->info("mode switch: no HCA is withheld any more");
      }
    }
  }
  withholding_pending_ = pending;
  const std::string why = absl::StrJoin(w.reasons, "; ");
  withheld_.clear();
  for (const std::string& pci : w.pcis) withheld_[pci] = why;
  std::vector<hca::AdvertisedHca> hcas;
  for (const auto& [pci, a] : view_->hcas) hcas.push_back(a);
  std::vector<DeviceState> devices =
      config_.mode == hca::Mode::kExclusive
          ? ExclusiveDevices(hcas, w.pcis)
          : SharedDevices(config_.shared_devices, hcas, w.pcis);
  // A change of the withheld set counts as a change even when the list looks the same (shared
  // mode): Allocate's answer changes with it.
  if (devices == devices_ && !withholding_changed) return false;
  devices_ = std::move(devices);
  ++version_;
  return true;
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

NodeState::DeviceList NodeState::Devices() const {
  absl::MutexLock lock(&mu_);
  return {version_, devices_};
}

topology::TopologyPtr NodeState::topology() const {
  absl::MutexLock lock(&mu_);
  return view_->topology;
}

absl::StatusOr<NodeState::Grant> NodeState::Allocate(
    const std::vector<std::string>& ids) const {
  if (ids.empty()) return absl::InvalidArgumentError("empty container request: no device IDs");
  const bool exclusive = config_.mode == hca::Mode::kExclusive;
  // IDs in their canonical spelling: one HCA written two ways is one HCA, given once.
  std::vector<std::string> canonical;
  std::map<std::string, std::string> spelled;  // canonical -> as given
  for (const std::string& id : ids) {
    std::string c = id;
    if (exclusive) {
      std::optional<std::string> pci = topology::NormalizePci(id);
      if (!pci) return Invalid("unknown device ID", id);
      c = *pci;
    } else if (!IsSharedId(id, config_.shared_devices)) {
      return Invalid("unknown device ID", id);
    }
    auto [it, fresh] = spelled.emplace(c, id);
    if (!fresh) {
      return absl::InvalidArgumentError(
          it->second == id ? absl::StrCat("duplicate device ID '", id, "'")
                           : absl::StrCat("duplicate device ID '", id, "' (also given as '",
                                          it->second, "')"));
    }
    canonical.push_back(std::move(c));
  }
  node::ViewPtr view;
  std::map<std::string, std::string> withheld;
  {
    absl::MutexLock lock(&mu_);
    view = view_;
    if (!withheld_.empty()) withheld = withheld_;  // usually none: no copy, no allocation
  }
  const topology::TopologyPtr& snapshot = view->topology;
  // The HCAs asked for (exclusive) or every HCA (shared), with what makes each one refused.
  std::vector<const topology::Hca*> asked;
  std::vector<std::string> refused;  // shared mode: why each left-out HCA is
  if (exclusive) {
    for (const std::string& pci : canonical) {
      const int idx = snapshot->HcaIndex(pci);
      if (idx < 0) {
        if (view->hcas.count(pci)) {
          return absl::FailedPreconditionError(
              absl::StrCat("HCA ", pci, " is not present on this node any more"));
        }
        return Invalid("unknown device ID", spelled[pci]);
      }
      const topology::Hca& hca = snapshot->hcas()[idx];
      if (auto w = withheld.find(pci); w != withheld.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("HCA ", Describe(hca), " is withheld: ", w->second));
      }
      asked.push_back(&hca);
    }
  } else {
    for (const topology::Hca& hca : snapshot->hcas()) {
      if (auto w = withheld.find(hca.place.pci); w != withheld.end()) {
        refused.push_back(absl::StrCat(hca.name, " is withheld: ", w->second));
        continue;
      }
      asked.push_back(&hca);
    }
  }
  // The HCAs as they are now (their device nodes checked at the call), and rdma_cm.
  hca::NodesNow checked = core_.CheckNow(asked);
  std::vector<hca::HcaNow> chosen;
  chosen.reserve(asked.size());
  for (hca::HcaNow& now : checked.hcas) {
    const topology::Hca* hca = now.hca;
    const hca::Verdict verdict = hca::Assess(now);
    if (verdict.usable) {
      chosen.push_back(std::move(now));
      continue;
    }
    if (exclusive) {
      return absl::FailedPreconditionError(
          absl::StrCat("HCA ", Describe(*hca), " is unhealthy: ", verdict.reason));
    }
    refused.push_back(absl::StrCat(hca->name, ": ", verdict.reason));
  }
  if (!exclusive && chosen.empty()) {
    return absl::FailedPreconditionError(
        refused.empty() ? std::string("no HCA on this node")
                        : absl::StrCat("no HCA can be handed out on this node: ",
                                       absl::StrJoin(refused, "; ")));
  }
  // The container's GPUs, known in exclusive mode when the pod-resources list has them: each HCA
  // is paired with one in the allocation file.
  std::vector<std::string> gpus;
  if (exclusive) gpus = CountAlignment(canonical);
  std::map<std::string, std::string> paired;
  if (!gpus.empty()) {
    std::vector<std::string> pcis;
    pcis.reserve(chosen.size());
    for (const hca::HcaNow& h : chosen) pcis.push_back(h.hca->place.pci);
    paired = hca::PairGpus(*snapshot, std::move(pcis), gpus);
  }
  Grant out = core_.GrantFor(std::move(chosen), checked.rdma_cm, paired);
  for (const std::string& warning : out.allocation.warnings) Log()->warn("Allocate: {}", warning);
  return out;
}

std::vector<std::string> NodeState::CountAlignment(const std::vector<std::string>& pcis) const {
  std::optional<topology::PathClass> alignment;
  std::vector<std::string> gpus;
  {
    absl::MutexLock lock(&mu_);
    if (pods_known_ && !view_->topology->gpus().empty()) {
      GpuSelection sel = GpuContextFor(pods_, gpu_first_seen_, sources_.now(), config_, gpu_ids_,
                                       *view_->topology);
      alignment = AllocationAlignment(*view_->topology, pcis, sel.context.container_gpus);
      gpus = std::move(sel.context.container_gpus);
    }
  }
  metrics_.CountAllocation(alignment);
  return gpus;
}

void NodeState::WriteMetrics(metrics::Exposition& out) const {
  metrics_.Write(out);
  metrics::NodeMetricsInput door;
  door.mode = config_.mode;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [pci, why] : withheld_) door.withheld.insert(pci);
    door.pods_known = pods_known_;
    if (pods_known_) {
      for (const ContainerDevices& c : pods_) {
        auto it = c.devices.find(config_.resource_name);
        if (it != c.devices.end() && !it->second.empty()) {
          door.holders.emplace_back(c.key, it->second);
        }
      }
    }
  }
  core_.WriteMetrics(out, std::move(door));
}

absl::StatusOr<std::vector<std::string>> NodeState::Prefer(
    const std::vector<std::string_view>& available,
    const std::vector<std::string_view>& must_include, int size) const {
  if (config_.mode == hca::Mode::kShared) {
    return allocator::AnswerShared(available, must_include, size,
                                   static_cast<std::uint32_t>(config_.shared_devices));
  }
  std::shared_ptr<const allocator::ExclusiveAllocator> alloc;
  allocator::GpuContext gpus;
  {
    absl::MutexLock lock(&mu_);
    alloc = allocator_;
    if (pods_known_) {
      GpuSelection sel = GpuContextFor(pods_, gpu_first_seen_, sources_.now(), config_, gpu_ids_,
                                       *view_->topology);
      Log()->debug("GPU context: {} candidate container(s), chosen '{}', GPUs [{}], {} free GPUs",
                   sel.candidates, sel.container, absl::StrJoin(sel.context.container_gpus, ","),
                   sel.context.free_gpus.size());
      gpus = std::move(sel.context);
    }
  }
  std::vector<bool> degraded;  // by the allocator's snapshot index
  for (const auto& [pci, flags] : core_.Now()->flagged) {
    if (!flags.degraded) continue;
    if (const int idx = alloc->topology()->HcaIndex(pci); idx >= 0) {
      degraded.resize(alloc->topology()->hcas().size());
      degraded[idx] = true;
    }
  }
  return alloc->Answer(available, must_include, size, gpus, degraded);
}

}  // namespace rdp::deviceplugin
