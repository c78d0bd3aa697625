#include "serving/single_flight.h"

#include <atomic>
#include <exception>
#include <memory>

#include "base/log.h"

namespace rdp::serving {

SingleFlight::SingleFlight(Start start) : start_(std::move(start)) {}

SingleFlight::~SingleFlight() { WaitIdle(); }

void SingleFlight::Request(Then then) {
  {
    absl::MutexLock lock(&mu_);
    if (running_) {
      next_.push_back(std::move(then));
      return;
    }
    running_ = true;
    current_.push_back(std::move(then));
  }
  Run();
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
      again = true;
    } else {
      running_ = false;
      idle_.SignalAll();
    }
  }
  if (again) Run();
}

void SingleFlight::WaitIdle() {
  absl::MutexLock lock(&mu_);
  while (running_) idle_.Wait(&mu_);
}

}  // namespace rdp::serving
