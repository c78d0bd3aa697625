#pragma once

// How the plugin reads the node: sysfs, /dev and /proc. Every such read goes through an Env (in
// the spirit of leveldb's Env), so that tests run against trees they lay out themselves and
// inject a fault at a chosen read, and no read anywhere throws.
//
// Paths are the node's own ("/sys/class/infiniband/mlx5_0/device", "/dev/infiniband/uverbs0",
// "/proc/driver/nvidia/gpus"); the default Env reads each under the root the flags give for its
// tree (--sysfs-root, --dev-root, --proc-root), so a plugin in a container reads the host's
// /sys mounted at /host/sys as /sys. Thread-safe: every method may be called from any thread.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rdp {

// Where the node's trees are on this machine: "<sysfs>/sys", "<dev>/dev", "<proc>/proc".
struct NodeRoots {
  std::string sysfs = "/";
  std::string dev = "/";
  std::string proc = "/";
};

class Env {
 public:
  virtual ~Env() = default;

  // At most max_bytes from the start of the regular file at `path`, opened without blocking;
  // nullopt when it is missing, unreadable or not a regular file (a FIFO or a device where an
  // attribute should be would block the reader).
  virtual std::optional<std::string> ReadFile(const std::string& path, std::size_t max_bytes) = 0;
  // The entry names of `dir`, sorted; with dirs_only, only entries that resolve to directories
  // (a dangling link is left out). Empty when `dir` cannot be read.
  virtual std::vector<std::string> ListDir(const std::string& dir, bool dirs_only) = 0;
  // `path` with every symbolic link resolved, as a path of the node; nullopt when it does not
  // resolve (missing, dangling, a loop) or resolves outside the node's trees.
  virtual std::optional<std::string> Resolve(const std::string& path) = 0;
  // Whether anything (a file, a directory, a device node, a socket) is at `path` now, links
  // followed: the node's Env asks stat(2) at each call.
  virtual bool Exists(const std::string& path) = 0;
  // Whether `path` resolves to a directory.
  virtual bool IsDirectory(const std::string& path) = 0;
  // Where `path` is read from on this machine, for messages.
  virtual std::string HostPath(const std::string& path) const = 0;
};

// The node's trees on this machine's filesystem, each under its root.
std::shared_ptr<Env> NewNodeEnv(NodeRoots roots);

// Forwards every call to another Env: the base of wrappers (a test's fault injection).
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(std::shared_ptr<Env> base) : base_(std::move(base)) {}

  std::optional<std::string> ReadFile(const std::string& path, std::size_t max_bytes) override {
    return base_->ReadFile(path, max_bytes);
  }
  std::vector<std::string> ListDir(const std::string& dir, bool dirs_only) override {
    return base_->ListDir(dir, dirs_only);
  }
  std::optional<std::string> Resolve(const std::string& path) override {
    return base_->Resolve(path);
  }
  bool Exists(const std::string& path) override { return base_->Exists(path); }
  bool IsDirectory(const std::string& path) override { return base_->IsDirectory(path); }
  std::string HostPath(const std::string& path) const override { return base_->HostPath(path); }

 private:
  std::shared_ptr<Env> base_;
};

// The first line of a sysfs attribute, trailing blanks removed, at most 4 KiB read (a huge
// file is garbage, not data); nullopt when it cannot be read.
std::optional<std::string> ReadAttribute(Env& env, const std::string& path);

}  // namespace rdp
