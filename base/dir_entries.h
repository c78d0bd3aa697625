#pragma once

// The entries of a few directories, kept current by inotify, so that "is this device node there"
// costs no path walk. Allocate checks every device node of the HCAs it hands out (a dozen for
// four HCAs) at the call, and on a VM each stat(2) costs one to two microseconds of walking
// "/host/dev/infiniband/uverbsN"; here a call costs one read(2) of the inotify queue.
//
// Each answer is as current as a stat at the call: inotify queues the event of a change inside
// the system call that makes it, and every queued event is applied before an answer. A listing
// is re-read when the queue overflowed, when the directory itself goes (deleted, moved, its file
// system unmounted: the next call watches the path afresh) and, for changes no event reports (a
// file system mounted over the directory), when it is older than max_age.
//
// Only for directories on file systems that report their changes to inotify: /dev (devtmpfs and
// tmpfs do, for the kernel's own device nodes too), not sysfs or procfs. Thread-safe.

#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rdp {

class DirEntries {
 public:
  // Paths are asked as the node spells them and read under `root` ("/": as given), as Env's
  // trees are (base/env.h).
  explicit DirEntries(std::string root = "/",
                      std::chrono::steady_clock::duration max_age = std::chrono::seconds(10),
                      std::size_t max_dirs = 8);
  ~DirEntries();
  DirEntries(const DirEntries&) = delete;
  DirEntries& operator=(const DirEntries&) = delete;

  // Whether anything is at `path` (under the root), links followed, as stat(2) would answer;
  // nullopt when this cannot answer (inotify or the watch unavailable, its directory not a
  // directory or not listable, more than max_dirs directories asked about, a path ending in "/",
  // "." or ".."): the caller stats.
  std::optional<bool> Exists(std::string_view path);
  // Exists for each of `paths`, in their order, after one read of the queue: what a call that
  // checks a dozen device nodes asks. Paths that do not start with `within` are nullopt.
  std::vector<std::optional<bool>> ExistAll(const std::vector<std::string_view>& paths,
                                            std::string_view within = "/");

  // Listings read so far (the first of each directory included): for tests.
  int listings() const;

 private:
  enum class Kind : char { kPlain, kLink };  // a link is stat'ed at each answer
  struct Dir {
    std::string path;  // as asked: the key of wd_
    std::string host;  // where it is read
    std::map<std::string, Kind, std::less<>> entries;
    std::chrono::steady_clock::time_point listed;
  };

  // Makes the inotify instance at the first call and applies every queued event; false when
  // the cache is off (no instance, or the queue could not be read).
  bool Ready();
  // Exists for one path, the queue drained; `now` for the listing's age.
  std::optional<bool> Answer(std::string_view path, std::chrono::steady_clock::time_point now);
  // `path` (a path as asked) on this machine.
  std::string Host(std::string_view path) const;
  // Applies every queued event; false when the queue could not be read (the cache is off).
  bool Drain();
  // (Re)reads `d`'s entries; false when it cannot be listed.
  bool List(Dir& d);
  // `name` of `d` as it is now (lstat): recorded, or erased when it is gone.
  void Learn(Dir& d, const std::string& name);
  void Forget(int wd);

  const std::string root_;
  const std::chrono::steady_clock::duration max_age_;
  const std::size_t max_dirs_;
  mutable std::mutex mu_;
  int fd_ = -1;        // the inotify instance, made at the first call; -2: cannot be made
  std::map<int, Dir> dirs_;                    // by watch descriptor
  std::map<std::string, int, std::less<>> wd_;  // watch descriptor by path
  int listings_ = 0;
};

}  // namespace rdp
