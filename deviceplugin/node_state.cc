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
#include "hca/scan_change.h"
#include "serving/atomic_file.h"
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

NodeSources WithEnv(NodeSources sources, const Config& config) {
  if (!sources.env) sources.env = NewNodeEnv(config.Roots());
  return sources;
}

// Health per port: each port whose state differs from the snapshot's, one line each (the HCA's
// own verdict is logged with the rest of its state).
void LogPortChanges(const topology::Topology& before, const std::vector<topology::Hca>& now) {
  for (const topology::Hca& h : now) {
    const int idx = before.HcaIndex(h.place.pci);
    if (idx < 0) continue;
    const std::vector<topology::Port>& old_ports = before.hcas()[idx].ports;
    for (const topology::Port& port : h.ports) {
      auto was = std::find_if(old_ports.begin(), old_ports.end(),
                              [&port](const topology::Port& p) { return p.number == port.number; });
      if (was != old_ports.end() && was->state != port.state) {
        Log()->info("HCA {} port {} is now {} (was {})", Describe(h), port.number,
                    port.state.empty() ? "in an unknown state" : port.state,
                    was->state.empty() ? "unknown" : was->state);
      }
    }
  }
}

}  // namespace

NodeSources DefaultSources(const Config& config) {
  NodeSources sources;
  const topology::DiscoveryOptions options = config.discovery;
  std::shared_ptr<Env> env = NewNodeEnv(config.Roots());
  sources.env = env;
  auto discoverer = std::make_shared<topology::Discoverer>(options, env);
  sources.discover = [discoverer] { return discoverer->Discover(); };
  // With only an XML there is no sysfs to poll: health stays what the XML says.
  if (!options.sysfs_root.empty() || options.topology_xml.empty()) {
    sources.scan = [env] { return topology::ReadSysfsHcas(*env); };
  }
  if (!config.pod_resources_socket.empty()) {
    sources.pod_resources = NewGrpcPodResources(config.pod_resources_socket);
  } else {
    Log()->info("no pod-resources socket: mode-switch withholding and GPU context off");
  }
  return sources;
}

NodeState::NodeState(Config config, NodeSources sources)
    : config_(std::move(config)),
      sources_(WithEnv(std::move(sources), config_)),
      port_counters_(metrics::PortCounterCache::Options{absl::Seconds(1), absl::Milliseconds(500),
                                                        sources_.now}),
      early_warning_(config_.early_warning, "server"),
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
  absl::StatusOr<topology::TopologyPtr> snapshot = Discover();
  if (!snapshot.ok()) return snapshot.status();
  std::map<std::string, std::string> gpu_ids =
      ReadNvidiaGpuIds(*sources_.env, config_.nvidia_gpu_list);
  {
    absl::MutexLock lock(&mu_);
    SwapSnapshot(*snapshot);
    gpu_ids_ = std::move(gpu_ids);
    for (const topology::Hca& h : snapshot_->hcas()) {
      advertised_[h.place.pci] = {h.place.pci, h.name, h.place.numa, true, hca::HcaUsable(h), 0};
    }
    Recompute();
    version_ = std::max<std::uint64_t>(version_, 1);
  }
  Notify();
  return absl::OkStatus();
}

absl::StatusOr<topology::TopologyPtr> NodeState::Discover() {
  const absl::Time start = absl::Now();
  absl::StatusOr<topology::TopologyPtr> found = sources_.discover();
  metrics_.discovery.Observe(absl::Now() - start);
  return found;
}

void NodeState::SwapSnapshot(topology::TopologyPtr snapshot) {
  snapshot_ = std::move(snapshot);
  allocator_ = std::make_shared<const allocator::ExclusiveAllocator>(snapshot_);
}

bool NodeState::Poll() {
  topology::TopologyPtr current = topology();
  std::vector<topology::Hca> scanned = current->hcas();
  bool scanned_ok = false;
  if (sources_.scan) {
    absl::StatusOr<std::vector<topology::Hca>> scan = sources_.scan();
    if (scan.ok()) {
      scanned = std::move(*scan);
      scanned_ok = true;
      scan_failing_ = false;
    } else {
      if (!scan_failing_) {
        Log()->warn("health scan failed, every HCA is listed Unhealthy (none forgotten) until a "
                    "scan succeeds: {}",
                    scan.status().ToString());
      }
      scan_failing_ = true;
    }
  }
  if (sources_.scan && !scanned_ok) {
    // A failed scan says nothing about the HCAs (a broken /host/sys mount): the last good state
    // is kept, every HCA Unhealthy, none counted absent or forgotten (issue 25: before, every
    // HCA counted as absent and the unheld ones were forgotten after forget_after_polls polls).
    bool changed = false;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [pci, a] : advertised_) a.healthy = false;
      changed = Recompute();
    }
    if (changed) Notify();
    return changed;
  }
  if (scanned_ok) {
    LogPortChanges(*current, scanned);
    early_warning_.Poll(scanned, *sources_.env, sources_.now());
  }
  const hca::FlaggedHcas flagged = early_warning_.Flagged();
  topology::TopologyPtr fresh;
  const hca::ScanChange change =
      scanned_ok ? hca::CompareScan(current->hcas(), scanned) : hca::ScanChange::kNone;
  if (change == hca::ScanChange::kState) {
    // The same PCI functions in another state (a flapping link, a device node): patched into
    // the snapshot, no discovery (issue 25: each flap ran a full hwloc discovery).
    metrics_.hca_state_changes.Add();
    fresh = hca::WithScannedState(*current, scanned);
  } else if (change == hca::ScanChange::kFunctions) {
    metrics_.rediscoveries.Add();
    absl::StatusOr<topology::TopologyPtr> found = Discover();
    if (found.ok()) {
      fresh = *found;
    } else {
      Log()->warn("re-discovery failed, using the sysfs scan placed as last discovered: {}",
                  found.status().ToString());
      fresh = topology::WithScannedHcas(*current, scanned);
    }
  }
  std::map<std::string, std::string> gpu_ids =
      ReadNvidiaGpuIds(*sources_.env, config_.nvidia_gpu_list);

  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    if (fresh) SwapSnapshot(fresh);
    gpu_ids_ = std::move(gpu_ids);
    std::set<std::string> present;
    for (const topology::Hca& h : scanned) {
      present.insert(h.place.pci);
      hca::AdvertisedHca& a = advertised_[h.place.pci];
      const hca::Verdict verdict = hca::AssessWithHistory(h, flagged);
      if (a.pci.empty()) {
        Log()->info("HCA added: {}", Describe(h));
      } else if (!a.present) {
        Log()->info("HCA returned: {}", Describe(h));
      } else if (a.healthy != verdict.usable) {
        Log()->info("HCA {} is now {}", Describe(h),
                    verdict.usable ? "healthy" : "unhealthy: " + verdict.reason);
      }
      const int idx = snapshot_->HcaIndex(h.place.pci);
      std::optional<int> numa = idx >= 0 ? snapshot_->hcas()[idx].place.numa : h.place.numa;
      // An HCA unplugged while it was being scanned is listed without its numa_node; keep the
      // last known one, or every device would lose its TopologyInfo (all or none).
      if (!numa) numa = a.numa;
      a = {h.place.pci, h.name, numa, true, verdict.usable, 0};
    }
    // HCAs no scan has seen for a while and no container holds are forgotten: a card removed
    // for good must not stay listed Unhealthy forever. An ID someone holds stays listed, so
    // that the kubelet's bookkeeping of that container keeps its device. Without the pod list
    // nobody can tell, and nothing is forgotten.
    std::set<std::string> held;
    if (sources_.pod_resources && pods_known_) {
      for (const std::string& id : HeldIds(pods_, config_.resource_name)) {
        if (auto pci = topology::NormalizePci(id)) held.insert(*pci);
      }
    }
    for (auto it = advertised_.begin(); it != advertised_.end();) {
      hca::AdvertisedHca& a = it->second;
      if (present.count(a.pci) == 0) {
        if (a.present) {
          Log()->warn("HCA vanished: {} (PCI={}); listed Unhealthy until it returns", a.name,
                      a.pci);
        }
        a.present = false;
        a.healthy = false;
        ++a.absent_polls;
        if (a.absent_polls >= config_.forget_after_polls && sources_.pod_resources &&
            pods_known_ && held.count(a.pci) == 0) {
          Log()->info("HCA forgotten: {} (PCI={}) was absent for {} polls and no container "
                      "holds it; no longer listed",
                      a.name, a.pci, a.absent_polls);
          it = advertised_.erase(it);
          continue;
        }
      }
      ++it;
    }
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
    outcome->ok = last_list_ == ListEnd::kOk;
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
  const std::uint64_t epoch = registration_epoch_;
  sources_.pod_resources->List(config_.pod_resources_timeout,
                               [this, finished, epoch](absl::StatusOr<PodList> pods) {
                                 OnPods(std::move(pods));
                                 if (last_list_ == ListEnd::kOk) last_list_epoch_ = epoch;
                                 finished();
                               });
}

void NodeState::OnPods(absl::StatusOr<PodList> pods) {
  last_list_ = pods.ok() ? ListEnd::kOk : ListEnd::kFailed;
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
    if (snapshot_) changed = Recompute();
  }
  if (changed) Notify();
}

bool NodeState::Recompute() {
  // Fail closed: while the pod list is not known, nothing says that no container holds the other
  // mode's IDs, so every HCA is withheld.
  const bool pending = sources_.pod_resources && !pods_known_;
  Withholding w;
  if (pending) {
    for (const auto& [pci, a] : advertised_) w.pcis.insert(pci);
    w.reasons.push_back(absl::StrCat(
        "the kubelet's pod list is not known yet (pod-resources socket ",
        config_.pod_resources_socket,
        "); no HCA is offered until it is, since a container may hold the other mode's IDs"));
  } else if (pods_known_) {
    w = ComputeWithheld(pods_, config_.resource_name, config_.mode, *snapshot_);
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
  for (const auto& [pci, a] : advertised_) hcas.push_back(a);
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
  absl::MutexLock lock(&mu_);
  rescan_request_ = std::move(request);
}

void NodeState::RequestRescan() const {
  std::function<void()> request;
  {
    absl::MutexLock lock(&mu_);
    request = rescan_request_;
  }
  if (request) request();
}

NodeState::DeviceList NodeState::Devices() const {
  absl::MutexLock lock(&mu_);
  return {version_, devices_};
}

topology::TopologyPtr NodeState::topology() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
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
  topology::TopologyPtr snapshot;
  std::map<std::string, std::string> withheld;
  {
    absl::MutexLock lock(&mu_);
    snapshot = snapshot_;
    if (!withheld_.empty()) withheld = withheld_;  // usually none: no copy, no allocation
  }
  // The HCAs asked for (exclusive) or every HCA (shared), with what makes each one refused.
  std::vector<const topology::Hca*> asked;
  std::vector<std::string> refused;  // shared mode: why each left-out HCA is
  if (exclusive) {
    for (const std::string& pci : canonical) {
      const int idx = snapshot->HcaIndex(pci);
      if (idx < 0) {
        absl::MutexLock lock(&mu_);
        if (advertised_.count(pci)) {
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
  hca::NodesNow checked = hca::CheckedNow(asked, *sources_.env);
  std::vector<hca::HcaNow> chosen;
  chosen.reserve(asked.size());
  bool stale = false;  // a node the last scan saw is gone: the health thread should look
  for (hca::HcaNow& now : checked.hcas) {
    const topology::Hca* hca = now.hca;
    const hca::Verdict verdict = hca::Assess(now);
    if (verdict.usable) {
      chosen.push_back(std::move(now));
      continue;
    }
    stale = stale || hca::HcaUsable(*hca);
    if (exclusive) {
      if (stale) RequestRescan();
      return absl::FailedPreconditionError(
          absl::StrCat("HCA ", Describe(*hca), " is unhealthy: ", verdict.reason));
    }
    refused.push_back(absl::StrCat(hca->name, ": ", verdict.reason));
  }
  if (stale) RequestRescan();
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
  Grant out;
  out.allocation = hca::BuildAllocation(std::move(chosen), checked.rdma_cm, paired,
                                        config_.allocation_dir);
  for (const std::string& warning : out.allocation.warnings) Log()->warn("Allocate: {}", warning);
  out.file_mount = AllocationFileMount(out.allocation);
  return out;
}

std::vector<std::string> NodeState::CountAlignment(const std::vector<std::string>& pcis) const {
  std::optional<topology::PathClass> alignment;
  std::vector<std::string> gpus;
  {
    absl::MutexLock lock(&mu_);
    if (pods_known_ && !snapshot_->gpus().empty()) {
      GpuSelection sel = GpuContextFor(pods_, gpu_first_seen_, sources_.now(), config_, gpu_ids_,
                                       *snapshot_);
      alignment = AllocationAlignment(*snapshot_, pcis, sel.context.container_gpus);
      gpus = std::move(sel.context.container_gpus);
    }
  }
  metrics_.CountAllocation(alignment);
  return gpus;
}

std::string NodeState::AllocationFileMount(const hca::ContainerAllocation& allocation) const {
  if (allocation.file_name.empty()) return "";  // no --allocation-dir: no file built
  std::string path = absl::StrCat(config_.allocation_dir, "/", allocation.file_name);
  if (absl::Status written = serving::WriteFileUnlessThere(path, allocation.file, 0644);
      !written.ok()) {
    Log()->error("Allocate: {}: the container gets no {}", std::string(written.message()),
                 hca::kAllocationFile);
    return "";
  }
  return path;
}

metrics::NodeMetricsInput NodeState::MetricsInput() const {
  metrics::NodeMetricsInput in;
  in.mode = config_.mode;
  absl::MutexLock lock(&mu_);
  in.topology = snapshot_;
  in.hcas.reserve(advertised_.size());
  for (const auto& [pci, a] : advertised_) in.hcas.push_back(a);
  for (const auto& [pci, why] : withheld_) in.withheld.insert(pci);
  in.early_warning = early_warning_.Flagged();
  in.pods_known = pods_known_;
  if (pods_known_) {
    for (const ContainerDevices& c : pods_) {
      auto it = c.devices.find(config_.resource_name);
      if (it != c.devices.end() && !it->second.empty()) in.holders.emplace_back(c.key, it->second);
    }
  }
  return in;
}

void NodeState::WriteMetrics(metrics::Exposition& out) const {
  metrics_.Write(out);
  metrics::WriteNodeMetrics(MetricsInput(), *sources_.env, port_counters_, out);
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
                                       *snapshot_);
      Log()->debug("GPU context: {} candidate container(s), chosen '{}', GPUs [{}], {} free GPUs",
                   sel.candidates, sel.container, absl::StrJoin(sel.context.container_gpus, ","),
                   sel.context.free_gpus.size());
      gpus = std::move(sel.context);
    }
  }
  std::vector<bool> degraded;  // by the allocator's snapshot index
  for (const auto& [pci, flags] : early_warning_.Flagged()) {
    if (!flags.degraded) continue;
    if (const int idx = alloc->topology()->HcaIndex(pci); idx >= 0) {
      degraded.resize(alloc->topology()->hcas().size());
      degraded[idx] = true;
    }
  }
  return alloc->Answer(available, must_include, size, gpus, degraded);
}

}  // namespace rdp::deviceplugin
