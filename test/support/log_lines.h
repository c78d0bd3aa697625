#pragma once

// The lines a module's logger (rdp::Logger) writes while a LogLines lives, in order: a test waits
// for what the product logs (a line users grep for, a socket served again, a retry) instead of
// asking the product for a count kept for tests. Only the message is kept, not the time or level.
// spdlog does not guard a logger's sink list: make the LogLines before the threads that log on
// that logger start, and destroy it after they have stopped. Thread-safe otherwise.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace rdp::testing {

class LogLines {
 public:
  // Listens to rdp::Logger(`logger`), from now on.
  explicit LogLines(const std::string& logger);
  ~LogLines();
  LogLines(const LogLines&) = delete;
  LogLines& operator=(const LogLines&) = delete;

  // The lines so far, oldest first.
  std::vector<std::string> lines() const;
  // How many lines so far contain `text`.
  int Count(std::string_view text) const;
  // Waits until `done` holds for the lines so far, or `timeout` passes; whether it holds. `done`
  // runs under the object's lock: it must not call back into it.
  bool WaitUntil(const std::function<bool(const std::vector<std::string>&)>& done,
                 absl::Duration timeout) const;
  // Waits until at least `n` lines contain `text`, or `timeout` passes; whether they do.
  bool WaitForCount(std::string_view text, int n, absl::Duration timeout) const;

 private:
  class Sink;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<Sink> sink_;
};

// How many of `lines` contain `text`.
int CountContaining(const std::vector<std::string>& lines, std::string_view text);
// The index of the last of `lines` that contains `text`; -1 when none does.
int LastContaining(const std::vector<std::string>& lines, std::string_view text);

}  // namespace rdp::testing
