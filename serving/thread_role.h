#pragma once

// A thread role: state that one thread at a time owns without a lock (a server's lifecycle
// thread, say, which also runs in Start before the thread exists and in Stop after it is
// joined), checked by clang's -Wthread-safety instead of a comment. Fields are
// ABSL_GUARDED_BY(role); functions that run in the role are ABSL_EXCLUSIVE_LOCKS_REQUIRED(role);
// the few places that take the role up (a thread's entry point, Start before the thread
// starts, Stop after the join) hold a ThreadRole::Scope. Taking the role up costs one atomic
// exchange; two threads holding it at once is a bug and aborts in every build.

#include <atomic>
#include <cstdlib>

#include "absl/base/thread_annotations.h"

namespace rdp::serving {

class ABSL_LOCKABLE ThreadRole {
 public:
  ThreadRole() = default;
  ThreadRole(const ThreadRole&) = delete;
  ThreadRole& operator=(const ThreadRole&) = delete;

  class ABSL_SCOPED_LOCKABLE Scope {
   public:
    explicit Scope(ThreadRole* role) ABSL_EXCLUSIVE_LOCK_FUNCTION(role) : role_(role) {
      if (role_->held_.exchange(true, std::memory_order_acquire)) std::abort();
    }
    ~Scope() ABSL_UNLOCK_FUNCTION() { role_->held_.store(false, std::memory_order_release); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ThreadRole* const role_;
  };

 private:
  std::atomic<bool> held_{false};
};

}  // namespace rdp::serving
