#pragma once

// Happens-before edges that gRPC's callback API guarantees but ThreadSanitizer cannot see.
//
// An operation a reactor starts on one thread (StartWrite, Finish, a client call) completes in a
// reaction that gRPC runs on another, after passing it through libgrpc's completion queue, which
// is not built for TSan. So in TSan builds, whatever the starting thread wrote before the
// operation looks unordered with what the reaction reads. HappensBefore(obj) right before
// starting an operation, and HappensAfter(obj) first thing in each reaction, state that edge for
// the reactor (or call) object `obj`. No-ops in every other build.

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDP_TSAN 1
#endif
#endif
#if !defined(RDP_TSAN) && defined(__SANITIZE_THREAD__)
#define RDP_TSAN 1
#endif

#ifdef RDP_TSAN
extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}
#endif

namespace rdp::serving {

inline void HappensBefore(const void* obj) {
#ifdef RDP_TSAN
  __tsan_release(const_cast<void*>(obj));
#else
  (void)obj;
#endif
}

inline void HappensAfter(const void* obj) {
#ifdef RDP_TSAN
  __tsan_acquire(const_cast<void*>(obj));
#else
  (void)obj;
#endif
}

}  // namespace rdp::serving
