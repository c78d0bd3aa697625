#include "serving/single_flight.h"

#include <atomic>
#include <exception>
#include <memory>

#include "base/log.h"

namespace rdp::serving {

SingleFlight::SingleFlight(Start start, Gate gate)
    : start_(std::move(start)), gate_(std::move(gate)) {}

SingleFlight::~SingleFlight() { WaitIdle(); }

void SingleFlight::Request(Then then) {
  {
    absl::MutexLock lock(&mu_);
    if (running_) {
      // A run still at the gate has not started: it answers this call too.
      (started_ ? next_ : current_).push_back(std::move(then));
      return;
    }
    running_ = true;
    started_ = false;
    current_.push_back(std::move(then));
  }
  AtGate();
}

namespace {

// Calls step(next), where next() runs `then` once, whoever calls it: the step, or this function
// when the step throws (logged as `what` failed), so that a throw counts as the step's end.
void OnceThen(const char* what, const std::function<void(std::function<void()>)>& step,
              std::function<void()> then) {
  auto once = std::make_shared<std::atomic<bool>>(false);
  std::function<void()> next = [once, then = std::move(then)] {
    if (!once->exchange(true)) then();
  };
  try {
    step(next);
  } catch (const std::exception& e) {
    rdp::Logger("serving")->error("{} failed: {}", what, e.what());
    next();
  } catch (...) {
    rdp::Logger("serving")->error("{} failed with an unknown exception", what);
    next();
  }
}

}  // namespace

void SingleFlight::AtGate() {
  auto go = [this] {
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
    }
    Run();
  };
  if (gate_) {
    OnceThen("refresh gate", gate_, std::move(go));
  } else {
    go();
  }
}

void SingleFlight::Run() {
  OnceThen("refresh", start_, [this] { Finished(); });
}

void SingleFlight::Finished() {
  std::vector<Then> answered;
  {
    absl::MutexLock lock(&mu_);
    answered.swap(current_);
  }
  // The callbacks run while the run still counts as in flight, so that WaitIdle (and the owner's
  // destructor behind it) cannot return while one of them still reads the owner.
  for (Then& then : answered) then();
  bool again = false;
  {
    absl::MutexLock lock(&mu_);
    if (!next_.empty()) {
      current_.swap(next_);
      started_ = false;
      again = true;
    } else {
      running_ = false;
      idle_.SignalAll();
    }
  }
  if (again) AtGate();
}

void SingleFlight::WaitIdle() {
  absl::MutexLock lock(&mu_);
  while (running_) idle_.Wait(&mu_);
}

}  // namespace rdp::serving
