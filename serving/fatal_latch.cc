#include "serving/fatal_latch.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "serving/event_fd.h"

namespace rdp::serving {

FatalLatch::FatalLatch() : fd_(NewEventFd()) {}

FatalLatch::~FatalLatch() {
  if (fd_ >= 0) ::close(fd_);
}

bool FatalLatch::Raise(const absl::Status& error) {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return false;
    error_ = error;
  }
  SignalEventFd(fd_);
  return true;
}

absl::Status FatalLatch::Wait(int stop_fd) const {
  for (;;) {
    struct pollfd fds[2] = {{stop_fd, POLLIN, 0}, {fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      return absl::InternalError(
          absl::StrCat("waiting for a stop signal: ", std::strerror(errno)));
    }
    if (fds[1].revents & POLLIN) {
      absl::MutexLock lock(&mu_);
      return error_;
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) return absl::OkStatus();
  }
}

}  // namespace rdp::serving
