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

void SingleFlight::AtGate() {
  // go() counts once, whoever calls it (the gate, or the catch below).
  auto once = std::make_shared<std::atomic<bool>>(false);
  Then go = [this, once] {
    if (once->exchange(true)) return;
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
    }
    Run();
  };
  if (!gate_) {
    go();
    return;
  }
  try {
    gate_(go);
  } catch (const std::exception& e) {
    rdp::Logger("serving")->error("refresh gate failed: {}", e.what());
    go();
  } catch (...) {
    rdp::Logger("serving")->error("refresh gate failed with an unknown exception");
    go();
  }
}

void SingleFlight::Run() {
  // finished() counts once per run, whoever calls it (the operation, or the catch below).
  auto once = std::make_shared<std::atomic<bool>>(false);
  Then finished = [this, once] {
    if (!once->exchange(true)) Finished();
  };
  try {
    start_(finished);
  } catch (const std::exception& e) {
    rdp::Logger("serving")->error("refresh failed: {}", e.what());
    finished();
  } catch (...) {
    rdp::Logger("serving")->error("refresh failed with an unknown exception");
    finished();
  }
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
