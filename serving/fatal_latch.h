#pragma once

// How a serving lifecycle (the device plugin's PluginServer, dra::DraServer) ends when one of its
// background threads cannot go on: the first such error is kept, and the thread waiting for a
// stop signal (Wait) wakes with it, so that the process exits non-zero and the kubelet restarts
// the pod rather than it serving stale state. Thread-safe.

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace rdp::serving {

class FatalLatch {
 public:
  FatalLatch();  // opens its eventfd; ok() says whether that worked
  ~FatalLatch();
  FatalLatch(const FatalLatch&) = delete;
  FatalLatch& operator=(const FatalLatch&) = delete;

  bool ok() const { return fd_ >= 0; }
  // Keeps `error` when it is the first and wakes Wait; true then, so that the caller logs it
  // once. False when an error was already kept.
  bool Raise(const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until `stop_fd` (a signalfd) is readable: OK; or until Raise: the kept error.
  // Internal naming errno when poll(2) fails.
  absl::Status Wait(int stop_fd) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int fd_;
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdp::serving
