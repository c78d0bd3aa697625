#include "test/support/log_lines.h"

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "spdlog/details/null_mutex.h"
#include "spdlog/sinks/base_sink.h"

namespace rdp::testing {

// base_sink's own lock is a null one: lines_ has its own, which waiters wait on.
class LogLines::Sink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 public:
  std::vector<std::string> lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  bool WaitUntil(const std::function<bool(const std::vector<std::string>&)>& done,
                 absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    while (!done(lines_)) {
      if (changed_.WaitWithDeadline(&mu_, deadline)) return done(lines_);  // timed out
    }
    return true;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
    changed_.SignalAll();
  }
  void flush_() override {}

 private:
  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

LogLines::LogLines(const std::string& logger)
    : logger_(rdp::Logger(logger)), sink_(std::make_shared<Sink>()) {
  logger_->sinks().push_back(sink_);
}

LogLines::~LogLines() {
  auto& sinks = logger_->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
}

std::vector<std::string> LogLines::lines() const { return sink_->lines(); }

int LogLines::Count(std::string_view text) const { return CountContaining(lines(), text); }

bool LogLines::WaitUntil(const std::function<bool(const std::vector<std::string>&)>& done,
                         absl::Duration timeout) const {
  return sink_->WaitUntil(done, absl::Now() + timeout);
}

bool LogLines::WaitForCount(std::string_view text, int n, absl::Duration timeout) const {
  return WaitUntil(
      [&](const std::vector<std::string>& lines) { return CountContaining(lines, text) >= n; },
      timeout);
}

int CountContaining(const std::vector<std::string>& lines, std::string_view text) {
  return static_cast<int>(std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
    return l.find(text) != std::string::npos;
  }));
}

int LastContaining(const std::vector<std::string>& lines, std::string_view text) {
  for (int i = static_cast<int>(lines.size()) - 1; i >= 0; --i) {
    if (lines[i].find(text) != std::string::npos) return i;
  }
  return -1;
}

}  // namespace rdp::testing
