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
  watch_thread_ = std::thread([this] { WatchLoop(); });
}

absl::Duration SliceSync::Jittered(absl::Duration b) {
  return b * std::uniform_real_distribution<double>(0.5, 1.0)(rng_);
}

void SliceSync::Trigger() {
  absl::MutexLock lock(&mu_);
  pending_ = true;
  wake_.SignalAll();
}

void SliceSync::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_watch_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
}

void SliceSync::SetRole(Role role) {
  absl::MutexLock lock(&mu_);
  if (status_.role != role) status_.in_sync = false;
  status_.role = role;
  pending_ = true;
  wake_.SignalAll();
}

SliceSync::Status SliceSync::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void SliceSync::Run() {
  absl::Duration backoff = options_.first_backoff;
  bool failing = false;
  bool said_waiting = false;
  while (true) {
    Role role;
    {
      absl::MutexLock lock(&mu_);
      // A CondVar and a loop, not Mutex::Await: the condition is then evaluated by this thread
      // under the lock, which ThreadSanitizer sees (Debian's abseil is not instrumented).
      // While the watch is up, it says when to publish: no resync by timer.
      while (!stopping_ && (status_.role == Role::kWaiting ||
                            (!pending_ && (status_.watching || absl::Now() < resync_at_)))) {
        if (status_.role == Role::kWaiting && !said_waiting) {
          said_waiting = true;
          Log()->info("not registered with the kubelet yet: no ResourceSlices are published "
                      "until it registers the driver");
        }
        wake_.WaitWithDeadline(&mu_, status_.role == Role::kWaiting || status_.watching
                                         ? absl::InfiniteFuture()
                                         : resync_at_);
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
      resync_at_ =
          role == Role::kPublish ? absl::Now() + options_.resync : absl::InfiniteFuture();
      wake_.SignalAll();  // the watch starts after the first success
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
      resync_at_ = absl::Now() + Jittered(backoff);
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }
}

void SliceSync::WatchLoop() {
  absl::Duration backoff = options_.first_backoff;
  std::uint64_t failures = 0;  // of this stretch
  auto cancelled = [this] { return stop_watch_.load(); };
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Only while publishing, and from a pool a publish has listed.
      while (!stopping_ && (status_.role != Role::kPublish || status_.successes == 0)) {
        wake_.Wait(&mu_);
      }
      if (stopping_) return;
    }
    absl::Status s;
    try {
      s = publisher_.Watch(
          cancelled,
          [&] {
            absl::MutexLock lock(&mu_);
            status_.watching = true;
            if (failures > 0) {
              Log()->info("in sync with the API server again: watching the node's ResourceSlices "
                          "after {} failures",
                          failures);
            }
            failures = 0;
            backoff = options_.first_backoff;
          },
          [this] { Trigger(); });
    } catch (const std::exception& e) {  // never ends the thread, and with it the process
      s = absl::InternalError(absl::StrCat("watching threw: ", e.what()));
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (s.ok()) continue;  // the server's timeout: watch on from the last event
    // No watch up: the Run thread resyncs by timer until one is, the first time a resync period
    // from now. Not at once: a watch that failed with the network (an API server restart) goes
    // on from its last event when it is back, and a publish now would only add its retries to
    // the watch's while the server is away.
    status_.watching = false;
    resync_at_ = std::max(resync_at_, absl::Now() + options_.resync);
    wake_.SignalAll();
    if (absl::IsUnimplemented(s)) {
      Log()->info("the API client cannot watch: the slices are checked every {}",
                  absl::FormatDuration(options_.resync));
      return;
    }
    if (absl::IsAborted(s) || absl::IsFailedPrecondition(s)) {
      // The history is lost: publish (which lists afresh) now, and watch again from the list of
      // a publish that succeeds after this point.
      pending_ = true;
      const std::uint64_t seen = status_.successes;
      while (!stopping_ && status_.successes == seen) wake_.Wait(&mu_);
      continue;
    }
    ++failures;
    ++status_.watch_failures;
    if (failures == 1) {
      Log()->warn("watching the node's ResourceSlices failed, again in about {}: {}",
                  absl::FormatDuration(backoff), s.ToString());
    } else {
      Log()->debug("watching the node's ResourceSlices failed again: {}", s.ToString());
    }
    const absl::Time until = absl::Now() + Jittered(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
    while (!stopping_ && absl::Now() < until) wake_.WaitWithDeadline(&mu_, until);
  }
}

}  // namespace rdp::dra
