#include "node/node.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "hca/scan_change.h"
#include "serving/atomic_file.h"

namespace rdp::node {
namespace {

// Sysfs alone takes milliseconds, hwloc's PCI tree tens to hundreds.
constexpr double kDiscoveryBounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                       0.25,  0.5,   1,    2.5,   5,    10};

std::string Describe(const topology::Hca& hca) {
  return absl::StrCat(hca.name, " (PCI=", hca.place.pci, ")");
}

// Each port whose state differs from the snapshot's, one line each (the HCA's own verdict is
// logged with the rest of its state).
void LogPortChanges(spdlog::logger& log, const topology::Topology& before,
                    const std::vector<topology::Hca>& now) {
  for (const topology::Hca& h : now) {
    const int idx = before.HcaIndex(h.place.pci);
    if (idx < 0) continue;
    const std::vector<topology::Port>& old_ports = before.hcas()[idx].ports;
    for (const topology::Port& port : h.ports) {
      auto was = std::find_if(old_ports.begin(), old_ports.end(),
                              [&port](const topology::Port& p) { return p.number == port.number; });
      // A port whose state was not known (an HCA whose RDMA driver was away) is no change.
      if (was != old_ports.end() && !was->state.empty() && was->state != port.state) {
        log.info("HCA {} port {} is now {} (was {})", Describe(h), port.number,
                 port.state.empty() ? "in an unknown state" : port.state,
                 was->state.empty() ? "unknown" : was->state);
      }
    }
  }
}

// The reason of an HCA whose RDMA driver is away.
constexpr char kDriverAway[] =
    "its RDMA driver is not bound (the PCI function stays: a driver reload?)";

// "mlx5_0 (PCI=0000:1a:00.0), mlx5_1 (PCI=...)" for the HCAs of `view` at `pcis`.
std::string Names(const View& view, const std::set<std::string>& pcis) {
  std::vector<std::string> out;
  for (const std::string& pci : pcis) {
    auto it = view.hcas.find(pci);
    out.push_back(absl::StrCat(it == view.hcas.end() ? "?" : it->second.name, " (PCI=", pci, ")"));
  }
  return absl::StrJoin(out, ", ");
}

// `fresh` (a discovery, which knows no HCA whose RDMA device is gone) with the HCAs of
// `effective` at `away` added back as `effective` has them (their last placement).
topology::TopologyPtr KeepAway(const topology::TopologyPtr& fresh,
                               const std::vector<topology::Hca>& effective,
                               const std::set<std::string>& away) {
  if (away.empty()) return fresh;
  std::vector<topology::Hca> hcas = fresh->hcas();
  for (const topology::Hca& h : effective) {
    if (away.count(h.place.pci) && fresh->HcaIndex(h.place.pci) < 0) hcas.push_back(h);
  }
  std::sort(hcas.begin(), hcas.end(), [](const topology::Hca& a, const topology::Hca& b) {
    return a.place.pci < b.place.pci;
  });
  return std::make_shared<const topology::Topology>(
      topology::Topology::WithNumaNodes(fresh->all_numa_nodes(), std::move(hcas), fresh->gpus()));
}

}  // namespace

Sources DefaultSources(const topology::DiscoveryOptions& options, std::shared_ptr<Env> env) {
  Sources sources;
  sources.env = env;
  auto discoverer = std::make_shared<topology::Discoverer>(options, env);
  sources.discover = [discoverer] { return discoverer->Discover(); };
  // With only an XML there is no sysfs to poll: health stays what the XML says.
  if (!options.sysfs_root.empty() || options.topology_xml.empty()) {
    sources.scan = [env] { return topology::ReadSysfsHcas(*env); };
  }
  return sources;
}

hca::Verdict View::Verdict(const topology::Hca& hca) const {
  if (!scan_error.empty()) {
    return {false, absl::StrCat("the health scan failed: ", scan_error), {}};
  }
  if (driver_away.count(hca.place.pci)) return {false, kDriverAway, {}};
  return hca::AssessWithHistory(hca, flagged);
}

ViewPtr View::Of(topology::TopologyPtr topology, hca::FlaggedHcas flagged) {
  auto view = std::make_shared<View>();
  view->flagged = std::move(flagged);
  for (const topology::Hca& h : topology->hcas()) {
    hca::Verdict verdict = hca::AssessWithHistory(h, view->flagged);
    view->hcas[h.place.pci] = {h.place.pci, h.name, h.place.numa, true, verdict.usable, 0,
                               std::move(verdict.reason)};
  }
  view->topology = std::move(topology);
  return view;
}

Node::Node(Options options, Sources sources)
    : options_(std::move(options)),
      sources_(std::move(sources)),
      log_(Logger(options_.logger)),
      early_warning_(options_.early_warning, options_.logger),
      port_counters_(metrics::PortCounterCache::Options{absl::Seconds(1), absl::Milliseconds(500),
                                                        sources_.now}),
      discovery_(kDiscoveryBounds, std::size(kDiscoveryBounds)) {}

absl::StatusOr<topology::TopologyPtr> Node::Discover() {
  const absl::Time start = absl::Now();
  absl::StatusOr<topology::TopologyPtr> found = sources_.discover();
  discovery_.Observe(absl::Now() - start);
  return found;
}

absl::Status Node::Init() {
  {
    absl::MutexLock poll(&poll_mu_);
    absl::StatusOr<topology::TopologyPtr> found = Discover();
    if (!found.ok()) return found.status();
    Publish(std::const_pointer_cast<View>(View::Of(*found)));
  }
  Notify();
  return absl::OkStatus();
}

ViewPtr Node::Now() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

void Node::Publish(std::shared_ptr<View> view) {
  absl::MutexLock lock(&mu_);
  view->version = view_ ? view_->version + 1 : 1;
  view_ = std::move(view);
}

void Node::Notify() {
  absl::ReaderMutexLock lock(&listeners_mu_);
  for (const auto& [id, listener] : listeners_) listener();
}

bool Node::ScanFailed(const absl::Status& status) {
  if (!scan_failing_) {
    log_->warn("health scan failed, every HCA is listed Unhealthy (none forgotten) until a scan "
               "succeeds: {}",
               status.ToString());
  }
  scan_failing_ = true;
  const ViewPtr now = Now();
  auto next = std::make_shared<View>(*now);
  next->scan_error = std::string(status.message());
  if (next->scan_error.empty()) next->scan_error = status.ToString();
  for (auto& [pci, a] : next->hcas) {
    a.healthy = false;
    a.reason = absl::StrCat("the health scan failed: ", next->scan_error);
  }
  bool changed = now->scan_error != next->scan_error;
  for (const auto& [pci, a] : now->hcas) changed = changed || a.healthy;
  if (!changed) return false;
  Publish(std::move(next));
  return true;
}

bool Node::Poll(const std::optional<std::set<std::string>>& held) {
  bool changed = false;
  {
    absl::MutexLock poll(&poll_mu_);
    changed = PollLocked(held);
  }
  if (changed) Notify();
  return changed;
}

bool Node::PollLocked(const std::optional<std::set<std::string>>& held) {
  if (!sources_.scan) return false;
  absl::StatusOr<std::vector<topology::Hca>> scan = sources_.scan();
  if (!scan.ok()) return ScanFailed(scan.status());
  if (scan_failing_) log_->info("health scan succeeds again");
  scan_failing_ = false;
  const ViewPtr now = Now();
  const topology::TopologyPtr& current = now->topology;
  LogPortChanges(*log_, *current, *scan);
  const bool flags_changed = early_warning_.Poll(*scan, *sources_.env, sources_.now());
  // The scan, and an entry for each HCA whose RDMA driver is away: the same PCI functions.
  std::set<std::string> away;
  const std::vector<topology::Hca> scanned = WithDriverAway(*current, *std::move(scan), away);

  topology::TopologyPtr fresh = current;
  const hca::ScanChange change = hca::CompareScan(current->hcas(), scanned);
  if (change == hca::ScanChange::kFunctions || discovery_pending_) {
    // PCI functions came or went (a hotplug), or the last try failed: only a discovery places
    // them.
    rediscoveries_.Add();
    absl::StatusOr<topology::TopologyPtr> found = Discover();
    if (found.ok()) {
      if (discovery_pending_) log_->info("re-discovery succeeds again");
      discovery_pending_ = false;
      fresh = KeepAway(*found, scanned, away);
    } else {
      if (!discovery_pending_) {
        log_->warn("re-discovery failed, using the sysfs scan placed as last discovered; "
                   "discovering again at every poll until it succeeds: {}",
                   found.status().ToString());
      }
      discovery_pending_ = true;
      fresh = topology::WithScannedHcas(*current, scanned);
    }
  } else if (change == hca::ScanChange::kState) {
    // The same PCI functions in another state (a flapping link, a device node): patched into the
    // snapshot, no discovery.
    state_changes_.Add();
    fresh = hca::WithScannedState(*current, scanned);
  }

  auto next = std::make_shared<View>();
  next->topology = fresh;
  next->flagged = early_warning_.Flagged();
  next->driver_away = away;
  std::set<std::string> present;
  for (const topology::Hca& h : scanned) {
    present.insert(h.place.pci);
    auto was = now->hcas.find(h.place.pci);
    hca::Verdict verdict = next->Verdict(h);
    // The driver going or coming back is one line for the node (NoteDriver).
    const bool driver_moved = away.count(h.place.pci) != now->driver_away.count(h.place.pci);
    if (was == now->hcas.end()) {
      log_->info("HCA added: {}", Describe(h));
    } else if (!was->second.present) {
      log_->info("HCA returned: {}", Describe(h));
    } else if (was->second.healthy != verdict.usable && !driver_moved) {
      log_->info("HCA {} is now {}", Describe(h),
                 verdict.usable ? "healthy" : "unhealthy: " + verdict.reason);
    }
    const int idx = fresh->HcaIndex(h.place.pci);
    std::optional<int> numa = idx >= 0 ? fresh->hcas()[idx].place.numa : h.place.numa;
    // An HCA unplugged while it was being scanned is read without its numa_node: keep the last
    // known one (a device plugin lists NUMA for every device or for none).
    if (!numa && was != now->hcas.end()) numa = was->second.numa;
    next->hcas[h.place.pci] = {h.place.pci, h.name, numa, true, verdict.usable, 0,
                               std::move(verdict.reason)};
  }
  for (const auto& [pci, a] : now->hcas) {
    if (present.count(pci)) continue;
    if (a.present) {
      log_->warn("HCA vanished: {} (PCI={}); listed Unhealthy until it returns", a.name, pci);
    }
    hca::AdvertisedHca gone = a;
    gone.present = false;
    gone.healthy = false;
    gone.reason = "it is gone from the node";
    ++gone.absent_polls;
    // A card removed for good must not stay listed for ever; one someone holds stays, so that
    // its holder's bookkeeping keeps the device. Without `held` nobody can tell.
    if (gone.absent_polls >= options_.forget_after_polls && held && held->count(pci) == 0) {
      log_->info("HCA forgotten: {} (PCI={}) was absent for {} polls and nothing holds it; no "
                 "longer listed",
                 gone.name, pci, gone.absent_polls);
      continue;
    }
    next->hcas[pci] = std::move(gone);
  }
  const bool changed = fresh != current || flags_changed || !now->scan_error.empty() ||
                       next->hcas != now->hcas || next->driver_away != now->driver_away;
  if (!changed) return false;
  NoteDriver(*now, *next);
  Publish(std::move(next));
  return true;
}

std::vector<topology::Hca> Node::WithDriverAway(const topology::Topology& current,
                                                std::vector<topology::Hca> scanned,
                                                std::set<std::string>& away) const {
  std::set<std::string> seen;
  for (const topology::Hca& h : scanned) seen.insert(h.place.pci);
  for (const topology::Hca& h : current.hcas()) {
    if (seen.count(h.place.pci) ||
        !sources_.env->Exists(absl::StrCat("/sys/bus/pci/devices/", h.place.pci))) {
      continue;
    }
    topology::Hca left = h;  // its name and placement; nothing of the RDMA device
    left.uverbs.clear();
    left.umad.clear();
    left.issm.clear();
    left.char_devices.clear();
    for (topology::Port& port : left.ports) {
      port.state.clear();
      port.phys_state.clear();
    }
    away.insert(h.place.pci);
    scanned.push_back(std::move(left));
  }
  return scanned;
}

void Node::NoteDriver(const View& before, const View& now) {
  if (before.driver_away.empty() && !now.driver_away.empty()) {
    driver_away_since_ = sources_.now();
    log_->warn("RDMA driver gone from {} HCA(s): {}; their PCI functions stay, so each is "
               "listed Unhealthy under the same ID until the driver is back",
               now.driver_away.size(), Names(before, now.driver_away));
    return;
  }
  if (before.driver_away.empty() || !now.driver_away.empty()) return;
  std::vector<std::string> back;
  for (const std::string& pci : before.driver_away) {
    auto was = before.hcas.find(pci);
    auto is = now.hcas.find(pci);
    if (is == now.hcas.end() || !is->second.present) continue;  // its PCI function went too
    const std::string old_name = was == before.hcas.end() ? "?" : was->second.name;
    back.push_back(old_name == is->second.name
                       ? absl::StrCat(old_name, " (PCI=", pci, ")")
                       : absl::StrCat(old_name, " -> ", is->second.name, " (PCI=", pci, ")"));
  }
  if (back.empty()) return;
  driver_reloads_.Add();
  log_->info("RDMA driver back on {} HCA(s) after {}: {}", back.size(),
             absl::FormatDuration(sources_.now() - driver_away_since_), absl::StrJoin(back, ", "));
}

ViewPtr Node::Rediscover() {
  ViewPtr view;
  {
    absl::MutexLock poll(&poll_mu_);
    view = RediscoverLocked();
  }
  if (view) Notify();
  return view;
}

ViewPtr Node::RediscoverLocked() {
  const absl::Time at = sources_.now();
  if (at - last_rediscovery_ < options_.rediscover_interval) return nullptr;
  last_rediscovery_ = at;
  rediscoveries_.Add();
  absl::StatusOr<topology::TopologyPtr> found = Discover();
  if (!found.ok()) {
    log_->warn("discovering the node again failed: {}", found.status().ToString());
    return nullptr;
  }
  const ViewPtr now = Now();
  auto next = std::make_shared<View>(*now);
  next->topology = KeepAway(*found, now->topology->hcas(), now->driver_away);
  for (const topology::Hca& h : next->topology->hcas()) {
    hca::Verdict verdict = next->Verdict(h);
    auto was = now->hcas.find(h.place.pci);
    if (was == now->hcas.end()) log_->info("HCA added: {}", Describe(h));
    next->hcas[h.place.pci] = {h.place.pci, h.name, h.place.numa, true, verdict.usable, 0,
                               std::move(verdict.reason)};
  }
  Publish(next);
  return next;
}

hca::NodesNow Node::CheckNow(const std::vector<const topology::Hca*>& hcas) const {
  hca::NodesNow checked = hca::CheckedNow(hcas, *sources_.env);
  bool stale = false;
  for (const hca::HcaNow& now : checked.hcas) {
    stale = stale || (!hca::Assess(now).usable && hca::HcaUsable(*now.hca));
  }
  if (stale) {
    std::function<void()> request;
    {
      absl::MutexLock lock(&mu_);
      request = rescan_request_;
    }
    if (request) request();
  }
  return checked;
}

Grant Node::GrantFor(std::vector<hca::HcaNow> hcas, bool with_rdma_cm,
                     const std::map<std::string, std::string>& paired_gpu) const {
  Grant out;
  out.allocation =
      hca::BuildAllocation(std::move(hcas), with_rdma_cm, paired_gpu, options_.allocation_dir);
  if (options_.allocation_dir.empty()) return out;
  const std::string path =
      absl::StrCat(options_.allocation_dir, "/", out.allocation.file_name);
  if (absl::Status written = serving::WriteFileUnlessThere(path, out.allocation.file, 0644);
      !written.ok()) {
    log_->error("{}: the container gets no {}", std::string(written.message()),
                hca::kAllocationFile);
    return out;
  }
  out.file_mount = path;
  return out;
}

int Node::AddListener(std::function<void()> listener) {
  absl::MutexLock lock(&listeners_mu_);
  const int id = next_listener_++;
  listeners_[id] = std::move(listener);
  return id;
}

void Node::RemoveListener(int id) {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.erase(id);
}

void Node::SetRescanRequest(std::function<void()> request) {
  absl::MutexLock lock(&mu_);
  rescan_request_ = std::move(request);
}

void Node::WriteMetrics(metrics::Exposition& out, metrics::NodeMetricsInput door) const {
  using metrics::Name;
  using metrics::WriteCounter;
  WriteCounter(out, "rediscoveries_total",
               "Full discoveries of the node after the first one: the health scan found the set "
               "of HCAs (PCI functions) changed (hotplug).",
               rediscoveries_);
  WriteCounter(out, "hca_state_changes_total",
               "Health scans that found the same HCAs in another state (a port going DOWN or "
               "ACTIVE, a device node, a name), patched into the snapshot without a discovery.",
               state_changes_);
  WriteCounter(out, "driver_reloads_total",
               "RDMA driver reloads: the node's RDMA devices gone while their PCI functions stayed, "
               "then back (counted when they are back).",
               driver_reloads_);
  out.Family(Name("discovery_duration_seconds"),
             "Duration of each full discovery of the node (sysfs and the PCI tree).",
             metrics::Exposition::Type::kHistogram);
  out.HistogramSamples({}, discovery_.Read());
  const ViewPtr view = Now();
  door.topology = view->topology;
  door.hcas.clear();
  for (const auto& [pci, a] : view->hcas) door.hcas.push_back(a);
  door.early_warning = view->flagged;
  metrics::WriteNodeMetrics(door, *sources_.env, port_counters_, out);
}

}  // namespace rdp::node
