#include "base/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>

namespace rdp {
namespace fs = std::filesystem;
namespace {

// The trees of a node, in the order paths are matched.
constexpr const char* kTrees[] = {"/sys", "/dev", "/proc"};

class NodeEnv : public Env {
 public:
  explicit NodeEnv(NodeRoots roots)
      : roots_{Canonical(roots.sysfs), Canonical(roots.dev), Canonical(roots.proc)} {}

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
