#include "serving/event_fd.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/log.h"

namespace rdp::serving {

int NewEventFd() { return ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

void SignalEventFd(int fd) {
  const std::uint64_t one = 1;
  if (::write(fd, &one, sizeof one) < 0) {
    Logger("serving")->warn("eventfd write failed: {}", std::strerror(errno));
  }
}

void DrainEventFd(int fd) {
  std::uint64_t value;
  while (::read(fd, &value, sizeof value) > 0) {
  }
}

}  // namespace rdp::serving
