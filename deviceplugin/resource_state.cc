#include "deviceplugin/resource_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "deviceplugin/node_state.h"
#include "deviceplugin/withholding.h"

namespace rdp::deviceplugin {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("server"); }

absl::Status Invalid(const std::string& what, const std::string& id) {
  return absl::InvalidArgumentError(absl::StrCat(what, " '", id, "'"));
}

std::string Describe(const topology::Hca& hca) {
  return absl::StrCat(hca.name, " (PCI=", hca.place.pci, ")");
}

// The snapshot's HCAs of `members`, with its NUMA nodes and GPUs: what the resource's allocator
// places, so that its answers are aligned within the resource.
topology::TopologyPtr MembersOnly(const topology::Topology& all,
                                  const std::set<std::string>& members) {
  std::vector<topology::Hca> hcas;
  for (const topology::Hca& h : all.hcas()) {
    if (members.count(h.place.pci)) hcas.push_back(h);
  }
  return std::make_shared<const topology::Topology>(
      topology::Topology::WithNumaNodes(all.all_numa_nodes(), std::move(hcas), all.gpus()));
}

}  // namespace

ResourceState::ResourceState(NodeState& node, resources::Resource resource,
                             hca::Mode node_mode, AllocationNaming naming)
    : node_(node),
      resource_(std::move(resource)),
      mode_(resource_.always_shared ? hca::Mode::kShared : node_mode),
      naming_(std::move(naming)) {}

bool ResourceState::Recompute(const node::ViewPtr& view, const Pods& pods) {
  // The members: what the selector takes of the present HCAs, and the members of before that
  // vanished and are still known (listed unhealthy until the node forgets them).
  std::set<std::string> members;
  for (std::size_t i : resources::Select(resource_.selector, view->topology->hcas())) {
    members.insert(view->topology->hcas()[i].place.pci);
  }
  absl::MutexLock lock(&mu_);
  for (const std::string& pci : members_) {
    if (view->topology->HcaIndex(pci) < 0 && view->hcas.count(pci)) members.insert(pci);
  }
  const bool first = !members_known_;
  if (members.empty() && (first || !members_.empty())) {
    Log()->warn("resource {} holds no HCA of this node: its selector takes none; it is "
                "registered with no devices",
                resource_.name);
  } else if (members != members_) {
    Log()->info("resource {}: {} HCA(s): {}", resource_.name, members.size(),
                absl::StrJoin(members, ","));
  }
  const bool members_changed = members != members_;
  members_ = std::move(members);
  members_known_ = true;
  if (!allocator_ || view->topology != view_->topology || members_changed) {
    allocator_ = std::make_shared<const allocator::ExclusiveAllocator>(
        MembersOnly(*view->topology, members_));
  }
  view_ = view;

  Withholding w;
  if (pods.pending) {
    w.pcis = members_;
    w.reasons.push_back(pods.pending_reason);
  } else if (pods.list) {
    w = ComputeWithheld(*pods.list, resource_.name, mode_, *view_->topology);
    // Only the resource's HCAs are withheld from it (in exclusive mode the rule names them all).
    std::set<std::string> ours;
    for (const std::string& pci : w.pcis) {
      if (members_.count(pci)) ours.insert(pci);
    }
    w.pcis = std::move(ours);
  }
  // The withheld set decides; the reasons only explain it (their wording may change with the
  // order pod-resources lists IDs in, which is no change).
  std::set<std::string> before;
  for (const auto& [pci, reason] : withheld_) before.insert(pci);
  const bool withholding_changed = w.pcis != before || pods.pending != withholding_pending_;
  if (withholding_changed && !pods.pending) {
    for (const std::string& reason : w.reasons) Log()->info("mode switch: {}", reason);
    if (w.pcis.empty() && !before.empty() && !withholding_pending_) {
      Log()->info("mode switch: no HCA is withheld any more");
    }
  }
  withholding_pending_ = pods.pending;
  const std::string why = absl::StrJoin(w.reasons, "; ");
  withheld_.clear();
  for (const std::string& pci : w.pcis) withheld_[pci] = why;
  std::vector<hca::AdvertisedHca> hcas;
  for (const auto& [pci, a] : view_->hcas) {
    if (members_.count(pci)) hcas.push_back(a);
  }
  std::vector<DeviceState> devices = mode_ == hca::Mode::kExclusive
                                         ? ExclusiveDevices(hcas, w.pcis)
                                         : SharedDevices(resource_.shared_devices, hcas, w.pcis);
  // A change of the withheld set counts as a change even when the list looks the same (shared
  // mode): Allocate's answer changes with it. The first list always counts: it is the one a
  // stream begins with, empty or not.
  if (!first && devices == devices_ && !withholding_changed) return false;
  devices_ = std::move(devices);
  ++version_;
  return true;
}

ResourceState::DeviceList ResourceState::Devices() const {
  absl::MutexLock lock(&mu_);
  return {version_, devices_};
}

std::set<std::string> ResourceState::Members() const {
  absl::MutexLock lock(&mu_);
  return members_;
}

std::set<std::string> ResourceState::Withheld() const {
  absl::MutexLock lock(&mu_);
  std::set<std::string> out;
  for (const auto& [pci, why] : withheld_) out.insert(pci);
  return out;
}

void ResourceState::KeepPreferred(std::optional<std::vector<std::string>> answer) {
  if (answer) std::sort(answer->begin(), answer->end());
  absl::MutexLock lock(&mu_);
  preferred_ = std::move(answer);
}

bool ResourceState::TakePreferred(std::vector<std::string> ids) {
  std::sort(ids.begin(), ids.end());
  absl::MutexLock lock(&mu_);
  const bool same = preferred_ && *preferred_ == ids;
  preferred_.reset();
  return same;
}

absl::StatusOr<node::Grant> ResourceState::Allocate(const std::vector<std::string>& ids) const {
  if (ids.empty()) return absl::InvalidArgumentError("empty container request: no device IDs");
  const bool exclusive = mode_ == hca::Mode::kExclusive;
  const std::string of = absl::StrCat(" of ", resource_.name);
  // IDs in their canonical spelling: one HCA written two ways is one HCA, given once.
  std::vector<std::string> canonical;
  std::map<std::string, std::string> spelled;  // canonical -> as given
  for (const std::string& id : ids) {
    std::string c = id;
    if (exclusive) {
      std::optional<std::string> pci = topology::NormalizePci(id);
      if (!pci) return Invalid(absl::StrCat("unknown device ID", of), id);
      c = *pci;
    } else if (!IsSharedId(id, resource_.shared_devices)) {
      return Invalid(absl::StrCat("unknown device ID", of), id);
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
  std::set<std::string> members;
  std::map<std::string, std::string> withheld;
  {
    absl::MutexLock lock(&mu_);
    view = view_;
    members = members_;
    if (!withheld_.empty()) withheld = withheld_;  // usually none: no copy, no allocation
  }
  const topology::TopologyPtr& snapshot = view->topology;
  // The HCAs asked for (exclusive) or every HCA of the resource (shared), with what makes each
  // one refused.
  std::vector<const topology::Hca*> asked;
  std::vector<std::string> refused;  // shared mode: why each left-out HCA is
  if (exclusive) {
    for (const std::string& pci : canonical) {
      const int idx = snapshot->HcaIndex(pci);
      const bool member = members.count(pci) > 0;
      if (idx >= 0 && !member) {
        return absl::InvalidArgumentError(
            absl::StrCat("device ID '", spelled[pci], "' is HCA ", Describe(snapshot->hcas()[idx]),
                         ", which is not in resource ", resource_.name));
      }
      if (idx < 0) {
        if (member && view->hcas.count(pci)) {
          return absl::FailedPreconditionError(
              absl::StrCat("HCA ", pci, " is not present on this node any more"));
        }
        return Invalid(absl::StrCat("unknown device ID", of), spelled[pci]);
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
      if (!members.count(hca.place.pci)) continue;
      if (auto w = withheld.find(hca.place.pci); w != withheld.end()) {
        refused.push_back(absl::StrCat(hca.name, " is withheld: ", w->second));
        continue;
      }
      asked.push_back(&hca);
    }
  }
  // The HCAs as they are now (their device nodes checked at the call), and rdma_cm.
  const node::Node& core = node_.core();
  hca::NodesNow checked = core.CheckNow(asked);
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
        refused.empty() ? absl::StrCat("no HCA of ", resource_.name, " on this node")
                        : absl::StrCat("no HCA of ", resource_.name,
                                       " can be handed out on this node: ",
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
  node::Grant out = core.GrantFor(std::move(chosen), checked.rdma_cm, paired);
  for (const std::string& warning : out.allocation.warnings) Log()->warn("Allocate: {}", warning);
  return out;
}

std::vector<std::string> ResourceState::CountAlignment(const std::vector<std::string>& pcis) const {
  std::optional<topology::PathClass> alignment;
  std::vector<std::string> gpus;
  if (std::optional<GpuSelection> sel = node_.GpuContext(resource_.name)) {
    alignment = AllocationAlignment(*node_.topology(), pcis, sel->context.container_gpus);
    gpus = std::move(sel->context.container_gpus);
  }
  metrics_.CountAllocation(alignment);
  return gpus;
}

absl::StatusOr<std::vector<std::string>> ResourceState::Prefer(
    const std::vector<std::string_view>& available,
    const std::vector<std::string_view>& must_include, int size) const {
  if (mode_ == hca::Mode::kShared) {
    return allocator::AnswerShared(available, must_include, size,
                                   static_cast<std::uint32_t>(resource_.shared_devices));
  }
  // The allocator and the early-warning flags of one view, held here: a range-for over a member
  // reached through a temporary's operator-> would keep nothing alive while a poll publishes.
  std::shared_ptr<const allocator::ExclusiveAllocator> alloc;
  node::ViewPtr view;
  {
    absl::MutexLock lock(&mu_);
    alloc = allocator_;
    view = view_;
  }
  allocator::GpuContext gpus;
  if (std::optional<GpuSelection> sel = node_.GpuContext(resource_.name)) {
    Log()->debug("GPU context of {}: {} candidate container(s), chosen '{}', GPUs [{}], {} free "
                 "GPUs",
                 resource_.name, sel->candidates, sel->container,
                 absl::StrJoin(sel->context.container_gpus, ","), sel->context.free_gpus.size());
    gpus = std::move(sel->context);
  }
  std::vector<bool> degraded;  // by the allocator's snapshot index
  for (const auto& [pci, flags] : view->flagged) {
    if (!flags.degraded) continue;
    if (const int idx = alloc->topology()->HcaIndex(pci); idx >= 0) {
      degraded.resize(alloc->topology()->hcas().size());
      degraded[idx] = true;
    }
  }
  return alloc->Answer(available, must_include, size, gpus, degraded);
}

}  // namespace rdp::deviceplugin
