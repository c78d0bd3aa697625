#include "dra/slice_sync.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace rdp::dra {

namespace {
std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }
}  // namespace

SliceSync::SliceSync(SlicePublisher& publisher,
                     std::function<std::vector<nlohmann::json>()> desired, Options options)
    : publisher_(publisher), desired_(std::move(desired)), options_(options) {}

SliceSync::~SliceSync() { Stop(); }

void SliceSync::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void SliceSync::Trigger() {
  absl::MutexLock lock(&mu_);
  pending_ = true;
  wake_.Signal();
}

void SliceSync::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void SliceSync::SetRole(Role role) {
  absl::MutexLock lock(&mu_);
  if (status_.role != role) status_.in_sync = false;
  status_.role = role;
  pending_ = true;
  wake_.Signal();
}

SliceSync::Status SliceSync::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

std::uint64_t SliceSync::successes() const {
  absl::MutexLock lock(&mu_);
  return status_.successes;
}

std::uint64_t SliceSync::failures() const {
  absl::MutexLock lock(&mu_);
  return status_.failures;
}

void SliceSync::Run() {
  absl::Duration backoff = options_.first_backoff;
  absl::Time next = absl::InfinitePast();  // when to publish without a trigger
  bool failing = false;
  bool said_waiting = false;
  while (true) {
    Role role;
    {
      absl::MutexLock lock(&mu_);
      // A CondVar and a loop, not Mutex::Await: the condition is then evaluated by this thread
      // under the lock, which ThreadSanitizer sees (Debian's abseil is not instrumented).
      while (!stopping_ &&
             (status_.role == Role::kWaiting || (!pending_ && absl::Now() < next))) {
        if (status_.role == Role::kWaiting && !said_waiting) {
          said_waiting = true;
          Log()->info("not registered with the kubelet yet: no ResourceSlices are published "
                      "until it registers the driver");
        }
        wake_.WaitWithDeadline(&mu_, status_.role == Role::kWaiting ? absl::InfiniteFuture() : next);
      }
      if (stopping_) return;
      pending_ = false;
      role = status_.role;
    }
    absl::Status status;
    try {
      status = publisher_.Publish(role == Role::kPublish ? desired_() : std::vector<nlohmann::json>{},
                                  absl::Now() + options_.publish_timeout);
    } catch (const std::exception& e) {  // never ends the thread, and with it the process
      status = absl::InternalError(absl::StrCat("publishing threw: ", e.what()));
    }
    absl::MutexLock lock(&mu_);
    if (status_.role != role) continue;  // changed meanwhile: publish for the new one
    if (status.ok()) {
      ++status_.successes;
      status_.in_sync = true;
      status_.last_error.clear();
      if (failing) {
        Log()->info("ResourceSlices published again after {} failures", status_.failures);
      }
      if (role == Role::kWithdraw) Log()->info("ResourceSlices withdrawn");
      failing = false;
      backoff = options_.first_backoff;
      next = role == Role::kPublish ? absl::Now() + options_.resync : absl::InfiniteFuture();
    } else {
      ++status_.failures;
      status_.in_sync = false;
      status_.last_error = status.ToString();
      // Logged once per failing stretch, then at debug: an API server down for an hour is one
      // error, not 3600.
      if (!failing) {
        Log()->error("publishing ResourceSlices failed, retrying in {}: {}",
                     absl::FormatDuration(backoff), status.ToString());
      } else {
        Log()->debug("publishing ResourceSlices failed again: {}", status.ToString());
      }
      failing = true;
      next = absl::Now() + backoff;
      backoff = std::min(backoff * 2, options_.resync);
    }
  }
}

}  // namespace rdp::dra
