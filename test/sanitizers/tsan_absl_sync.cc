// TSan builds only (RDP_SANITIZE=thread). Debian's abseil is not built with -fsanitize=thread,
// so TSan cannot see absl::Mutex and absl::CondVar synchronise: every access guarded by one, in
// our code or in gRPC's (libgpr locks with absl::Mutex), would look like a race. This file
// defines those functions in the executable, which the dynamic linker then binds every caller to
// (ours, gRPC's, abseil's own Notification); each calls abseil's definition (dlsym RTLD_NEXT) and
// reports the acquire or release to TSan's dynamic-annotation interface, so that TSan checks
// them as it checks pthread mutexes. Wait functions release the mutex and take it again.
//
// The mangled names are those of Debian 12's abseil (inline namespace "debian3"); with another
// abseil the lookup fails and the process aborts naming the symbol.

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

extern "C" {
void AnnotateRWLockAcquired(const char* file, int line, const volatile void* lock, long is_w);
void AnnotateRWLockReleased(const char* file, int line, const volatile void* lock, long is_w);
}

namespace {

template <typename Fn>
Fn Real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in abseil: %s\n", name, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

#define RDP_REAL(type, mangled)                      \
  static const auto real = Real<type>(mangled)

void Acquired(const void* mu, bool write) { AnnotateRWLockAcquired(__FILE__, __LINE__, mu, write); }
void Released(const void* mu, bool write) { AnnotateRWLockReleased(__FILE__, __LINE__, mu, write); }

// abseil's deadlock detector keeps its graph under a lock TSan cannot see either; TSan detects
// lock-order inversions itself.
const bool kDetectorOff = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  RDP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquired(this, true);
}

void Mutex::Unlock() {
  RDP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Released(this, true);
  real(this);
}

bool Mutex::TryLock() {
  RDP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquired(this, true);
  return locked;
}

void Mutex::ReaderLock() {
  RDP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquired(this, false);
}

void Mutex::ReaderUnlock() {
  RDP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Released(this, false);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  RDP_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  Acquired(this, true);
}

void Mutex::Await(const Condition& cond) {
  RDP_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Released(this, true);
  real(this, cond);
  Acquired(this, true);
}

bool Mutex::ReaderTryLock() {
  RDP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquired(this, false);
  return locked;
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  RDP_REAL(void (*)(Mutex*, const Condition&),
           "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  real(this, cond);
  Acquired(this, false);
}

// The *WithDeadline functions return holding the mutex whether or not the condition became
// true. The *WithTimeout ones are written in terms of them here, as abseil's own may call them
// and would report twice (abseil's Notification::WaitForNotificationWithTimeout is one caller).
bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  RDP_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
           "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool met = real(this, cond, deadline);
  Acquired(this, true);
  return met;
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  return LockWhenWithDeadline(cond, absl::Now() + timeout);
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  RDP_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
           "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool met = real(this, cond, deadline);
  Acquired(this, false);
  return met;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  return ReaderLockWhenWithDeadline(cond, absl::Now() + timeout);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  RDP_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
           "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Released(this, true);
  const bool met = real(this, cond, deadline);
  Acquired(this, true);
  return met;
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  return AwaitWithDeadline(cond, absl::Now() + timeout);
}

void CondVar::Wait(Mutex* mu) {
  RDP_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Released(mu, true);
  real(this, mu);
  Acquired(mu, true);
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  RDP_REAL(bool (*)(CondVar*, Mutex*, absl::Time),
           "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Released(mu, true);
  const bool timed_out = real(this, mu, deadline);
  Acquired(mu, true);
  return timed_out;
}

// abseil's own WaitWithTimeout calls WaitWithDeadline, which would report the release twice.
bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  return WaitWithDeadline(mu, absl::Now() + timeout);
}

ABSL_NAMESPACE_END
}  // namespace absl
