#include "nri/plugin.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "serving/event_fd.h"
#include "serving/file_watch.h"

namespace rdp::nri {
namespace {

constexpr std::size_t kReadChunk = 64 * 1024;

std::string Dir(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string Base(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A non-blocking connection to the unix socket at `path`, or -errno.
int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);  // length checked by ValidateConfig
  if (::connect(fd, reinterpret_cast<const struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    // EAGAIN: the listener's backlog is full; like any other failure, try again later.
    const int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

int PollTimeoutMs(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<std::int64_t>(absl::ToInt64Milliseconds(d) + 1, 60'000));
}

}  // namespace

absl::Status ValidateConfig(const PluginConfig& config) {
  if (config.socket_path.empty()) return absl::InvalidArgumentError("--nri-socket: empty");
  if (config.socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--nri-socket '", config.socket_path,
                                                   "': longer than a unix socket path can be (",
                                                   sizeof(sockaddr_un{}.sun_path) - 1, ")"));
  }
  return ValidateRegistration(config.registration);
}

NriPlugin::NriPlugin(PluginConfig config, NriMetrics* metrics)
    : config_(std::move(config)), metrics_(metrics) {}

NriPlugin::~NriPlugin() { Stop(); }

absl::Status NriPlugin::Start() {
  stop_fd_ = serving::NewEventFd();
  inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (stop_fd_ < 0 || inotify_fd_ < 0 || !fatal_.ok()) {
    return absl::InternalError(absl::StrCat("eventfd/inotify: ", std::strerror(errno)));
  }
  Logger("nri")->info("connecting to the runtime's NRI socket {} as {}-{}", config_.socket_path,
                      config_.registration.index, config_.registration.name);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void NriPlugin::Stop() {
  if (stopping_) return;
  stopping_ = true;
  if (thread_.joinable()) {
    serving::SignalEventFd(stop_fd_);
    thread_.join();
  }
  for (int* fd : {&stop_fd_, &inotify_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

absl::Status NriPlugin::Wait(int stop_fd) { return fatal_.Wait(stop_fd); }

void NriPlugin::Fatal(const absl::Status& status) {
  if (fatal_.Raise(status)) Logger("nri")->error("{}", status.ToString());
}

void NriPlugin::Watch() {
  // The same watch descriptor while the directory is the same; a new one when it was re-created.
  watch_ = ::inotify_add_watch(inotify_fd_, Dir(config_.socket_path).c_str(),
                               IN_CREATE | IN_MOVED_TO | IN_ONLYDIR);
}

NriPlugin::Woken NriPlugin::WaitToConnect(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string name = Base(config_.socket_path);
  for (;;) {
    struct pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, PollTimeoutMs(deadline - absl::Now()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      Fatal(absl::InternalError(absl::StrCat("nri: poll: ", std::strerror(errno))));
      stop_seen_ = true;
      return Woken::kStop;
    }
    if (fds[0].revents & POLLIN) {
      stop_seen_ = true;
      return Woken::kStop;
    }
    bool appeared = false;
    if (fds[1].revents & POLLIN) {
      serving::ReadInotifyEvents(inotify_fd_, [&](const serving::InotifyEvent& ev) {
        appeared = appeared || ev.name == name;
      });
    }
    if (appeared) return Woken::kAppeared;
    if (absl::Now() >= deadline) return Woken::kTimeout;
  }
}

void NriPlugin::Loop() {
  const auto log = Logger("nri");
  absl::Duration backoff = config_.min_backoff;
  bool waiting_logged = false;
  while (!stop_seen_) {
    Watch();
    const int fd = Connect(config_.socket_path);
    if (fd >= 0) {
      waiting_logged = false;
      const bool synchronized = RunConnection(fd);
      ::close(fd);
      if (stop_seen_) break;
      if (synchronized) backoff = config_.min_backoff;  // a restarted runtime: back at once
    } else if (!waiting_logged) {
      log->info("waiting for the runtime's NRI socket {}: {} (is NRI enabled in the runtime?)",
                config_.socket_path, std::strerror(-fd));
      waiting_logged = true;
    }
    switch (WaitToConnect(backoff)) {
      case Woken::kStop:
        return;
      case Woken::kAppeared:
        backoff = config_.min_backoff;  // the socket is there: listening any moment now
        break;
      case Woken::kTimeout:
        backoff = std::min(backoff * 2, config_.max_backoff);
        break;
    }
  }
}

bool NriPlugin::RunConnection(int fd) {
  const auto log = Logger("nri");
  PluginService service(config_.memlock, *metrics_);
  Session session(config_.registration, service);
  std::string out = session.Open();
  const absl::Time deadline = absl::Now() + config_.setup_timeout;
  bool registered = false;
  bool synchronized = false;
  std::string why;  // why the connection ended
  std::string buf(kReadChunk, '\0');
  while (why.empty()) {
    struct pollfd fds[2] = {
        {fd, static_cast<short>(POLLIN | (out.empty() ? 0 : POLLOUT)), 0},
        {stop_fd_, POLLIN, 0}};
    const int ready =
        ::poll(fds, 2, synchronized ? -1 : PollTimeoutMs(deadline - absl::Now()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      Fatal(absl::InternalError(absl::StrCat("nri: poll: ", std::strerror(errno))));
      stop_seen_ = true;
      break;
    }
    if (fds[1].revents & POLLIN) {
      stop_seen_ = true;
      break;
    }
    if (ready == 0) {
      why = absl::StrCat("not registered and synchronized within ",
                         absl::FormatDuration(config_.setup_timeout));
      break;
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n > 0) {
          if (absl::Status s = session.OnBytes(std::string_view(buf.data(), n), &out); !s.ok()) {
            why = s.ToString();
            break;
          }
          continue;
        }
        if (n == 0) why = "closed by the runtime";
        else if (errno != EAGAIN && errno != EINTR) why = std::strerror(errno);
        break;
      }
    }
    // Counted before any answer goes out: once the runtime has our answers to what followed
    // its accepting us (Configure, Synchronize, a CreateContainer), the metrics say so too.
    if (!registered && session.registered()) {
      registered = true;
      metrics_->registrations.Add();
      log->info("registered with the runtime as {}-{}", config_.registration.index,
                config_.registration.name);
    }
    if (!synchronized && service.synchronized()) {
      synchronized = true;
      metrics_->connected.store(true, std::memory_order_relaxed);
    }
    while (!out.empty()) {
      const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        out.erase(0, n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EINTR && why.empty()) {
        why = absl::StrCat("write: ", std::strerror(errno));
      }
      break;
    }
  }
  metrics_->connected.store(false, std::memory_order_relaxed);
  if (!why.empty()) {
    log->warn("connection to the runtime's NRI socket ended: {}; connecting again", why);
  }
  return synchronized;
}

}  // namespace rdp::nri
