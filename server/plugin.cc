#include "server/plugin.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "topology/discovery.h"
#include "topology/log.h"

namespace rdp::server {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("server"); }

// What must match between a scan and the snapshot for the snapshot to stay current.
std::string Fingerprint(const std::vector<topology::Hca>& hcas) {
  std::vector<std::string> parts;
  for (const topology::Hca& h : hcas) {
    std::string p = absl::StrCat(h.place.pci, "|", h.name, "|", h.uverbs);
    for (const auto& [path, present] : h.char_devices) absl::StrAppend(&p, "|", path, present);
    for (const auto& port : h.ports) absl::StrAppend(&p, "|", port.number, port.state);
    parts.push_back(std::move(p));
  }
  std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, ";");
}

absl::Status Invalid(const std::string& what, const std::string& id) {
  return absl::InvalidArgumentError(absl::StrCat(what, " '", id, "'"));
}

}  // namespace

PluginDeps DefaultDeps(const Config& config) {
  PluginDeps deps;
  const topology::DiscoveryOptions options = config.discovery;
  deps.discover = [options] { return topology::Discover(options); };
  // With only an XML there is no sysfs to poll: health stays what the XML says.
  if (!options.sysfs_root.empty() || options.topology_xml.empty()) {
    const std::string sysfs = options.sysfs_root.empty() ? "/" : options.sysfs_root;
    const std::string dev = options.dev_root;
    deps.scan = [sysfs, dev] { return topology::ReadSysfsHcas(sysfs, dev); };
  }
  std::error_code ec;
  if (!config.pod_resources_socket.empty() &&
      std::filesystem::exists(config.pod_resources_socket, ec)) {
    deps.pod_resources = NewGrpcPodResources(config.pod_resources_socket);
  } else {
    Log()->info("pod-resources socket {} not found: mode-switch withholding and GPU context off",
                config.pod_resources_socket);
  }
  return deps;
}

Plugin::Plugin(Config config, PluginDeps deps)
    : config_(std::move(config)), deps_(std::move(deps)) {}

absl::Status Plugin::Init() {
  if (!config_.exclusive_label.empty()) {
    Log()->info("node {} has exclusive label, enabling exclusive mode", config_.node_name);
  }
  if (config_.mode == Mode::kExclusive) {
    Log()->info("hca-exclusive mode");
  } else {
    Log()->info("hca-shared mode: {} {} devices, every pod sees every HCA",
                config_.shared_devices, config_.resource_name);
  }
  absl::StatusOr<topology::TopologyPtr> snapshot = deps_.discover();
  if (!snapshot.ok()) return snapshot.status();
  RefreshPods(config_.pod_resources_timeout);
  absl::MutexLock lock(&mu_);
  SwapSnapshot(*snapshot);
  for (const topology::Hca& h : snapshot_->hcas()) {
    known_[h.place.pci] = {h.place.pci, h.name, h.place.numa, true, HcaUsable(h)};
  }
  Recompute();
  version_ = std::max<std::uint64_t>(version_, 1);
  return absl::OkStatus();
}

void Plugin::SwapSnapshot(topology::TopologyPtr snapshot) {
  snapshot_ = std::move(snapshot);
  allocator_ = std::make_shared<const allocator::ExclusiveAllocator>(snapshot_);
}

bool Plugin::Poll() {
  topology::TopologyPtr current = topology();
  std::vector<topology::Hca> scanned = current->hcas();
  bool scanned_ok = false;
  if (deps_.scan) {
    absl::StatusOr<std::vector<topology::Hca>> scan = deps_.scan();
    if (scan.ok()) {
      scanned = std::move(*scan);
      scanned_ok = true;
      scan_failing_ = false;
    } else {
      if (!scan_failing_) {
        Log()->warn("health scan failed, every HCA counts as absent: {}",
                    scan.status().ToString());
      }
      scan_failing_ = true;
      scanned.clear();
    }
  }
  topology::TopologyPtr fresh;
  if (scanned_ok && Fingerprint(scanned) != Fingerprint(current->hcas())) {
    absl::StatusOr<topology::TopologyPtr> found = deps_.discover();
    if (found.ok()) {
      fresh = *found;
    } else {
      Log()->warn("re-discovery failed, using the sysfs scan alone: {}",
                  found.status().ToString());
      fresh = std::make_shared<const topology::Topology>(current->numa_nodes(), scanned,
                                                         current->gpus());
    }
  }
  RefreshPods(config_.pod_resources_timeout);

  absl::MutexLock lock(&mu_);
  if (fresh) SwapSnapshot(fresh);
  std::set<std::string> present;
  for (const topology::Hca& h : scanned) {
    present.insert(h.place.pci);
    HcaHealth& k = known_[h.place.pci];
    const bool healthy = HcaUsable(h);
    if (k.pci.empty()) {
      Log()->info("HCA added: {} (PCI={})", h.name, h.place.pci);
    } else if (!k.present) {
      Log()->info("HCA returned: {} (PCI={})", h.name, h.place.pci);
    } else if (k.healthy != healthy) {
      Log()->info("HCA {} (PCI={}) is now {}", h.name, h.place.pci,
                  healthy ? "healthy" : "unhealthy (a port is not ACTIVE or a device node is "
                                        "missing)");
    }
    const int idx = snapshot_->HcaIndex(h.place.pci);
    std::optional<int> numa = idx >= 0 ? snapshot_->hcas()[idx].place.numa : h.place.numa;
    // An HCA unplugged while it was being scanned is listed without its numa_node; keep the last
    // known one, or every device would lose its TopologyInfo (all or none).
    if (!numa) numa = k.numa;
    k = {h.place.pci, h.name, numa, true, healthy};
  }
  for (auto& [pci, k] : known_) {
    if (k.present && present.count(pci) == 0) {
      Log()->warn("HCA vanished: {} (PCI={}); listed Unhealthy until it returns", k.name, pci);
      k.present = false;
      k.healthy = false;
    }
  }
  return Recompute();
}

bool Plugin::RefreshPods(absl::Duration timeout) {
  if (!deps_.pod_resources) return false;
  bool expected = false;
  if (!refreshing_pods_.compare_exchange_strong(expected, true)) return false;
  absl::StatusOr<PodList> pods = deps_.pod_resources->List(timeout);
  std::map<std::string, std::string> gpu_ids;
  if (pods.ok()) gpu_ids = ReadNvidiaGpuIds(config_.proc_root);
  {
    absl::MutexLock lock(&mu_);
    if (pods.ok()) {
      pods_ = std::move(*pods);
      pods_known_ = true;
      gpu_ids_ = std::move(gpu_ids);
      UpdateFirstSeen(pods_, config_.gpu_resources, deps_.now(), &gpu_first_seen_);
      if (snapshot_) Recompute();
    } else {
      Log()->debug("pod-resources refresh failed, using the cached list: {}",
                   pods.status().ToString());
    }
  }
  refreshing_pods_ = false;
  return pods.ok();
}

bool Plugin::Recompute() {
  Withholding w;
  if (pods_known_) w = ComputeWithheld(pods_, config_.resource_name, config_.mode, *snapshot_);
  // A change of the withheld set counts as a change even when the list looks the same (shared
  // mode): Allocate's answer changes with it.
  const bool withholding_changed = w.pcis != withheld_;
  if (withholding_changed) {
    for (const std::string& reason : w.reasons) Log()->warn("mode switch: {}", reason);
    if (w.pcis.empty()) Log()->info("mode switch: no HCA is withheld any more");
    withheld_ = w.pcis;
  }
  std::vector<HcaHealth> hcas;
  for (const auto& [pci, k] : known_) hcas.push_back(k);
  std::vector<DeviceState> devices = config_.mode == Mode::kExclusive
                                         ? ExclusiveDevices(hcas, withheld_)
                                         : SharedDevices(config_.shared_devices, hcas, withheld_);
  if (devices == devices_ && !withholding_changed) return false;
  devices_ = std::move(devices);
  ++version_;
  changed_.SignalAll();
  return true;
}

Plugin::DeviceList Plugin::Devices() const {
  absl::MutexLock lock(&mu_);
  return {version_, devices_};
}

Plugin::DeviceList Plugin::WaitForChange(std::uint64_t seen, absl::Time deadline,
                                         const std::atomic<bool>& stop) const {
  absl::MutexLock lock(&mu_);
  while (version_ == seen && !stop.load() && absl::Now() < deadline) {
    changed_.WaitWithDeadline(&mu_, deadline);
  }
  return {version_, devices_};
}

void Plugin::WakeAll() const {
  absl::MutexLock lock(&mu_);
  changed_.SignalAll();
}

topology::TopologyPtr Plugin::topology() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

absl::StatusOr<ContainerAllocation> Plugin::Allocate(const std::vector<std::string>& ids) const {
  if (ids.empty()) return absl::InvalidArgumentError("empty container request: no device IDs");
  std::set<std::string> seen;
  for (const std::string& id : ids) {
    if (!seen.insert(id).second) return Invalid("duplicate device ID", id);
  }
  topology::TopologyPtr snapshot;
  std::set<std::string> withheld;
  std::set<std::string> known;
  {
    absl::MutexLock lock(&mu_);
    snapshot = snapshot_;
    withheld = withheld_;
    for (const auto& [pci, k] : known_) known.insert(pci);
  }
  std::vector<const topology::Hca*> hcas;
  if (config_.mode == Mode::kExclusive) {
    for (const std::string& id : ids) {
      const int idx = snapshot->HcaIndex(id);
      if (idx < 0) {
        return Invalid(known.count(id) ? "device is not present on this node:" : "unknown device ID",
                       id);
      }
      hcas.push_back(&snapshot->hcas()[idx]);
    }
  } else {
    for (const std::string& id : ids) {
      if (!IsSharedId(id, config_.shared_devices)) return Invalid("unknown device ID", id);
    }
    for (const topology::Hca& h : snapshot->hcas()) {
      if (withheld.count(h.place.pci) == 0) hcas.push_back(&h);
    }
    if (hcas.empty()) return absl::FailedPreconditionError("no HCA can be shared on this node");
  }
  std::error_code ec;
  const bool rdma_cm = std::filesystem::exists(
      std::filesystem::path(config_.discovery.dev_root) / "dev/infiniband/rdma_cm", ec);
  return BuildAllocation(hcas, rdma_cm);
}

absl::StatusOr<std::vector<std::string>> Plugin::Prefer(
    const std::vector<std::string>& available, const std::vector<std::string>& must_include,
    int size) {
  allocator::Request request{available, must_include, size, {}};
  if (config_.mode == Mode::kShared) {
    for (const auto* list : {&available, &must_include}) {
      for (const std::string& id : *list) {
        if (!IsSharedId(id, config_.shared_devices)) return Invalid("unknown device ID", id);
      }
    }
    return allocator::PreferShared(request);
  }
  RefreshPods(config_.pod_resources_timeout);
  std::shared_ptr<const allocator::ExclusiveAllocator> alloc;
  {
    absl::MutexLock lock(&mu_);
    alloc = allocator_;
    if (pods_known_) {
      GpuSelection sel = GpuContextFor(pods_, gpu_first_seen_, deps_.now(), config_, gpu_ids_,
                                       *snapshot_);
      Log()->debug("GPU context: {} candidate container(s), chosen '{}', GPUs [{}], {} free GPUs",
                   sel.candidates, sel.container, absl::StrJoin(sel.context.container_gpus, ","),
                   sel.context.free_gpus.size());
      request.gpus = std::move(sel.context);
    }
  }
  return alloc->Prefer(request);
}

}  // namespace rdp::server
