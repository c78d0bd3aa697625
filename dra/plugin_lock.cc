#include "dra/plugin_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/log.h"
#include "serving/atomic_file.h"

namespace rdp::dra {

namespace {

// The pid the holder wrote into the file, "" when none.
std::string Holder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, static_cast<std::size_t>(n));
  int pid = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid) ? std::to_string(pid) : "";
}

}  // namespace

absl::StatusOr<PluginDirLock> PluginDirLock::Acquire(const std::string& dir,
                                                     const std::function<bool()>& stopped,
                                                     absl::Duration retry,
                                                     bool request_handover) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / kLockFile).string();
  const std::string handover = (std::filesystem::path(dir) / kHandoverFile).string();
  const std::string own_pid = absl::StrCat(::getpid(), "\n");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    const std::string why = absl::StrCat("lock file ", path, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::FailedPreconditionError(why);
  }
  bool said = false;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK && err != EINTR) {
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("lock file ", path, ": flock: ", std::strerror(err)));
    }
    if (!said) {
      said = true;
      const std::string pid = Holder(fd);
      Logger("dra")->warn("another driver instance{} holds {}: waiting for it to {} before "
                          "reading the checkpoint and serving the kubelet",
                          pid.empty() ? "" : absl::StrCat(" (pid ", pid, ")"), path,
                          request_handover ? "hand over (asked in " + handover + ") or exit"
                                           : "exit");
    }
    if (request_handover && !std::filesystem::exists(handover, ec)) {
      // Best effort: a holder that cannot see it still releases the lock when it exits.
      if (absl::Status s = serving::WriteFileAtomically(handover, own_pid, 0644); !s.ok()) {
        Logger("dra")->warn("cannot ask for a handover: {}", s.ToString());
      }
    }
    if (stopped && stopped()) {
      ::close(fd);
      return absl::CancelledError(absl::StrCat("stopped while waiting for ", path));
    }
    absl::SleepFor(retry);  // no notification exists for a released flock
  }
  if (said) Logger("dra")->info("took {}: the other instance has released it", path);
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, own_pid.data(), own_pid.size(), 0);
  if (absl::Status s = serving::RemoveFile(handover); !s.ok()) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot remove ", handover, " (another instance would be asked to hand over): ",
        s.message()));
  }
  return PluginDirLock(fd, path);
}

PluginDirLock::PluginDirLock(PluginDirLock&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

PluginDirLock& PluginDirLock::operator=(PluginDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

PluginDirLock::~PluginDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace rdp::dra
