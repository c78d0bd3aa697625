#include "serving/rate_floor.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <grpcpp/alarm.h>

#include "absl/time/clock.h"

namespace rdp::serving {

After AlarmAfter() {
  return [](absl::Duration delay, std::function<void()> fn) {
    // The alarm deletes itself once it has run: gRPC keeps its own reference while the callback
    // runs.
    auto* alarm = new grpc::Alarm;
    alarm->Set(absl::ToChronoTime(absl::Now() + delay), [alarm, fn = std::move(fn)](bool) {
      fn();
      delete alarm;
    });
  };
}

std::shared_ptr<RateFloor> RateFloor::Make(Options options) {
  return std::shared_ptr<RateFloor>(new RateFloor(std::move(options)));
}

RateFloor::RateFloor(Options options) : options_(std::move(options)) {
  tokens_ = std::max(1, options_.burst);
}

bool RateFloor::Pass(std::function<void()> go) {
  absl::Duration wait;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || options_.per_second <= 0) {
      wait = absl::ZeroDuration();
    } else if (!waiting_.empty()) {
      waiting_.push_back(std::move(go));  // after those before it, on their timer
      return true;
    } else {
      wait = Take(options_.now());
      if (wait > absl::ZeroDuration()) {
        waiting_.push_back(std::move(go));  // the first waiting: it sets the timer
      }
    }
  }
  if (wait <= absl::ZeroDuration()) {
    go();
    return false;
  }
  SetTimer(wait);
  return true;
}

void RateFloor::Stop() {
  std::deque<std::function<void()>> waiting;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    waiting.swap(waiting_);
  }
  for (auto& go : waiting) go();
}

absl::Duration RateFloor::Take(absl::Time now) {
  const double burst = std::max(1, options_.burst);
  // A clock that went back (the wall clock set back) refills nothing, and counts from there on:
  // waiting for it to catch up would hold every List for as long as it went back.
  if (now > refilled_) {
    const double refill = absl::ToDoubleSeconds(now - refilled_) * options_.per_second;
    tokens_ = std::min(burst, tokens_ + refill);
  }
  refilled_ = now;
  // Within rounding of a whole token counts as one: a timer set for the exact wait must find it.
  constexpr double kSlack = 1e-9;
  if (tokens_ >= 1 - kSlack) {
    tokens_ = std::max(0.0, tokens_ - 1);
    return absl::ZeroDuration();
  }
  return absl::Ceil(absl::Seconds((1 - tokens_) / options_.per_second), absl::Microseconds(1));
}

void RateFloor::Release() {
  std::vector<std::function<void()>> go;
  absl::Duration wait = absl::ZeroDuration();
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.now();
    while (!waiting_.empty()) {
      wait = Take(now);
      if (wait > absl::ZeroDuration()) break;
      go.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
    if (waiting_.empty()) wait = absl::ZeroDuration();  // else the timer is set again
  }
  for (auto& g : go) g();
  if (wait > absl::ZeroDuration()) SetTimer(wait);
}

void RateFloor::SetTimer(absl::Duration delay) {
  std::weak_ptr<RateFloor> weak = weak_from_this();
  auto fire = [weak] {
    if (std::shared_ptr<RateFloor> floor = weak.lock()) floor->Release();
  };
  if (options_.after) {
    options_.after(delay, std::move(fire));
  } else {
    AlarmAfter()(delay, std::move(fire));
  }
}

}  // namespace rdp::serving
