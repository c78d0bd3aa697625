#include "dra/slice_sync.h"

#include <algorithm>
#include <utility>

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

std::uint64_t SliceSync::successes() const {
  absl::MutexLock lock(&mu_);
  return successes_;
}

std::uint64_t SliceSync::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

void SliceSync::Run() {
  absl::Duration backoff = options_.first_backoff;
  absl::Time next = absl::InfinitePast();  // when to publish without a trigger
  bool failing = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // A CondVar and a loop, not Mutex::Await: the condition is then evaluated by this thread
      // under the lock, which ThreadSanitizer sees (Debian's abseil is not instrumented).
      while (!stopping_ && !pending_ && absl::Now() < next) wake_.WaitWithDeadline(&mu_, next);
      if (stopping_) return;
      pending_ = false;
    }
    absl::Status status = publisher_.Publish(desired_(), absl::Now() + options_.publish_timeout);
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      ++successes_;
      if (failing) Log()->info("ResourceSlices published again after {} failures", failures_);
      failing = false;
      backoff = options_.first_backoff;
      next = absl::Now() + options_.resync;
    } else {
      ++failures_;
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
