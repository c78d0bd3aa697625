#pragma once

// A local TCP port that nothing listens on, and one that listens but never answers: what an
// API server that is down, or hung, looks like to the client.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace rdp::kube::testing {

// A listening TCP socket on 127.0.0.1 that never accepts: connections complete in the kernel's
// backlog and then hear nothing. Closed with the object.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || listen(fd_, 8) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() {
    if (fd_ >= 0) close(fd_);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  int fd() const { return fd_; }
  // 0 when the socket could not be set up.
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A port on 127.0.0.1 that was free a moment ago and is closed now: connecting is refused.
inline int ClosedPort() {
  SilentListener listener;
  return listener.port();
}

}  // namespace rdp::kube::testing
