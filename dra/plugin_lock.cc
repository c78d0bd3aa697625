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
                                                     absl::Duration retry) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / "lock").string();
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
      Logger("dra")->warn("another driver instance{} holds {}: waiting for it to exit before "
                          "reading the checkpoint and serving the kubelet",
                          pid.empty() ? "" : absl::StrCat(" (pid ", pid, ")"), path);
    }
    if (stopped && stopped()) {
      ::close(fd);
      return absl::CancelledError(absl::StrCat("stopped while waiting for ", path));
    }
    absl::SleepFor(retry);  // no notification exists for a released flock
  }
  if (said) Logger("dra")->info("took {}: the other instance has exited", path);
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, pid.data(), pid.size(), 0);
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
