#include "dra/driver.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string_view>
#include <system_error>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "dra/device_status.h"
#include "dra/devices.h"
#include "dra/kubelet_state.h"
#include "hca/hca.h"
#include "serving/atomic_file.h"

namespace rdp::dra {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

std::string Describe(const ClaimRef& ref) {
  return absl::StrCat(ref.ns, "/", ref.name, " (uid ", ref.uid, ")");
}

// The reader's error as the claim's: what went wrong, in the reader's words.
absl::Status ReadError(const ClaimRef& ref, const absl::Status& s) {
  const std::string what = absl::StrCat("claim ", Describe(ref), ": ");
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return absl::NotFoundError(absl::StrCat(what, "not found: ", s.message()));
    case absl::StatusCode::kFailedPrecondition:
      return absl::FailedPreconditionError(absl::StrCat(what, "not allocated: ", s.message()));
    case absl::StatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(
          absl::StrCat(what, "malformed allocation: ", s.message()));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return absl::Status(s.code(),
                          absl::StrCat(what, "the API server could not be reached: ", s.message()));
    default:
      return absl::Status(s.code(), absl::StrCat(what, "reading it failed: ", s.message()));
  }
}

// The base requests of the devices, in the order they first appear.
std::vector<std::string> Requests(const std::vector<AllocatedDevice>& devices) {
  std::vector<std::string> out;
  for (const AllocatedDevice& d : devices) {
    const std::string r = BaseRequest(d.request);
    if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  }
  return out;
}

// The base requests with a device allocated for admin access.
std::set<std::string> AdminRequests(const std::vector<AllocatedDevice>& devices) {
  std::set<std::string> out;
  for (const AllocatedDevice& d : devices) {
    if (d.admin_access) out.insert(BaseRequest(d.request));
  }
  return out;
}

// The claim as the common variables see it: its admin devices are nobody's holding.
ClaimDevices DevicesOf(const std::string& uid, const std::vector<AllocatedDevice>& devices) {
  ClaimDevices out{uid, {}};
  for (const AllocatedDevice& d : devices) {
    if (!d.admin_access) out.requests[BaseRequest(d.request)].push_back(d.device);
  }
  return out;
}

// "mlx5_0 (hca-0000-1a-00-0), ...": the claim's admin devices, by HCA name where the node knows
// it.
std::string AdminHcas(const std::vector<AllocatedDevice>& devices,
                      const topology::Topology* topology) {
  std::vector<std::string> out;
  for (const AllocatedDevice& d : devices) {
    if (!d.admin_access) continue;
    const int idx = topology ? FindHca(*topology, d.device) : -1;
    out.push_back(idx >= 0 ? absl::StrCat(topology->hcas()[idx].name, " (", d.device, ")")
                           : d.device);
  }
  return absl::StrJoin(out, ", ");
}

std::string Key(const std::string& ns, const std::string& name) { return absl::StrCat(ns, "/", name); }

// The generation a metadata file's first object says; 0 when it says none (not a stream of ours).
int64_t GenerationOf(const std::string& text) {
  absl::StatusOr<std::vector<nlohmann::json>> objects = ParseMetadataStream(text);
  if (!objects.ok() || objects->empty()) return 0;
  const nlohmann::json& meta = objects->front();
  const auto it = meta.find("metadata");
  if (it == meta.end() || !it->is_object()) return 0;
  const auto g = it->find("generation");
  return g != it->end() && g->is_number_integer() ? g->get<int64_t>() : 0;
}

}  // namespace

Driver::Driver(DriverConfig config, ClaimReader& reader, CdiStore& cdi, MetadataStore& metadata,
               Checkpoint& checkpoint, node::Node& node, ClaimStatusWriter* status)
    : config_(std::move(config)),
      reader_(reader),
      cdi_(cdi),
      metadata_(metadata),
      node_(node),
      status_(status),
      checkpoint_(checkpoint) {}

absl::Status Driver::Start() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<PreparedClaims> loaded = checkpoint_.Load();
  if (!loaded.ok()) return loaded.status();
  prepared_ = *std::move(loaded);
  for (auto& [uid, claim] : prepared_) {
    // Written by a version that did not record it: prepared no later than the file's last write.
    if (claim.prepared_at == absl::InfinitePast()) claim.prepared_at = checkpoint_.Written();
  }
  if (absl::Status s = checkpoint_.Save(prepared_); !s.ok()) return s;
  Log()->info("DRA driver {}: {} prepared claim(s) in checkpoint {}", config_.driver_name,
              prepared_.size(), checkpoint_.path());
  if (absl::Status s = UnprepareForgotten(); !s.ok()) return s;
  return Reconcile();
}

absl::Status Driver::UnprepareForgotten() {
  if (config_.kubelet_state.empty()) return absl::OkStatus();
  absl::StatusOr<KubeletClaims> kubelet =
      ReadKubeletClaims(config_.kubelet_state, config_.driver_name);
  if (!kubelet.ok()) {
    Log()->warn("the kubelet's DRA checkpoint {} cannot be used ({}): no claim is unprepared "
                "for the kubelet having forgotten it; the {} prepared claim(s) stay",
                config_.kubelet_state, kubelet.status().ToString(), prepared_.size());
    return absl::OkStatus();
  }
  const std::string written = absl::FormatTime(absl::RFC3339_full, kubelet->written, absl::UTCTimeZone());
  std::vector<PreparedClaim> forgotten;
  for (const auto& [uid, claim] : prepared_) {
    if (kubelet->uids.count(uid)) continue;
    if (claim.prepared_at >= kubelet->written) {
      Log()->info("claim {}: kept although the kubelet's DRA checkpoint {} does not list it: it "
                  "was prepared at {}, after the kubelet last wrote that file ({}); the kubelet "
                  "may not have recorded it yet",
                  Describe(claim.ref), kubelet->path,
                  absl::FormatTime(absl::RFC3339_full, claim.prepared_at, absl::UTCTimeZone()),
                  written);
      continue;
    }
    forgotten.push_back(claim);
  }
  if (forgotten.empty()) {
    Log()->info("the kubelet's DRA checkpoint {} (written {}) holds every prepared claim",
                kubelet->path, written);
    return absl::OkStatus();
  }
  PreparedClaims kept = prepared_;
  for (const PreparedClaim& claim : forgotten) kept.erase(claim.ref.uid);
  if (absl::Status s = checkpoint_.Save(kept); !s.ok()) return s;
  prepared_ = std::move(kept);
  for (const PreparedClaim& claim : forgotten) {
    absl::Status s = cdi_.Remove(claim.ref.uid);  // else Reconcile removes it as an orphan
    Log()->info("unprepared claim {}: the kubelet's DRA checkpoint {} (written {}) does not list "
                "it for driver {}, and it was prepared before that ({}){}",
                Describe(claim.ref), kubelet->path, written, config_.driver_name,
                absl::FormatTime(absl::RFC3339_full, claim.prepared_at, absl::UTCTimeZone()),
                s.ok() ? "" : absl::StrCat("; removing its CDI spec failed: ", s.ToString()));
    if (status_ != nullptr) status_->Set(claim.ref, {});
  }
  unprepared_at_start_ = static_cast<int>(forgotten.size());
  return absl::OkStatus();
}

absl::Status Driver::Reconcile() {
  absl::StatusOr<std::vector<std::string>> temporaries = cdi_.RemoveTemporaryFiles();
  if (!temporaries.ok()) return temporaries.status();
  for (const std::string& file : *temporaries) {
    Log()->warn("removed {}: the temporary file of a CDI spec write that did not finish", file);
  }
  absl::StatusOr<std::vector<std::string>> on_disk = cdi_.ListClaims();
  if (!on_disk.ok()) return on_disk.status();
  int orphans = 0;
  for (const std::string& uid : *on_disk) {
    if (prepared_.count(uid)) continue;
    if (absl::Status s = cdi_.Remove(uid); !s.ok()) {
      Log()->error("orphan CDI spec of claim uid {} (not in the checkpoint) left: {}", uid,
                   s.ToString());
      continue;
    }
    ++orphans;
    Log()->warn("removed {}: a CDI spec of claim uid {}, which the checkpoint does not hold (a "
                "crash between the spec and the checkpoint)",
                cdi_.PathOf(uid), uid);
  }
  const SpecCounts counts = RewriteSpecs();
  Log()->info("CDI specs in {} agree with the checkpoint: {} (re)written, {} orphan(s) and {} "
              "temporary file(s) removed, {} left without a spec",
              cdi_.dir(), counts.written, orphans, temporaries->size(), counts.dropped);
  return ReconcileMetadata();
}

absl::Status Driver::ReconcileMetadata() {
  int temporaries = 0;
  for (const auto& [uid, claim] : prepared_) {
    absl::StatusOr<std::vector<std::string>> removed = metadata_.RemoveTemporaryFiles(uid);
    if (!removed.ok()) {
      Log()->error("claim {}: {}", Describe(claim.ref), removed.status().ToString());
      continue;
    }
    for (const std::string& file : *removed) {
      Log()->warn("removed {}: the temporary file of a metadata write that did not finish", file);
    }
    temporaries += static_cast<int>(removed->size());
  }
  absl::StatusOr<std::vector<std::string>> on_disk = metadata_.ListClaims();
  if (!on_disk.ok()) return on_disk.status();
  int orphans = 0;
  for (const std::string& uid : *on_disk) {
    if (prepared_.count(uid)) continue;
    if (absl::Status s = metadata_.RemoveClaim(uid); !s.ok()) {
      Log()->error("metadata files of claim uid {} (not in the checkpoint) left: {}", uid,
                   s.ToString());
      continue;
    }
    ++orphans;
  }
  Log()->info("metadata files in {} agree with the checkpoint: {} orphan claim(s) and {} "
              "temporary file(s) removed",
              metadata_.dir(), orphans, temporaries);
  return absl::OkStatus();
}

Driver::SpecCounts Driver::RewriteSpecs() {
  SpecCounts counts;
  for (const auto& [uid, claim] : prepared_) RewriteSpec(claim, counts);
  return counts;
}

void Driver::RewriteSpec(const PreparedClaim& claim, SpecCounts& counts) {
  const std::string& uid = claim.ref.uid;
  // A missing spec is written when the kubelet prepares the claim again (AnswerKnown), not
  // here: after a reboot (/var/run/cdi is a tmpfs) the checkpoint still holds the claims of
  // pods deleted just before it, which the kubelet unprepares later; their specs stay gone.
  absl::StatusOr<nlohmann::json> file = cdi_.Read(uid);
  if (absl::IsNotFound(file.status())) return;
  absl::StatusOr<nlohmann::json> spec;
  try {
    spec = SpecFor(claim, /*require_usable=*/false);
  } catch (const std::exception& e) {  // a library's throw is this claim's alone
    spec = absl::InternalError(e.what());
  }
  if (!spec.ok()) {
    absl::Status s = cdi_.Remove(uid);
    RemoveMetadata(claim.ref);  // what mounted it is gone
    Log()->error("claim {}: its CDI spec cannot be built now ({}): {}; its containers cannot "
                 "start until the kubelet unprepares it",
                 Describe(claim.ref), spec.status().ToString(),
                 s.ok() ? "removed the old one, whose device nodes may name another HCA now"
                        : absl::StrCat("removing the old one failed: ", s.ToString()));
    counts.dropped += s.ok();
    return;
  }
  // The spec's metadata device mounts these files: they are there before it is.
  if (absl::Status s = WriteMetadata(claim); !s.ok()) {
    Log()->error("claim {}: writing its metadata files failed: {}", Describe(claim.ref),
                 s.ToString());
  }
  if (file.ok() && *file == *spec) return;
  if (absl::Status s = cdi_.Write(uid, *spec); !s.ok()) {
    Log()->error("claim {}: re-writing its CDI spec failed: {}", Describe(claim.ref),
                 s.ToString());
    return;
  }
  ++counts.written;
  if (file.ok()) {
    Log()->warn("claim {}: CDI spec re-written: it differed from what the node needs now (a "
                "reload of the HCA driver renumbers uverbs nodes and their major:minor)",
                Describe(claim.ref));
  } else {
    Log()->warn("claim {}: CDI spec written again ({})", Describe(claim.ref),
                std::string(file.status().message()));  // one that was not JSON
  }
}

void Driver::RefreshSpecs() {
  SpecCounts counts;
  const node::ViewPtr view = node_.Now();
  // A claim on an HCA whose RDMA driver is away keeps its spec: built now it would name none of
  // that HCA's nodes.
  auto away = [&view](const PreparedClaim& claim) {
    for (const AllocatedDevice& d : claim.devices) {
      const int idx = FindHca(*view->topology, d.device);
      if (idx >= 0 && view->driver_away.count(view->topology->hcas()[idx].place.pci)) return true;
    }
    return false;
  };
  for (const auto& [uid, claim] : Prepared()) {
    if (away(claim)) continue;
    // Each claim's calls wait, and it is taken as committed (a call in flight finished first).
    LockClaim(uid);
    {
      absl::MutexLock lock(&mu_);
      if (auto it = prepared_.find(uid); it != prepared_.end()) RewriteSpec(it->second, counts);
    }
    UnlockClaim(uid);
  }
  if (counts.written + counts.dropped > 0) {
    Log()->info("CDI specs of prepared claims built again for the node as it is now: {} "
                "re-written, {} left without a spec",
                counts.written, counts.dropped);
  }
}

void Driver::LockClaim(const std::string& uid) {
  absl::MutexLock lock(&mu_);
  while (busy_.count(uid) != 0) claim_done_.Wait(&mu_);
  busy_.insert(uid);
}

bool Driver::LockIfPrepared(const std::string& uid) {
  absl::MutexLock lock(&mu_);
  while (busy_.count(uid) != 0 && prepared_.count(uid) != 0) claim_done_.Wait(&mu_);
  if (prepared_.count(uid) == 0) return false;
  busy_.insert(uid);
  return true;
}

void Driver::UnlockClaim(const std::string& uid) {
  absl::MutexLock lock(&mu_);
  busy_.erase(uid);
  claim_done_.SignalAll();
}

std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>> Driver::Prepare(
    const std::vector<ClaimRef>& claims) {
  std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>> out;
  std::vector<ClaimRef> valid;
  for (const ClaimRef& ref : claims) {
    if (out.count(ref.uid)) continue;
    if (ref.ns.empty() || ref.name.empty()) {
      out.emplace(ref.uid, absl::InvalidArgumentError(absl::StrCat(
                               "claim ", Describe(ref), ": namespace and name are required")));
      continue;
    }
    if (absl::Status s = ValidateClaimUid(ref.uid); !s.ok()) {
      out.emplace(ref.uid, absl::InvalidArgumentError(
                               absl::StrCat("claim ", ref.ns, "/", ref.name, ": ", s.message())));
      continue;
    }
    out.emplace(ref.uid, absl::UnknownError("not prepared"));  // answered below
    valid.push_back(ref);
  }
  // Claim locks are taken in UID order. A claim in the checkpoint is answered at once, without
  // the API server, and its lock let go: the locks held from here on are of claims that are not
  // prepared, which no other call waits for while it holds prepare_mu_ (LockIfPrepared).
  std::sort(valid.begin(), valid.end(),
            [](const ClaimRef& a, const ClaimRef& b) { return a.uid < b.uid; });
  std::vector<ClaimRef> fresh;
  for (const ClaimRef& ref : valid) {
    LockClaim(ref.uid);
    std::optional<PreparedClaim> known;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = prepared_.find(ref.uid); it != prepared_.end()) known = it->second;
    }
    if (!known) {
      fresh.push_back(ref);
      continue;
    }
    try {
      out.at(ref.uid) = AnswerKnown(*known);
    } catch (const std::exception& e) {  // a library's throw stays this claim's error
      out.at(ref.uid) = absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", e.what()));
    }
    UnlockClaim(ref.uid);
  }
  if (!fresh.empty()) {
    try {
      PrepareFresh(fresh, out);
    } catch (const std::exception& e) {
      for (const ClaimRef& ref : fresh) {
        auto& r = out.at(ref.uid);
        if (!r.ok() && r.status().code() == absl::StatusCode::kUnknown) {
          r = absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", e.what()));
        }
      }
    }
    for (const ClaimRef& ref : fresh) UnlockClaim(ref.uid);
  }
  for (const ClaimRef& ref : claims) {
    const auto it = out.find(ref.uid);
    if (it == out.end()) continue;
    if (it->second.ok()) {
      Log()->info("prepared claim {}: {} device(s)", Describe(ref), it->second->size());
      WriteStatus(ref);
    } else {
      Log()->warn("preparing claim {} failed: {}", Describe(ref), it->second.status().ToString());
    }
  }
  return out;
}

void Driver::PrepareFresh(
    const std::vector<ClaimRef>& refs,
    std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>>& out) {
  // One deadline for the call's reads, from when they can start (the claims' locks held): the
  // kubelet waits for all claims together.
  const absl::Time deadline = config_.now() + config_.api_timeout;
  for (int attempt = 1;; ++attempt) {
    const uint64_t since = BeginReads();
    absl::Cleanup end_reads = [this, since] { EndReads(since); };
    std::map<std::string, std::pair<ClaimRef, ClaimAllocation>> read;  // by uid
    for (const ClaimRef& ref : refs) {
      absl::StatusOr<ClaimAllocation> claim = reader_.Read(ref, config_.driver_name, deadline);
      if (!claim.ok()) {
        out.at(ref.uid) = ReadError(ref, claim.status());
      } else if (claim->devices.empty()) {
        out.at(ref.uid) = absl::FailedPreconditionError(
            absl::StrCat("claim ", Describe(ref), ": its allocation has no device of driver ",
                         config_.driver_name));
      } else {
        read.emplace(ref.uid, std::pair(ref, *std::move(claim)));
      }
    }
    Consumers consumers;
    if (!read.empty()) consumers = ConsumersOf(read, deadline);
    absl::MutexLock serial(&prepare_mu_);
    const std::set<std::string> named = NamedSince(since, read);
    if (read.empty()) return;
    if (!named.empty() && attempt < kReadAttempts) continue;  // read again, the lock let go
    for (const std::string& uid : named) {
      Log()->warn("claim {}: its holders changed while it was read ({} times): its CDI device "
                  "sets only its requests' own variables",
                  Describe(read.at(uid).first), kReadAttempts);
      for (auto& [key, devices] : consumers.commons) {
        if (key.claim_uid == uid) devices = std::nullopt;
      }
    }
    CommitFresh(read, consumers, out);
    return;
  }
}

uint64_t Driver::BeginReads() {
  absl::MutexLock lock(&mu_);
  reads_since_.insert(commits_);
  return commits_;
}

std::set<std::string> Driver::NamedSince(
    uint64_t since, const std::map<std::string, std::pair<ClaimRef, ClaimAllocation>>& read) {
  absl::MutexLock lock(&mu_);
  std::set<std::string> out;
  for (const auto& [uid, entry] : read) {
    const auto it = named_at_.find(Key(entry.first.ns, entry.first.name));
    if (it != named_at_.end() && it->second > since) out.insert(uid);
  }
  return out;
}

void Driver::EndReads(uint64_t since) {
  absl::MutexLock lock(&mu_);
  reads_since_.erase(reads_since_.find(since));
  // What no batch still reading can have missed is forgotten.
  const uint64_t oldest = reads_since_.empty() ? commits_ : *reads_since_.begin();
  for (auto it = named_at_.begin(); it != named_at_.end();) {
    it = it->second <= oldest ? named_at_.erase(it) : std::next(it);
  }
}

void Driver::CommitFresh(
    const std::map<std::string, std::pair<ClaimRef, ClaimAllocation>>& read,
    const Consumers& consumers,
    std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>>& out) {
  std::set<std::string> batch;
  for (const auto& [uid, entry] : read) {
    batch.insert(uid);
    const auto& [ref, allocation] = entry;
    PreparedClaim claim{ref, allocation.devices, {}, false};
    claim.prepared_at = absl::Now();
    claim.pod_claim_name = allocation.pod_claim_name;
    for (const std::string& request : Requests(claim.devices)) {
      const auto it = consumers.commons.find({ref.uid, request});
      if (it == consumers.commons.end() || !it->second) continue;
      claim.common[request] = *it->second;
      const auto names = consumers.pod_env.find({ref.uid, request});
      if (names != consumers.pod_env.end() && !names->second.empty()) {
        claim.pod_env[request] = names->second;
      }
    }
    absl::StatusOr<std::vector<PreparedDevice>> r;
    try {
      absl::StatusOr<nlohmann::json> spec = SpecFor(claim);
      if (!spec.ok()) {
        r = spec.status();
      } else if (absl::Status s = Commit(claim, *spec); !s.ok()) {
        r = s;
      } else {
        r = Answer(claim);
      }
    } catch (const std::exception& e) {
      r = absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", e.what()));
    }
    if (r.ok() && !AdminRequests(claim.devices).empty()) {
      const node::ViewPtr view = node_.Now();
      Log()->info("claim {}: admin access to HCA {}: its device nodes beside any holder's, "
                  "not counted as a holder",
                  Describe(ref), AdminHcas(claim.devices, view ? view->topology.get() : nullptr));
    }
    out.at(ref.uid) = std::move(r);
  }
  {
    absl::MutexLock lock(&mu_);
    ++commits_;  // EndReads forgets these once no batch still reading began before
    for (const std::string& key : consumers.named) named_at_[key] = commits_;
  }
  UpdateShared(consumers, batch);
}

Driver::Consumers Driver::ConsumersOf(
    const std::map<std::string, std::pair<ClaimRef, ClaimAllocation>>& read, absl::Time deadline) {
  // The pods the claims are reserved for, each read once; a claim with a pod that could not be
  // read has consumers we do not know.
  std::map<std::string, PodRef> pods;  // by uid
  std::map<std::string, std::vector<std::string>> claims_of_pod;
  for (const auto& [uid, entry] : read) {
    for (const PodRef& pod : entry.second.reserved_for) {
      pods.emplace(pod.uid, pod);
      claims_of_pod[pod.uid].push_back(uid);
    }
  }
  std::vector<PodClaims> consumers;
  std::set<std::string> unknown;  // claim uids
  std::set<std::string> named;
  for (const auto& [pod_uid, pod] : pods) {
    absl::StatusOr<PodClaims> p = reader_.ReadPod(pod, deadline);
    if (p.ok()) {
      for (const PodClaims::Container& container : p->containers) {
        for (const ClaimUse& use : container.uses) named.insert(Key(pod.ns, use.claim));
      }
      consumers.push_back(*std::move(p));
    } else if (!absl::IsNotFound(p.status())) {  // a pod that is gone consumes nothing
      // Pods not read by choice or refused by RBAC: the reader says so once for the node.
      if (!absl::IsPermissionDenied(p.status())) {
        Log()->warn("reading pod {}/{} failed, so its containers' other HCAs are not known: {}",
                    pod.ns, pod.name, p.status().ToString());
      }
      for (const std::string& uid : claims_of_pod[pod_uid]) unknown.insert(uid);
    }
  }
  // Every claim those containers name, with our devices: this batch's, the prepared ones, and
  // the others read by name (another driver's claim has no device of ours).
  ClaimTable table;
  for (const auto& [uid, entry] : read) {
    table[Key(entry.first.ns, entry.first.name)] = DevicesOf(uid, entry.second.devices);
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [uid, c] : prepared_) table.emplace(Key(c.ref.ns, c.ref.name), DevicesOf(uid, c.devices));
  }
  for (const PodClaims& pod : consumers) {
    for (const PodClaims::Container& container : pod.containers) {
      const bool ours = std::any_of(container.uses.begin(), container.uses.end(),
                                    [&](const ClaimUse& u) { return table.count(Key(pod.pod.ns, u.claim)); });
      if (!ours) continue;  // holds nothing of ours: its other claims do not matter
      for (const ClaimUse& use : container.uses) {
        const std::string key = Key(pod.pod.ns, use.claim);
        if (table.count(key)) continue;
        absl::StatusOr<ClaimAllocation> other =
            reader_.Read({pod.pod.ns, "", use.claim}, config_.driver_name, deadline);
        if (other.ok()) {
          table[key] = DevicesOf(other->uid, other->devices);
        } else if (absl::IsNotFound(other.status()) ||
                   absl::IsFailedPrecondition(other.status())) {
          table[key] = ClaimDevices{};  // gone or not allocated: no device of ours
        } else {
          table[key] = std::nullopt;
        }
      }
    }
  }
  Consumers out{CommonDevices(consumers, table), PodSetVariables(consumers, table),
                std::move(named)};
  Commons& commons = out.commons;
  for (auto& [key, devices] : commons) {
    if (unknown.count(key.claim_uid)) devices = std::nullopt;
  }
  for (const auto& [uid, entry] : read) {
    // A request with admin access sets no common variables: its container may hold the same
    // HCA as an ordinary request too, whose variables name what that container uses.
    const std::set<std::string> admin = AdminRequests(entry.second.devices);
    for (const std::string& request : admin) commons[RequestKey{uid, request}] = std::nullopt;
    // A claim whose consumers are not known at all gets no common variables either.
    for (const std::string& request : Requests(entry.second.devices)) {
      const bool added = commons.try_emplace(RequestKey{uid, request}, std::nullopt).second;
      if (added && !unknown.count(uid)) {
        Log()->warn("claim {}: no container of its pods holds request {}: its CDI device sets "
                    "only that request's own variables",
                    Describe(entry.first), request);
      }
    }
  }
  return out;
}

namespace {

// `claim` as the holders `consumers` names want it: the common variables of a request that are
// not right for one of them withdrawn, the names their pod specs set added to those left out.
// Returns whether anything changed, with what for the log.
bool UpdateForConsumers(PreparedClaim& claim, const Commons& commons,
                        const std::map<RequestKey, std::set<std::string>>& pod_env,
                        std::vector<std::string>& what) {
  const std::string& uid = claim.ref.uid;
  bool changed = false;
  for (auto it = claim.common.begin(); it != claim.common.end();) {
    const auto c = commons.find({uid, it->first});
    if (c != commons.end() && c->second != it->second) {
      what.push_back(absl::StrCat("request ", it->first, ": a container of a new pod holds it "
                                  "beside other HCAs; no common variables (its own remain)"));
      claim.pod_env.erase(it->first);
      it = claim.common.erase(it);
      changed = true;
      continue;
    }
    const auto names = pod_env.find({uid, it->first});
    if (names != pod_env.end()) {
      std::set<std::string>& left_out = claim.pod_env[it->first];
      std::vector<std::string> added;
      for (const std::string& n : names->second) {
        if (left_out.insert(n).second) added.push_back(n);
      }
      if (!added.empty()) {
        what.push_back(absl::StrCat("request ", it->first, ": a new pod's container sets ",
                                    absl::StrJoin(added, ", "), " itself"));
        changed = true;
      }
      if (left_out.empty()) claim.pod_env.erase(it->first);
    }
    ++it;
  }
  return changed;
}

}  // namespace

void Driver::UpdateShared(const Consumers& consumers, const std::set<std::string>& batch) {
  std::vector<std::string> stale;  // prepared claims outside the batch that change
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [uid, claim] : prepared_) {
      if (batch.count(uid) || claim.legacy) continue;
      PreparedClaim updated = claim;
      std::vector<std::string> what;
      if (UpdateForConsumers(updated, consumers.commons, consumers.pod_env, what)) {
        stale.push_back(uid);
      }
    }
  }
  for (const std::string& uid : stale) {
    if (!LockIfPrepared(uid)) continue;  // unprepared since
    std::optional<PreparedClaim> claim;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = prepared_.find(uid); it != prepared_.end()) claim = it->second;
    }
    std::vector<std::string> what;
    if (claim && UpdateForConsumers(*claim, consumers.commons, consumers.pod_env, what)) {
      absl::StatusOr<nlohmann::json> spec = SpecFor(*claim);
      absl::Status s = spec.ok() ? Commit(*claim, *spec) : spec.status();
      if (s.ok()) {
        Log()->warn("claim {}: CDI spec re-written: {}", Describe(claim->ref),
                    absl::StrJoin(what, "; "));
      } else {
        Log()->error("claim {}: re-writing its CDI spec failed ({}): {}", Describe(claim->ref),
                     absl::StrJoin(what, "; "), s.ToString());
      }
    }
    UnlockClaim(uid);
  }
}

absl::StatusOr<std::vector<PreparedDevice>> Driver::AnswerKnown(const PreparedClaim& claim) {
  if (absl::Status s = WriteMetadata(claim); !s.ok()) return s;
  if (!cdi_.Exists(claim.ref.uid)) {
    absl::StatusOr<nlohmann::json> spec = SpecFor(claim);
    if (!spec.ok()) return spec.status();
    if (absl::Status s = cdi_.Write(claim.ref.uid, *spec); !s.ok()) return s;
    Log()->info("claim {}: CDI spec re-written from the checkpoint", Describe(claim.ref));
  }
  // The kubelet asks again (it lost its own state): it records the claim after this answer, so
  // this is now its time of prepare (UnprepareForgotten).
  {
    absl::MutexLock lock(&mu_);
    if (auto it = prepared_.find(claim.ref.uid); it != prepared_.end()) {
      const absl::Time before = it->second.prepared_at;
      it->second.prepared_at = absl::Now();
      if (absl::Status s = checkpoint_.Save(prepared_); !s.ok()) {
        it->second.prepared_at = before;
        return absl::InternalError(absl::StrCat("claim ", Describe(claim.ref), ": ", s.message()));
      }
    }
  }
  return Answer(claim);
}

absl::Status Driver::Commit(const PreparedClaim& claim, const nlohmann::json& spec) {
  const ClaimRef& ref = claim.ref;
  absl::Status written = WriteMetadata(claim);
  if (written.ok()) written = cdi_.Write(ref.uid, spec);
  if (!written.ok()) {
    cdi_.Remove(ref.uid).IgnoreError();
    if (!Prepared().count(ref.uid)) RemoveMetadata(ref);
    return absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", written.message()));
  }
  absl::MutexLock lock(&mu_);
  std::optional<PreparedClaim> before;
  if (auto it = prepared_.find(ref.uid); it != prepared_.end()) before = it->second;
  prepared_[ref.uid] = claim;
  if (absl::Status s = checkpoint_.Save(prepared_); !s.ok()) {
    if (before) {
      prepared_[ref.uid] = *before;
    } else {
      prepared_.erase(ref.uid);
      if (absl::Status r = cdi_.Remove(ref.uid); !r.ok()) {
        Log()->error("claim {}: CDI spec left behind: {}", Describe(ref), r.ToString());
      }
      RemoveMetadata(ref);
    }
    return absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> Driver::SpecFor(const PreparedClaim& claim,
                                               bool require_usable) {
  const ClaimRef& ref = claim.ref;
  for (const AllocatedDevice& d : claim.devices) {
    if (d.pool != config_.node_name) {
      return absl::FailedPreconditionError(absl::StrCat(
          "claim ", Describe(ref), ": device ", d.device, " is in pool ", d.pool,
          ", not in this node's pool ", config_.node_name));
    }
  }
  const node::ViewPtr view = node_.Now();
  topology::TopologyPtr snapshot = view ? view->topology : nullptr;
  auto all_known = [&claim](const topology::Topology& t) {
    return std::all_of(claim.devices.begin(), claim.devices.end(),
                       [&t](const AllocatedDevice& d) { return FindHca(t, d.device) >= 0; });
  };
  // A device we do not know may be an HCA plugged in since the snapshot was taken.
  if (!snapshot || !all_known(*snapshot)) {
    if (const node::ViewPtr fresh = node_.Rediscover()) snapshot = fresh->topology;
  }
  if (!snapshot) return absl::UnavailableError("no topology snapshot yet");
  // The claim's HCAs, each once, in the order of its results.
  std::vector<int> indices;
  for (const AllocatedDevice& d : claim.devices) {
    const int idx = FindHca(*snapshot, d.device);
    if (idx < 0) {
      return absl::NotFoundError(absl::StrCat("claim ", Describe(ref), ": device ", d.device,
                                              " is not on node ", config_.node_name));
    }
    if (std::find(indices.begin(), indices.end(), idx) == indices.end()) indices.push_back(idx);
  }
  // Their device nodes as they are now, and rdma_cm's (as NodeState::Allocate checks them).
  std::vector<const topology::Hca*> asked;
  for (const int idx : indices) asked.push_back(&snapshot->hcas()[idx]);
  hca::NodesNow checked = node_.CheckNow(asked);
  const bool rdma_cm = checked.rdma_cm;
  std::map<int, hca::HcaNow> now;  // by snapshot index
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const int idx = indices[i];
    const topology::Hca& h = snapshot->hcas()[idx];
    const hca::Verdict verdict =
        hca::Assess(now.emplace(idx, std::move(checked.hcas[i])).first->second);
    // Admin access is for monitoring and diagnostics: an HCA that is not usable (a port DOWN)
    // is what it is there for. Its device nodes that exist are given, as for any holder.
    const bool admin_only = std::all_of(
        claim.devices.begin(), claim.devices.end(), [&](const AllocatedDevice& d) {
          return d.admin_access || FindHca(*snapshot, d.device) != idx;
        });
    if (require_usable && !verdict.usable && admin_only) {
      Log()->warn("claim {}: admin access to HCA {} ({}), which is unusable now: {}",
                  Describe(ref), h.name, DeviceName(h), verdict.reason);
    } else if (require_usable && !verdict.usable) {
      return absl::FailedPreconditionError(absl::StrCat("claim ", Describe(ref), ": HCA ", h.name,
                                                        " (", DeviceName(h),
                                                        ") is unusable: ", verdict.reason));
    }
  }
  // The HCAs of the devices `pick` chooses, each once, as they are now.
  auto hcas_of = [&](auto pick) {
    std::vector<int> taken;
    std::vector<hca::HcaNow> out;
    for (const AllocatedDevice& d : claim.devices) {
      const int idx = FindHca(*snapshot, d.device);
      if (!pick(d) || std::find(taken.begin(), taken.end(), idx) != taken.end()) continue;
      taken.push_back(idx);
      out.push_back(now.at(idx));
    }
    return out;
  };
  if (claim.legacy) {
    return BuildLegacyCdiSpec(
        config_.driver_name, ref.uid,
        hca::BuildAllocation(hcas_of([](const auto&) { return true; }), rdma_cm, {},
                             /*allocation_dir=*/""),
        node_.env());
  }
  std::vector<CdiRequest> requests;
  for (const std::string& request : Requests(claim.devices)) {
    CdiRequest r;
    r.request = request;
    r.metadata = CdiRequest::Mount{
        metadata_.PathOf(ref.uid, request),
        MetadataContainerPath(config_.driver_name, ref.name, claim.pod_claim_name, request)};
    r.own = hca::BuildAllocation(
        hcas_of([&request](const AllocatedDevice& d) { return BaseRequest(d.request) == request; }),
        rdma_cm, {}, /*allocation_dir=*/"");
    if (const auto it = claim.common.find(request); it != claim.common.end()) {
      // The devices of the container's other pairs are HCAs of this node too (their claims
      // checked them); only their names and addresses go into the variables.
      std::vector<hca::HcaNow> all;
      for (const std::string& device : it->second) {
        const int idx = FindHca(*snapshot, device);
        if (idx < 0) {
          all.clear();
          break;
        }
        all.push_back(hca::AsScanned(snapshot->hcas()[idx]));
      }
      if (!all.empty()) {
        node::Grant grant = node_.GrantFor(std::move(all), rdma_cm);
        hca::ContainerAllocation& common = grant.allocation;
        for (const std::string& w : common.warnings) {
          Log()->warn("claim {} request {}: {}", Describe(ref), request, w);
        }
        if (const auto names = claim.pod_env.find(request); names != claim.pod_env.end()) {
          std::vector<std::string> left;
          for (const std::string& name : names->second) {
            if (common.envs.erase(name)) left.push_back(name);
          }
          if (!left.empty()) {
            Log()->info("claim {} request {}: the pod spec sets {}: its CDI device leaves {} "
                        "to it",
                        Describe(ref), request, absl::StrJoin(left, ", "),
                        left.size() == 1 ? "it" : "them");
          }
        }
        r.common = std::move(common.envs);
        if (!grant.file_mount.empty()) r.allocation_file = grant.file_mount;
      }
    }
    requests.push_back(std::move(r));
  }
  return BuildCdiSpec(config_.driver_name, ref.uid, requests, node_.env());
}

std::vector<PreparedDevice> Driver::Answer(const PreparedClaim& claim) const {
  std::vector<PreparedDevice> out;
  out.reserve(claim.devices.size());
  std::set<std::string> given;  // requests whose CDI device an earlier device carries
  for (const AllocatedDevice& d : claim.devices) {
    const std::string request = BaseRequest(d.request);
    std::vector<std::string> ids;
    if (claim.legacy) {
      ids = {LegacyCdiDeviceId(config_.driver_name, claim.ref.uid)};
    } else if (given.insert(request).second) {
      ids = {CdiDeviceId(config_.driver_name, claim.ref.uid, request),
             MetadataCdiDeviceId(config_.driver_name, claim.ref.uid, request)};
    }
    out.push_back({{request}, d.pool, d.device, std::move(ids), d.share_id});
  }
  return out;
}

std::map<std::string, absl::Status> Driver::Unprepare(const std::vector<ClaimRef>& claims) {
  std::map<std::string, absl::Status> out;
  for (const ClaimRef& ref : claims) {
    if (out.count(ref.uid)) continue;
    if (absl::Status s = ValidateClaimUid(ref.uid); !s.ok()) {
      out.emplace(ref.uid, absl::InvalidArgumentError(
                               absl::StrCat("claim ", ref.ns, "/", ref.name, ": ", s.message())));
      continue;
    }
    LockClaim(ref.uid);
    absl::Status s = UnprepareOne(ref);
    UnlockClaim(ref.uid);
    if (!s.ok()) {
      Log()->warn("unpreparing claim {} failed: {}", Describe(ref), s.ToString());
    } else if (status_ != nullptr) {
      status_->Set(ref, {});  // also for a claim not prepared here: entries a crash left
    }
    out.emplace(ref.uid, std::move(s));
  }
  return out;
}

absl::Status Driver::UnprepareOne(const ClaimRef& ref) {
  {
    absl::MutexLock lock(&mu_);
    auto it = prepared_.find(ref.uid);
    if (it != prepared_.end()) {
      PreparedClaim old = std::move(it->second);
      prepared_.erase(it);
      if (absl::Status s = checkpoint_.Save(prepared_); !s.ok()) {
        prepared_.emplace(ref.uid, std::move(old));
        return absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", s.message()));
      }
      Log()->info("unprepared claim {}", Describe(ref));
    }
  }
  // Also for a claim not (or no longer) in the checkpoint: files a crash left behind.
  if (absl::Status s = cdi_.Remove(ref.uid); !s.ok()) {
    return absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", s.message()));
  }
  RemoveMetadata(ref);
  return absl::OkStatus();
}

void Driver::RemoveMetadata(const ClaimRef& ref) {
  if (absl::Status s = metadata_.RemoveClaim(ref.uid); !s.ok()) {
    Log()->error("claim {}: its metadata files are left behind: {}", Describe(ref), s.ToString());
  }
}

absl::Status Driver::WriteMetadata(const PreparedClaim& claim) {
  if (claim.legacy) return absl::OkStatus();
  const node::ViewPtr view = node_.Now();
  if (!view) return absl::UnavailableError("no view of the node yet");
  const std::vector<nlohmann::json> published =
      config_.published_devices
          ? config_.published_devices(*view)
          : BuildDevices(*view, DeviceOptions{config_.driver_name});
  std::map<std::string, const nlohmann::json*> attributes;  // by device name
  for (const nlohmann::json& d : published) {
    if (d.contains("name") && d.contains("attributes")) attributes[d["name"]] = &d["attributes"];
  }
  for (const std::string& request : Requests(claim.devices)) {
    std::string named;  // results[].request: "<request>/<subrequest>" kept
    std::vector<MetadataDevice> devices;
    for (const AllocatedDevice& d : claim.devices) {
      if (BaseRequest(d.request) != request) continue;
      if (named.empty()) named = d.request;
      MetadataDevice m{d.pool, d.device, nlohmann::json(), nlohmann::json()};
      if (const auto it = attributes.find(d.device); it != attributes.end()) {
        m.attributes = *it->second;
      }
      if (const int idx = FindHca(*view->topology, d.device); idx >= 0) {
        const nlohmann::json status = AllocatedDeviceStatus(
            config_.driver_name, d.pool, view->topology->hcas()[idx], node_.env());
        if (status.contains("networkData")) m.network_data = status["networkData"];
      }
      devices.push_back(std::move(m));
    }
    auto stream = [&](int64_t generation) {
      return MetadataStream(BuildDeviceMetadata(config_.driver_name, claim.ref,
                                                claim.pod_claim_name, named, devices, generation));
    };
    int64_t generation = 1;
    if (absl::StatusOr<std::string> old = metadata_.Read(claim.ref.uid, request); old.ok()) {
      if (const int64_t before = GenerationOf(*old); before > 0) {
        if (stream(before) == *old) continue;
        generation = before + 1;
      }
    }
    if (absl::Status s = metadata_.Write(claim.ref.uid, request, stream(generation)); !s.ok()) {
      return absl::InternalError(absl::StrCat("claim ", Describe(claim.ref), " request ", request,
                                              ": metadata file: ", s.message()));
    }
  }
  return absl::OkStatus();
}

void Driver::WriteStatus(const ClaimRef& ref) {
  if (status_ == nullptr) return;
  try {
    std::optional<PreparedClaim> claim;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = prepared_.find(ref.uid); it != prepared_.end()) claim = it->second;
    }
    if (!claim) return;  // unprepared meanwhile
    const node::ViewPtr view = node_.Now();
    const topology::TopologyPtr snapshot = view ? view->topology : nullptr;
    std::vector<nlohmann::json> entries;
    std::set<std::pair<std::string, std::string>> seen;  // (device, shareID): the list's keys
    for (const AllocatedDevice& d : claim->devices) {
      if (!seen.emplace(d.device, d.share_id).second) continue;
      const int idx = snapshot ? FindHca(*snapshot, d.device) : -1;
      nlohmann::json entry =
          idx >= 0 ? AllocatedDeviceStatus(config_.driver_name, d.pool, snapshot->hcas()[idx], node_.env())
                   : nlohmann::json{{"driver", config_.driver_name}, {"pool", d.pool},
                                    {"device", d.device}};
      if (!d.share_id.empty()) entry["shareID"] = d.share_id;
      entries.push_back(std::move(entry));
    }
    status_->Set(claim->ref, std::move(entries));
  } catch (const std::exception& e) {  // the claim is prepared all the same
    Log()->error("claim {}: its status.devices entries cannot be built: {}", Describe(ref),
                 e.what());
  }
}

PreparedClaims Driver::Prepared() const {
  absl::MutexLock lock(&mu_);
  return prepared_;
}

int Driver::UnpreparedAtStart() const {
  absl::MutexLock lock(&mu_);
  return unprepared_at_start_;
}

}  // namespace rdp::dra
