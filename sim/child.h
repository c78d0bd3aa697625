#pragma once

// A program run as a child process by the demo, a test or a benchmark (the built
// rdma-device-plugin, most often): started with fork + exec and PR_SET_PDEATHSIG (it dies with
// the thread that started it, so an interrupted run leaves nothing behind), awaited through a
// pidfd with a bound (never an unbounded waitpid), its stdout and stderr collected by a thread
// each so that it never blocks on a full pipe and the caller can wait for a line of its log.

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rdp::sim {

class Child {
 public:
  enum class Output {
    kCapture,            // collected: output(), WaitForOutput()
    kCaptureAndForward,  // collected, and the child's stderr also copied to ours as it comes
    kDiscard,            // to /dev/null
  };
  struct Options {
    // Environment changes for the child: name -> value, or nullopt to unset.
    std::map<std::string, std::optional<std::string>> env;
    Output output = Output::kCapture;
  };

  // Runs `binary args...`. running() is false when it could not be started.
  Child(const std::string& binary, const std::vector<std::string>& args, Options options);
  Child(const std::string& binary, const std::vector<std::string>& args)
      : Child(binary, args, Options()) {}
  // Reap().
  virtual ~Child();
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
  // Waits until the output (stdout and stderr, as they came) contains `text`, or the child's
  // output ended (it exited), or `timeout` passed. Whether it contains `text`.
  bool WaitForOutput(const std::string& text, absl::Duration timeout) const;
  // The same with a test of the whole output so far: until `done(output)` holds.
  bool WaitForOutput(const std::function<bool(const std::string&)>& done,
                     absl::Duration timeout) const;
  // Everything it wrote to stdout, and to stdout and stderr together. Complete once Wait()
  // returned.
  std::string stdout_text() const;
  std::string output() const;
  const std::string& binary() const { return binary_; }

 protected:
  // SIGKILLs a child still running, reaps it and collects the rest of its output. Idempotent.
  void Reap();

 private:
  void Collect(int fd, bool is_stdout, bool forward);

  std::string binary_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::vector<std::thread> readers_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  std::string stdout_ ABSL_GUARDED_BY(mu_);
  std::string output_ ABSL_GUARDED_BY(mu_);
  int open_pipes_ ABSL_GUARDED_BY(mu_) = 0;
};

// "HOST:PORT" of the metrics endpoint of an rdma-device-plugin child (--metrics-address), from
// the "metrics: serving on HOST:PORT" line it logs at info before it serves (cmd/run_server.h);
// "" when that line did not come within `timeout`.
std::string WaitForMetricsAddress(const Child& plugin, absl::Duration timeout);

}  // namespace rdp::sim
