#pragma once

// A program run as a child process by a test or a benchmark (the built rdma-device-plugin, most
// often): started with fork + exec and PR_SET_PDEATHSIG (it dies with its parent, so an
// interrupted run leaves nothing behind), awaited through a pidfd with a bound (never an
// unbounded waitpid), its stdout and stderr collected by a thread so that it never blocks on a
// full pipe and a test can wait for a line of its log.

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rdp::testing {

class Child {
 public:
  enum class Output { kCapture, kDiscard };
  struct Options {
    // Environment changes for the child: name -> value, or nullopt to unset.
    std::map<std::string, std::optional<std::string>> env;
    Output output = Output::kCapture;
  };

  // Runs `binary args...`. running() is false when it could not be started.
  Child(const std::string& binary, const std::vector<std::string>& args, Options options);
  Child(const std::string& binary, const std::vector<std::string>& args)
      : Child(binary, args, Options()) {}
  // SIGKILLs a child still running and reaps it; when the current test has failed, prints the
  // tail of its output.
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool running() const { return pid_ > 0; }
  // Whether the child has exited (it is not reaped: Wait() still gives its exit code).
  bool Exited() const;
  pid_t pid() const { return pid_; }
  void Signal(int sig) const;

  // The exit code, or -1 when the child did not exit within `timeout` (it is SIGKILLed then),
  // died of a signal, or never started.
  int Wait(absl::Duration timeout);
  // Waits until the output (stdout and stderr, as they came) contains `text`.
  bool WaitForOutput(const std::string& text, absl::Duration timeout) const;
  // Everything it wrote to stdout, and to stdout and stderr together. Complete once Wait()
  // returned.
  std::string stdout_text() const;
  std::string output() const;

 private:
  void Collect(int fd, bool is_stdout);

  std::string binary_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::vector<std::thread> readers_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  std::string stdout_ ABSL_GUARDED_BY(mu_);
  std::string output_ ABSL_GUARDED_BY(mu_);
};

// Runs `binary args...` to its end (bounded by `timeout`) and returns its exit code (-1 as Wait).
int RunToEnd(const std::string& binary, const std::vector<std::string>& args,
             absl::Duration timeout = absl::Seconds(20), Child::Options options = {});

}  // namespace rdp::testing
