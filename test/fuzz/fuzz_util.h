#pragma once

// Shared pieces of the fuzz targets: an invariant check that aborts with a message (so libFuzzer
// saves the input), a scratch directory reused across inputs, and quiet logs.

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "base/log.h"

// Aborts with the failed invariant; libFuzzer and the replay runner report it as a crash.
#define FUZZ_CHECK(cond, what)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "%s:%d: invariant failed: %s (%s)\n", __FILE__, __LINE__, #cond,     \
              std::string(what).c_str());                                                   \
      abort();                                                                              \
    }                                                                                       \
  } while (0)

namespace rdp::fuzz {

// A directory made once per process and emptied for each input: in /dev/shm (tmpfs) when there
// is one, since the sysfs target writes a whole tree per input, else in /tmp.
class Scratch {
 public:
  Scratch() {
    std::error_code ec;
    std::string tmpl = std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                           ? "/dev/shm/rdp-fuzz-XXXXXX"
                           : "/tmp/rdp-fuzz-XXXXXX";
    FUZZ_CHECK(::mkdtemp(tmpl.data()) != nullptr, tmpl);
    path_ = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Removes everything inside, never following symlinks.
  void Clear() const {
    std::error_code ec;
    std::error_code rm;
    for (std::filesystem::directory_iterator it(path_, ec), end; !ec && it != end;
         it.increment(ec)) {
      std::filesystem::remove_all(it->path(), rm);
    }
  }

 private:
  std::string path_;
};

// Logs off: a fuzzer's million inputs must not flood stderr with warnings.
inline void QuietLogs() { rdp::SetLogLevel("off"); }

// The process's scratch directory, made on first use, logs turned off first.
inline Scratch& ProcessScratch() {
  static Scratch* const scratch = [] {
    QuietLogs();
    return new Scratch();
  }();
  return *scratch;
}

}  // namespace rdp::fuzz
