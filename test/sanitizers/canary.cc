// Proof that each sanitizer build catches what it is for, run by ctest in that build only:
//   canary locked      two threads share a counter under absl::Mutex: no report (TSan must see
//                      the mutex: test/sanitizers/tsan_absl_sync.cc)
//   canary race        the same without the lock on one side: TSan reports a data race
//   canary overflow    signed overflow: UBSan reports it
//   canary use-after-free   ASan reports a heap-use-after-free
// The "report" runs pass only when the report appears (see test/sanitizers/CMakeLists.txt).

#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace {

int Shared(bool lock_reader) {
  absl::Mutex mu;
  int x = 0;
  std::thread writer([&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock l(&mu);
      ++x;
    }
  });
  long seen = 0;
  for (int i = 0; i < 1000; ++i) {
    if (lock_reader) {
      absl::MutexLock l(&mu);
      seen += x;
    } else {
      seen += x;
    }
  }
  writer.join();
  return seen >= 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "";
  if (std::strcmp(what, "locked") == 0) return Shared(true);
  if (std::strcmp(what, "race") == 0) return Shared(false);
  if (std::strcmp(what, "overflow") == 0) {
    volatile int big = INT_MAX;
    const int wrapped = big + argc;  // UB: signed overflow
    std::printf("%d\n", wrapped);
    return 0;
  }
  if (std::strcmp(what, "use-after-free") == 0) {
    int* p = new int[4];
    delete[] p;
    volatile int v = p[argc];  // heap-use-after-free
    return v == 0 ? 0 : 0;
  }
  std::fprintf(stderr, "usage: canary locked|race|overflow|use-after-free\n");
  return 2;
}
