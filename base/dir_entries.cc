#include "base/dir_entries.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <memory>

namespace rdp {
namespace {

// Entries come and go (created, deleted, moved in or out); the directory itself goes (deleted,
// moved; IN_IGNORED and IN_UNMOUNT come unasked).
constexpr std::uint32_t kMask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                                IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;

std::string Join(const std::string& dir, std::string_view name) {
  std::string path;
  path.reserve(dir.size() + 1 + name.size());
  path.append(dir).append("/").append(name);
  return path;
}

// Whether `dir` is spelled as it resolves (no link, ".", ".." or "//" in it): a watch follows
// the directory it was given, not a path that could later lead elsewhere through a link.
bool Resolved(const std::string& dir) {
  std::unique_ptr<char, decltype(&::free)> real(::realpath(dir.c_str(), nullptr), &::free);
  return real != nullptr && dir == real.get();
}

}  // namespace

DirEntries::DirEntries(std::string root, std::chrono::steady_clock::duration max_age,
                       std::size_t max_dirs)
    : root_(root == "/" ? std::string() : std::move(root)), max_age_(max_age),
      max_dirs_(max_dirs) {}

std::string DirEntries::Host(std::string_view path) const {
  std::string host;
  host.reserve(root_.size() + path.size());
  host.append(root_).append(path);
  return host;
}

DirEntries::~DirEntries() {
  if (fd_ >= 0) ::close(fd_);
}

int DirEntries::listings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return listings_;
}

std::optional<bool> DirEntries::Exists(std::string_view path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!Ready()) return std::nullopt;
  return Answer(path, std::chrono::steady_clock::now());
}

std::vector<std::optional<bool>> DirEntries::ExistAll(const std::vector<std::string_view>& paths,
                                                      std::string_view within) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::optional<bool>> out(paths.size());
  if (!Ready()) return out;
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (paths[i].substr(0, within.size()) == within) out[i] = Answer(paths[i], now);
  }
  return out;
}

bool DirEntries::Ready() {
  if (fd_ == -1) {
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) fd_ = -2;  // out of inotify instances, say: every answer is the caller's stat
  }
  return fd_ >= 0 && Drain();
}

std::optional<bool> DirEntries::Answer(std::string_view path,
                                       std::chrono::steady_clock::time_point now) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return std::nullopt;
  const std::string_view dir = path.substr(0, slash);
  const std::string_view name = path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") return std::nullopt;
  auto at = wd_.find(dir);
  if (at == wd_.end()) {
    const std::string host = Host(dir);
    if (dirs_.size() >= max_dirs_ || !Resolved(host)) return std::nullopt;
    const int wd = ::inotify_add_watch(fd_, host.c_str(), kMask);
    if (wd < 0) return std::nullopt;  // not there, not a directory
    if (dirs_.count(wd) != 0) return std::nullopt;  // watched already under another path
    Dir& d = dirs_[wd];
    d.path = std::string(dir);
    d.host = host;
    wd_[d.path] = wd;
    if (!List(d)) {
      Forget(wd);
      return std::nullopt;
    }
    // Changes between the watch and the listing: their events apply to it (each records the
    // entry as it is now, so applying one twice changes nothing).
    if (!Drain()) return std::nullopt;
    at = wd_.find(dir);
    if (at == wd_.end()) return std::nullopt;  // gone already
  }
  const int wd = at->second;
  Dir& d = dirs_.at(wd);
  if (now - d.listed > max_age_ && !List(d)) {
    Forget(wd);
    return std::nullopt;
  }
  const auto entry = d.entries.find(name);
  if (entry == d.entries.end()) return false;
  if (entry->second == Kind::kPlain) return true;
  struct stat st;
  return ::stat(Join(d.host, name).c_str(), &st) == 0;  // a dangling link is nothing
}

bool DirEntries::Drain() {
  alignas(struct inotify_event) char buf[8192];
  bool overflow = false;
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {  // cannot happen on a working instance: the cache is off from now on
      ::close(fd_);
      fd_ = -2;
      dirs_.clear();
      wd_.clear();
      return false;
    }
    for (const char* p = buf; p < buf + n;) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(p);
      p += sizeof(struct inotify_event) + ev->len;
      if (ev->mask & IN_Q_OVERFLOW) {
        overflow = true;
        continue;
      }
      const auto it = dirs_.find(ev->wd);
      if (it == dirs_.end()) continue;  // a watch forgotten already
      if (ev->mask & (IN_IGNORED | IN_UNMOUNT | IN_DELETE_SELF | IN_MOVE_SELF)) {
        Forget(ev->wd);  // the next call watches the path afresh
        continue;
      }
      if (ev->len == 0) continue;
      const std::string name(ev->name);  // NUL-padded
      if (ev->mask & (IN_DELETE | IN_MOVED_FROM)) {
        it->second.entries.erase(name);
      } else if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
        Learn(it->second, name);
      }
    }
  }
  if (overflow) {  // events were lost: every listing is read again
    for (auto it = dirs_.begin(); it != dirs_.end();) {
      const int wd = (it++)->first;
      if (!List(dirs_.at(wd))) Forget(wd);
    }
  }
  return true;
}

bool DirEntries::List(Dir& d) {
  DIR* dir = ::opendir(d.host.c_str());
  if (dir == nullptr) return false;
  d.entries.clear();
  bool ok = true;
  for (;;) {
    errno = 0;
    const struct dirent* e = ::readdir(dir);
    if (e == nullptr) {
      ok = errno == 0;
      break;
    }
    const std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    if (e->d_type == DT_UNKNOWN) {  // a file system that does not say
      Learn(d, std::string(name));
    } else {
      d.entries[std::string(name)] = e->d_type == DT_LNK ? Kind::kLink : Kind::kPlain;
    }
  }
  ::closedir(dir);
  d.listed = std::chrono::steady_clock::now();
  ++listings_;
  return ok;
}

void DirEntries::Learn(Dir& d, const std::string& name) {
  struct stat st;
  if (::fstatat(AT_FDCWD, Join(d.host, name).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    d.entries.erase(name);
    return;
  }
  d.entries[name] = S_ISLNK(st.st_mode) ? Kind::kLink : Kind::kPlain;
}

void DirEntries::Forget(int wd) {
  const auto it = dirs_.find(wd);
  if (it == dirs_.end()) return;
  ::inotify_rm_watch(fd_, wd);  // moved: the watch would follow it; gone: EINVAL, harmless
  wd_.erase(it->second.path);
  dirs_.erase(it);
}

}  // namespace rdp
