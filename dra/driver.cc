#include "dra/driver.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "dra/devices.h"
#include "hca/hca.h"

namespace rdp::dra {
namespace {

constexpr char kRdmaCm[] = "/dev/infiniband/rdma_cm";

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

std::string Describe(const ClaimRef& ref) {
  return absl::StrCat(ref.ns, "/", ref.name, " (uid ", ref.uid, ")");
}

// "hca/sub" -> "hca": the kubelet matches a container's request by its base name.
std::string BaseRequest(const std::string& request) {
  return request.substr(0, request.find('/'));
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

}  // namespace

Driver::Driver(DriverConfig config, ClaimReader& reader, CdiStore& cdi, Checkpoint& checkpoint,
               std::function<topology::TopologyPtr()> topology, std::shared_ptr<Env> env,
               std::function<topology::TopologyPtr()> rediscover)
    : config_(std::move(config)),
      reader_(reader),
      cdi_(cdi),
      topology_(std::move(topology)),
      rediscover_(std::move(rediscover)),
      env_(std::move(env)),
      checkpoint_(checkpoint) {}

absl::Status Driver::Start() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<PreparedClaims> loaded = checkpoint_.Load();
  if (!loaded.ok()) return loaded.status();
  prepared_ = *std::move(loaded);
  if (absl::Status s = checkpoint_.Save(prepared_); !s.ok()) return s;
  Log()->info("DRA driver {}: {} prepared claim(s) in checkpoint {}", config_.driver_name,
              prepared_.size(), checkpoint_.path());
  return absl::OkStatus();
}

void Driver::LockClaim(const std::string& uid) {
  absl::MutexLock lock(&mu_);
  while (busy_.count(uid) != 0) claim_done_.Wait(&mu_);
  busy_.insert(uid);
}

void Driver::UnlockClaim(const std::string& uid) {
  absl::MutexLock lock(&mu_);
  busy_.erase(uid);
  claim_done_.SignalAll();
}

std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>> Driver::Prepare(
    const std::vector<ClaimRef>& claims) {
  std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>> out;
  // One deadline for the whole call: the kubelet waits for all claims together.
  const absl::Time deadline = absl::Now() + config_.api_timeout;
  for (const ClaimRef& ref : claims) {
    if (out.count(ref.uid)) continue;
    if (ref.uid.empty() || ref.ns.empty() || ref.name.empty()) {
      out.emplace(ref.uid, absl::InvalidArgumentError(absl::StrCat(
                               "claim ", Describe(ref), ": namespace, uid and name are required")));
      continue;
    }
    LockClaim(ref.uid);
    absl::StatusOr<std::vector<PreparedDevice>> r;
    try {
      r = PrepareOne(ref, deadline);
    } catch (const std::exception& e) {  // a library's throw stays this claim's error
      r = absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", e.what()));
    }
    UnlockClaim(ref.uid);
    if (r.ok()) {
      Log()->info("prepared claim {}: {} device(s)", Describe(ref), r->size());
    } else {
      Log()->warn("preparing claim {} failed: {}", Describe(ref), r.status().ToString());
    }
    out.emplace(ref.uid, std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<PreparedDevice>> Driver::PrepareOne(const ClaimRef& ref,
                                                                absl::Time deadline) {
  std::optional<PreparedClaim> known;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = prepared_.find(ref.uid); it != prepared_.end()) known = it->second;
  }
  if (known) {
    // Answered from the checkpoint; the spec is written again if it went away.
    if (!cdi_.Exists(ref.uid)) {
      absl::StatusOr<nlohmann::json> spec = SpecFor(ref, known->devices);
      if (!spec.ok()) return spec.status();
      if (absl::Status s = cdi_.Write(ref.uid, *spec); !s.ok()) return s;
      Log()->info("claim {}: CDI spec re-written from the checkpoint", Describe(ref));
    }
    return Answer(*known);
  }
  absl::StatusOr<std::vector<AllocatedDevice>> devices =
      reader_.Read(ref, config_.driver_name, deadline);
  if (!devices.ok()) return ReadError(ref, devices.status());
  if (devices->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("claim ", Describe(ref), ": its allocation has no device of driver ",
                     config_.driver_name));
  }
  absl::StatusOr<nlohmann::json> spec = SpecFor(ref, *devices);
  if (!spec.ok()) return spec.status();

  PreparedClaim claim{ref, *devices, {CdiDeviceId(config_.driver_name, ref.uid)}};
  if (absl::Status s = cdi_.Write(ref.uid, *spec); !s.ok()) {
    cdi_.Remove(ref.uid).IgnoreError();
    return absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", s.message()));
  }
  absl::MutexLock lock(&mu_);
  prepared_[ref.uid] = claim;
  if (absl::Status s = checkpoint_.Save(prepared_); !s.ok()) {
    prepared_.erase(ref.uid);
    if (absl::Status r = cdi_.Remove(ref.uid); !r.ok()) {
      Log()->error("claim {}: CDI spec left behind: {}", Describe(ref), r.ToString());
    }
    return absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", s.message()));
  }
  return Answer(claim);
}

absl::StatusOr<nlohmann::json> Driver::SpecFor(const ClaimRef& ref,
                                               const std::vector<AllocatedDevice>& devices) {
  for (const AllocatedDevice& d : devices) {
    if (d.pool != config_.node_name) {
      return absl::FailedPreconditionError(absl::StrCat(
          "claim ", Describe(ref), ": device ", d.device, " is in pool ", d.pool,
          ", not in this node's pool ", config_.node_name));
    }
  }
  topology::TopologyPtr snapshot = topology_();
  auto all_known = [&devices](const topology::Topology& t) {
    return std::all_of(devices.begin(), devices.end(), [&t](const AllocatedDevice& d) {
      return FindHca(t, d.device) >= 0;
    });
  };
  // A device we do not know may be an HCA plugged in since the snapshot was taken.
  if ((!snapshot || !all_known(*snapshot)) && rediscover_) {
    if (topology::TopologyPtr fresh = rediscover_()) snapshot = std::move(fresh);
  }
  if (!snapshot) return absl::UnavailableError("no topology snapshot yet");
  std::vector<const topology::Hca*> hcas;
  for (const AllocatedDevice& d : devices) {
    const int idx = FindHca(*snapshot, d.device);
    if (idx < 0) {
      return absl::NotFoundError(absl::StrCat("claim ", Describe(ref), ": device ", d.device,
                                              " is not on node ", config_.node_name));
    }
    const topology::Hca* hca = &snapshot->hcas()[idx];
    if (std::find(hcas.begin(), hcas.end(), hca) == hcas.end()) hcas.push_back(hca);
  }
  // Their device nodes as they are now, and rdma_cm's (as NodeState::Allocate checks them).
  std::vector<std::string_view> paths;
  for (const topology::Hca* hca : hcas) {
    for (const auto& [path, present] : hca->char_devices) paths.push_back(path);
  }
  paths.push_back(kRdmaCm);
  const std::vector<bool> present = env_->ExistAll(paths);
  std::vector<topology::Hca> now;
  now.reserve(hcas.size());
  std::size_t next = 0;
  for (const topology::Hca* hca : hcas) {
    topology::Hca& h = now.emplace_back(*hca);
    for (auto& [path, was] : h.char_devices) was = present[next++];
    const hca::Verdict verdict = hca::Assess(h);
    if (!verdict.usable) {
      return absl::FailedPreconditionError(absl::StrCat("claim ", Describe(ref), ": HCA ", h.name,
                                                        " (", DeviceName(h),
                                                        ") is unusable: ", verdict.reason));
    }
  }
  std::vector<const topology::Hca*> chosen;
  for (const topology::Hca& h : now) chosen.push_back(&h);
  const hca::ContainerAllocation allocation = hca::BuildAllocation(chosen, present.back());
  return BuildCdiSpec(config_.driver_name, ref.uid, allocation, *env_);
}

std::vector<PreparedDevice> Driver::Answer(const PreparedClaim& claim) const {
  std::vector<PreparedDevice> out;
  out.reserve(claim.devices.size());
  for (const AllocatedDevice& d : claim.devices) {
    out.push_back({{BaseRequest(d.request)}, d.pool, d.device, claim.cdi_ids});
  }
  return out;
}

std::map<std::string, absl::Status> Driver::Unprepare(const std::vector<ClaimRef>& claims) {
  std::map<std::string, absl::Status> out;
  for (const ClaimRef& ref : claims) {
    if (out.count(ref.uid)) continue;
    if (ref.uid.empty()) {
      out.emplace(ref.uid, absl::InvalidArgumentError(
                               absl::StrCat("claim ", Describe(ref), ": uid is required")));
      continue;
    }
    LockClaim(ref.uid);
    absl::Status s = UnprepareOne(ref);
    UnlockClaim(ref.uid);
    if (!s.ok()) Log()->warn("unpreparing claim {} failed: {}", Describe(ref), s.ToString());
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
  // Also for a claim not (or no longer) in the checkpoint: a spec a crash left behind.
  if (absl::Status s = cdi_.Remove(ref.uid); !s.ok()) {
    return absl::InternalError(absl::StrCat("claim ", Describe(ref), ": ", s.message()));
  }
  return absl::OkStatus();
}

PreparedClaims Driver::Prepared() const {
  absl::MutexLock lock(&mu_);
  return prepared_;
}

}  // namespace rdp::dra
