#include "dra/claim_status.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace rdp::dra {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

std::string Describe(const ClaimRef& ref) {
  return absl::StrCat(ref.ns, "/", ref.name, " (uid ", ref.uid, ")");
}

bool IsDriver(const nlohmann::json& entry, const std::string& driver) {
  if (!entry.is_object()) return false;
  const auto it = entry.find("driver");
  return it != entry.end() && it->is_string() && it->get_ref<const std::string&>() == driver;
}

// What identifies an entry (the list's keys: driver, pool, device, shareID).
std::string EntryKey(const nlohmann::json& entry) {
  return absl::StrCat(entry.value("pool", ""), "/", entry.value("device", ""), "/",
                      entry.value("shareID", ""));
}

// Done: not retried (the next prepare of the claim tries again).
bool Final(const absl::Status& s) {
  return s.ok() || absl::IsNotFound(s) || absl::IsInvalidArgument(s) ||
         absl::IsPermissionDenied(s) || absl::IsFailedPrecondition(s);
}

}  // namespace

nlohmann::json MergeDeviceStatuses(const nlohmann::json& current, const std::string& driver,
                                   const std::vector<nlohmann::json>& ours) {
  nlohmann::json out = nlohmann::json::array();
  if (current.is_array()) {
    for (const nlohmann::json& entry : current) {
      if (!IsDriver(entry, driver)) out.push_back(entry);
    }
  }
  for (const nlohmann::json& entry : ours) out.push_back(entry);
  return out;
}

std::vector<nlohmann::json> DriverDeviceStatuses(const nlohmann::json& current,
                                                 const std::string& driver) {
  std::vector<nlohmann::json> out;
  if (!current.is_array()) return out;
  for (const nlohmann::json& entry : current) {
    if (IsDriver(entry, driver)) out.push_back(entry);
  }
  return out;
}

ApiClaimStatusWriter::ApiClaimStatusWriter(std::shared_ptr<kube::Client> client, std::string driver)
    : ApiClaimStatusWriter(std::move(client), std::move(driver), Options()) {}

ApiClaimStatusWriter::ApiClaimStatusWriter(std::shared_ptr<kube::Client> client, std::string driver,
                                           Options options)
    : client_(std::move(client)),
      driver_(std::move(driver)),
      options_(options),
      rng_(std::random_device()()) {}

ApiClaimStatusWriter::~ApiClaimStatusWriter() { Stop(); }

void ApiClaimStatusWriter::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void ApiClaimStatusWriter::Stop() {
  std::size_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  {
    absl::MutexLock lock(&mu_);
    dropped = pending_.size();
    pending_.clear();
    wake_.SignalAll();
  }
  if (dropped > 0) {
    Log()->info("claim status: {} write(s) not done at stop (the next prepare or unprepare of "
                "those claims writes them)",
                dropped);
  }
}

void ApiClaimStatusWriter::Set(const ClaimRef& ref, std::vector<nlohmann::json> devices) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  if (!pending_.count(ref.uid) && in_flight_ != ref.uid) {
    const auto it = written_.find(ref.uid);
    if (it != written_.end() && it->second == devices) return;  // already there
  }
  pending_[ref.uid] = Pending{ref, std::move(devices), absl::InfinitePast(), 0, ++generation_};
  wake_.SignalAll();  // the writing thread (WaitIdle waits on it too)
}

ApiClaimStatusWriter::Counts ApiClaimStatusWriter::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

bool ApiClaimStatusWriter::WaitIdle(absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  // A CondVar loop, not Mutex::Await (the house rule of dra/slice_sync.cc).
  while (!pending_.empty() || in_flight_) {
    if (wake_.WaitWithDeadline(&mu_, until)) return pending_.empty() && !in_flight_;
  }
  return true;
}

absl::Duration ApiClaimStatusWriter::Backoff(int failures) {
  const double factor = std::pow(2.0, std::max(0, failures - 1));
  const absl::Duration bound = std::min(options_.max_backoff, options_.initial_backoff * factor);
  std::uniform_real_distribution<double> half_to_one(0.5, 1.0);
  return bound * half_to_one(rng_);
}

absl::Status ApiClaimStatusWriter::Write(const ClaimRef& ref,
                                         const std::vector<nlohmann::json>& devices,
                                         absl::Time deadline) {
  const std::string path =
      absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", kube::PercentEncode(ref.ns),
                   "/resourceclaims/", kube::PercentEncode(ref.name));
  const std::string what = absl::StrCat("claim ", Describe(ref), ": ");
  absl::Status last;
  for (int attempt = 1; attempt <= options_.conflict_attempts; ++attempt) {
    absl::StatusOr<kube::Response> got = client_->Get(path, deadline);
    if (!got.ok()) return got.status();
    nlohmann::json claim = std::move(got->body);
    if (!claim.is_object()) return absl::InternalError(absl::StrCat(what, "not an object"));
    const nlohmann::json meta = claim.value("metadata", nlohmann::json::object());
    const std::string uid = meta.is_object() ? meta.value("uid", "") : "";
    if (!ref.uid.empty() && uid != ref.uid) {
      return absl::NotFoundError(
          absl::StrCat(what, "the API server holds uid ", uid.empty() ? "(none)" : uid));
    }
    if (!claim.contains("status") || !claim["status"].is_object()) {
      claim["status"] = nlohmann::json::object();
    }
    nlohmann::json& status = claim["status"];
    const nlohmann::json current = status.value("devices", nlohmann::json());
    if (DriverDeviceStatuses(current, driver_) == devices) return absl::OkStatus();
    nlohmann::json merged = MergeDeviceStatuses(current, driver_, devices);
    if (merged.empty()) {
      status.erase("devices");
    } else {
      status["devices"] = std::move(merged);
    }
    absl::StatusOr<kube::Response> put = client_->Put(path + "/status", claim, deadline);
    if (absl::IsAborted(put.status())) {  // 409: someone wrote the claim since our GET
      last = put.status();
      continue;
    }
    if (!put.ok()) return put.status();
    // Compare what the server kept with what we sent.
    const nlohmann::json& answer = put->body;
    const nlohmann::json kept =
        answer.is_object() && answer.contains("status") && answer["status"].is_object()
            ? answer["status"].value("devices", nlohmann::json())
            : nlohmann::json();
    std::vector<std::string> sent_keys, kept_keys;
    for (const nlohmann::json& e : devices) sent_keys.push_back(EntryKey(e));
    for (const nlohmann::json& e : DriverDeviceStatuses(kept, driver_)) {
      kept_keys.push_back(EntryKey(e));
    }
    if (!devices.empty() && kept_keys != sent_keys) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, "the API server did not keep status.devices (", kept_keys.size(), " of ",
          sent_keys.size(),
          " entries): its feature gate DRAResourceClaimDeviceStatus is off (GA in 1.37)"));
    }
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat(what, "conflicts ", options_.conflict_attempts,
                                         " times in a row; last: ", last.message()));
}

// Takes the pending write due first (none: waits for a Set or its due time), or nullopt at stop.
std::optional<ApiClaimStatusWriter::Pending> ApiClaimStatusWriter::Next() {
  absl::MutexLock lock(&mu_);
  // A CondVar and a loop, not Mutex::Await (the house rule of dra/slice_sync.cc).
  while (!stopping_) {
    auto next = pending_.end();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (next == pending_.end() || it->second.due < next->second.due) next = it;
    }
    const absl::Time due = next == pending_.end() ? absl::InfiniteFuture() : next->second.due;
    if (next != pending_.end() && absl::Now() >= due) {
      in_flight_ = next->first;
      return next->second;
    }
    wake_.WaitWithDeadline(&mu_, due);
  }
  return std::nullopt;
}

void ApiClaimStatusWriter::Done(const Pending& taken, const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  in_flight_.reset();
  wake_.SignalAll();  // WaitIdle
  const std::string& uid = taken.ref.uid;
  if (s.ok()) {
    ++counts_.successes;
    if (taken.devices.empty()) {
      written_.erase(uid);
    } else {
      written_[uid] = taken.devices;
    }
    Log()->info("claim {}: status.devices {}", Describe(taken.ref),
                taken.devices.empty() ? std::string("has no entry of ours now")
                                      : absl::StrCat("has our ", taken.devices.size(), " entr",
                                                     taken.devices.size() == 1 ? "y" : "ies"));
  } else {
    written_.erase(uid);
    if (absl::IsNotFound(s)) {
      Log()->info("claim status: nothing written, the claim is gone: {}", s.ToString());
    } else {
      ++counts_.failures;
    }
    if (absl::IsFailedPrecondition(s)) {
      if (!warned_dropped_) Log()->warn("claim status: {}", s.ToString());
      warned_dropped_ = true;
    } else if (Final(s) && !absl::IsNotFound(s)) {
      Log()->error("claim status: writing status.devices failed, not retried (the next prepare "
                   "of the claim tries again){}: {}",
                   absl::IsPermissionDenied(s)
                       ? " (the driver needs update on resourceclaims/status: chart >= 0.12.0)"
                       : "",
                   s.ToString());
    }
  }
  const auto it = pending_.find(uid);
  // A newer Set of the claim is pending (or it was dropped at stop): that one goes on.
  if (it == pending_.end() || it->second.generation != taken.generation) return;
  if (Final(s)) {
    pending_.erase(it);
    return;
  }
  const int failures = ++it->second.failures;
  const absl::Duration wait = Backoff(failures);
  it->second.due = absl::Now() + wait;
  // Once per failing stretch at warn: an API server down for an hour is not 60 warnings a claim.
  if (failures == 1) {
    Log()->warn("claim status: writing status.devices failed, retrying in {}: {}",
                absl::FormatDuration(wait), s.ToString());
  } else {
    Log()->debug("claim status: failed again (attempt {}), retrying in {}: {}", failures,
                 absl::FormatDuration(wait), s.ToString());
  }
}

void ApiClaimStatusWriter::Run() {
  while (std::optional<Pending> taken = Next()) {
    absl::Status s;
    try {
      s = Write(taken->ref, taken->devices, absl::Now() + options_.timeout);
    } catch (const std::exception& e) {  // a library's throw (JSON): this write's failure
      s = absl::InternalError(absl::StrCat("claim ", Describe(taken->ref), ": ", e.what()));
    }
    Done(*taken, s);
  }
}

}  // namespace rdp::dra
