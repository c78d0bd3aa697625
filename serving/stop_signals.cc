#include "serving/stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

namespace rdp::serving {

int BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return ::signalfd(-1, &stop, SFD_CLOEXEC);
}

std::string ReadStopSignal(int signal_fd) {
  struct signalfd_siginfo info = {};
  const bool got = ::read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info);
  return got && info.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM";
}

}  // namespace rdp::serving
