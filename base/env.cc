#include "base/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>

namespace rdp {
namespace fs = std::filesystem;
namespace {

// The trees of a node, in the order paths are matched.
constexpr const char* kTrees[] = {"/sys", "/dev", "/proc"};

class NodeEnv : public Env {
 public:
  explicit NodeEnv(NodeRoots roots) {
    roots_[0] = Canonical(roots.sysfs);
    roots_[1] = Canonical(roots.dev);
    roots_[2] = Canonical(roots.proc);
  }

  std::optional<std::string> ReadFile(const std::string& path, std::size_t max_bytes) override {
    const int fd = ::open(HostPath(path).c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return std::nullopt;
    struct stat st;
    std::optional<std::string> out;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
      std::string data(max_bytes, '\0');
      std::size_t got = 0;
      bool failed = false;
      while (got < max_bytes) {
        const ssize_t n = ::read(fd, data.data() + got, max_bytes - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) failed = true;
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      if (!failed) {
        data.resize(got);
        out = std::move(data);
      }
    }
    ::close(fd);
    return out;
  }

  std::vector<std::string> ListDir(const std::string& dir, bool dirs_only) override {
    std::vector<std::string> names;
    std::error_code ec;
    fs::directory_iterator it(HostPath(dir), ec);
    for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
      if (dirs_only) {
        std::error_code ec2;
        if (!fs::is_directory(it->path(), ec2)) continue;  // follows links; dangling: left out
      }
      names.push_back(it->path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::optional<std::string> Resolve(const std::string& path) override {
    std::error_code ec;
    const fs::path resolved = fs::canonical(HostPath(path), ec);
    if (ec) return std::nullopt;
    return NodePath(resolved.string());
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(HostPath(path).c_str(), &st) == 0;  // a dangling link is nothing
  }

  std::vector<bool> ExistAll(const std::vector<std::string_view>& paths) override {
    std::vector<bool> out(paths.size(), false);
    // Paths by directory, in order of first appearance; one without a directory part alone.
    thread_local std::vector<std::pair<std::string_view, std::vector<std::size_t>>> dirs;
    for (auto& d : dirs) d.second.clear();
    std::size_t used = 0;
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const std::size_t slash = paths[i].rfind('/');
      if (slash == std::string_view::npos || slash + 1 == paths[i].size()) {
        out[i] = Exists(std::string(paths[i]));
        continue;
      }
      const std::string_view dir = paths[i].substr(0, slash == 0 ? 1 : slash);
      std::size_t d = 0;
      while (d < used && dirs[d].first != dir) ++d;
      if (d == used) {
        if (used == dirs.size()) dirs.emplace_back();
        dirs[used++].first = dir;
      }
      dirs[d].second.push_back(i);
    }
    for (std::size_t d = 0; d < used; ++d) LookUpIn(dirs[d].first, paths, dirs[d].second, out);
    return out;
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(HostPath(path).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  std::string HostPath(const std::string& path) const override {
    for (std::size_t i = 0; i < std::size(kTrees); ++i) {
      if (Within(path, kTrees[i])) return Join(roots_[i], path);
    }
    return path;  // not a path of the node's trees: as given
  }

 private:
  // A directory's entries (name, d_type), sorted, as read when its status was `st`.
  struct Listing {
    std::string host;  // the directory's path on this machine
    struct stat st = {};
    bool reusable = false;  // listed long enough after its last change (see LookUpIn)
    std::vector<std::pair<std::string, unsigned char>> entries;
  };

  // The entries of the directory open as `fd` (getdents64 until it returns nothing; the caller
  // closes it). nullopt when it cannot be read.
  static std::optional<std::vector<std::pair<std::string, unsigned char>>> ReadEntries(int fd) {
    std::vector<std::pair<std::string, unsigned char>> entries;
    alignas(8) char buf[16384];
    while (true) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return std::nullopt;
      if (n == 0) break;
      for (long at = 0; at < n;) {
        struct Entry {
          ino64_t ino;
          off64_t off;
          unsigned short reclen;
          unsigned char type;
          char name[1];
        };
        const auto* e = reinterpret_cast<const Entry*>(buf + at);
        entries.emplace_back(e->name, e->type);
        at += e->reclen;
      }
    }
    std::sort(entries.begin(), entries.end());
    return entries;
  }

  // Exists() of paths[i] for i in `members`, all directly in `dir`, into out[i]. A syscall costs
  // a microsecond or more on some hosts, and Allocate asks for three nodes per HCA: the entries
  // of a directory are read once and kept while the directory's status (device, inode, change
  // and modification times) stays the same, so that a repeated check costs one stat. A listing
  // taken within kRacyWindowNs of the directory's last modification is not reused: another
  // change in the same clock tick would leave the times as they were. Links and entries
  // of unknown type are stat()ed each time, so that a dangling link is nothing, as for Exists.
  void LookUpIn(std::string_view dir, const std::vector<std::string_view>& paths,
                const std::vector<std::size_t>& members, std::vector<bool>& out) {
    constexpr long long kRacyWindowNs = 200'000'000;
    auto name = [&](std::size_t i) { return paths[i].substr(paths[i].rfind('/') + 1); };
    // The directory's path on this machine, kept with its listing (no string built per call).
    std::shared_ptr<const Listing> listing;
    std::string host;
    {
      std::lock_guard<std::mutex> lock(listings_mu_);
      if (auto it = listings_.find(dir); it != listings_.end()) {
        listing = it->second;
        host = listing->host;
      }
    }
    if (host.empty()) host = HostPath(std::string(dir));
    struct stat st;
    if (::stat(host.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;  // nothing in it exists
    auto same = [&st](const struct stat& o) {
      return o.st_dev == st.st_dev && o.st_ino == st.st_ino &&
             o.st_mtim.tv_sec == st.st_mtim.tv_sec && o.st_mtim.tv_nsec == st.st_mtim.tv_nsec &&
             o.st_ctim.tv_sec == st.st_ctim.tv_sec && o.st_ctim.tv_nsec == st.st_ctim.tv_nsec;
    };
    if (listing && !(listing->reusable && same(listing->st))) listing = nullptr;
    if (!listing) {
      std::optional<std::vector<std::pair<std::string, unsigned char>>> entries;
      struct stat now_st;
      const int fd = ::open(host.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd >= 0 && ::fstat(fd, &now_st) == 0) entries = ReadEntries(fd);
      if (fd >= 0) ::close(fd);
      if (!entries) {  // unreadable (searchable only, say): one stat per path
        for (std::size_t i : members) out[i] = Exists(std::string(paths[i]));
        return;
      }
      auto fresh = std::make_shared<Listing>();
      fresh->host = host;
      fresh->st = now_st;
      fresh->entries = std::move(*entries);
      struct timespec now;
      ::clock_gettime(CLOCK_REALTIME, &now);
      const long long age = (now.tv_sec - now_st.st_mtim.tv_sec) * 1'000'000'000LL +
                            (now.tv_nsec - now_st.st_mtim.tv_nsec);
      fresh->reusable = age >= kRacyWindowNs;
      listing = fresh;
      std::lock_guard<std::mutex> lock(listings_mu_);
      if (listings_.size() > 64) listings_.clear();  // bounded: a few directories in practice
      listings_[std::string(dir)] = std::move(fresh);
    }
    for (std::size_t i : members) {
      const std::string_view n = name(i);
      const auto& entries = listing->entries;
      auto at = std::lower_bound(entries.begin(), entries.end(), n,
                                 [](const auto& e, std::string_view key) { return e.first < key; });
      if (at == entries.end() || at->first != n) continue;
      const bool plain = at->second != DT_LNK && at->second != DT_UNKNOWN;
      out[i] = plain || Exists(std::string(paths[i]));
    }
  }

  // A root as an absolute path without links, so that resolved paths can be matched against it.
  static std::string Canonical(const std::string& root) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::absolute(root.empty() ? "/" : root, ec), ec);
    std::string s = ec ? root : p.string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s.empty() ? "/" : s;
  }

  static bool Within(const std::string& path, const std::string& dir) {
    return path.compare(0, dir.size(), dir) == 0 &&
           (path.size() == dir.size() || path[dir.size()] == '/');
  }

  static std::string Join(const std::string& root, const std::string& path) {
    return root == "/" ? path : root + path;
  }

  // The node path of a resolved host path, or nullopt when it is in none of the trees.
  std::optional<std::string> NodePath(const std::string& host) const {
    for (std::size_t i = 0; i < std::size(kTrees); ++i) {
      const std::string tree = Join(roots_[i], kTrees[i]);
      if (Within(host, tree)) return std::string(kTrees[i]) + host.substr(tree.size());
    }
    return std::nullopt;
  }

  std::string roots_[std::size(kTrees)];
  std::mutex listings_mu_;
  // By node path of the directory; looked up without building a string.
  std::map<std::string, std::shared_ptr<const Listing>, std::less<>> listings_;
};

}  // namespace

std::shared_ptr<Env> NewNodeEnv(NodeRoots roots) {
  return std::make_shared<NodeEnv>(std::move(roots));
}

std::optional<std::string> ReadAttribute(Env& env, const std::string& path) {
  std::optional<std::string> line = env.ReadFile(path, 4096);
  if (!line) return std::nullopt;
  if (auto nl = line->find('\n'); nl != std::string::npos) line->resize(nl);
  while (!line->empty() && (line->back() == '\r' || line->back() == ' ')) line->pop_back();
  return line;
}

}  // namespace rdp
