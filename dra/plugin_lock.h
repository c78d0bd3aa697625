#pragma once

// One driver instance per plugin directory (<kubelet>/plugins/<driver>): two instances on a node
// (a relabel moves a node between DaemonSets; an upgrade overlaps old and new) would overwrite
// each other's checkpoint and CDI specs and take each other's sockets. The instance that starts
// second waits, before it reads the checkpoint, until the first has released the lock.
//
// Handover (a DaemonSet upgrade with maxSurge starts the new pod while the old one serves): the
// waiting instance asks for the lock by keeping a file <dir>/handover (its pid) while it waits;
// the holder's DraServer sees it (DraServerConfig::handover), stops serving and releases the lock,
// and idles until it is stopped. Without the handover the new pod would wait for an old one that
// waits to be replaced by a new one that is ready: the upgrade would never end.

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rdp::dra {

// An exclusive flock(2) on <dir>/lock, held until destroyed (or the process exits: the kernel
// releases it, so a crashed instance never leaves it held).
inline constexpr char kLockFile[] = "lock";
inline constexpr char kHandoverFile[] = "handover";

class PluginDirLock {
 public:
  // Takes the lock, creating `dir` and the file as needed. While another process holds it,
  // logs once (naming the holder's pid when it wrote one) and tries again every `retry` until
  // `stopped` returns true (Cancelled). Errors name the file: PermissionDenied, FailedPrecondition.
  // With `request_handover`, keeps <dir>/handover (holding its pid) while it waits, re-created
  // when it goes. Once it has the lock, <dir>/handover is removed whoever wrote it (a waiter
  // that died leaves one behind, which would make this holder hand over to no one).
  static absl::StatusOr<PluginDirLock> Acquire(const std::string& dir,
                                               const std::function<bool()>& stopped,
                                               absl::Duration retry = absl::Milliseconds(250),
                                               bool request_handover = false);
  PluginDirLock(PluginDirLock&& other) noexcept;
  PluginDirLock& operator=(PluginDirLock&& other) noexcept;
  PluginDirLock(const PluginDirLock&) = delete;
  PluginDirLock& operator=(const PluginDirLock&) = delete;
  ~PluginDirLock();

  const std::string& path() const { return path_; }

 private:
  PluginDirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace rdp::dra
