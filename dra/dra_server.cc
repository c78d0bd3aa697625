#include "dra/dra_server.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "dra/plugin_lock.h"
#include "serving/event_fd.h"
#include "serving/file_watch.h"
#include "serving/unix_server.h"

namespace rdp::dra {
namespace {

constexpr absl::Duration kShutdownGrace = absl::Seconds(2);
constexpr std::uint32_t kDirEvents =
    IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF;

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

std::string DraServerConfig::PluginDir() const {
  return (std::filesystem::path(kubelet_dir) / "plugins" / driver_name).string();
}
std::string DraServerConfig::DraSocket() const {
  return (std::filesystem::path(PluginDir()) / "dra.sock").string();
}
std::string DraServerConfig::RegistrationDir() const {
  return (std::filesystem::path(kubelet_dir) / "plugins_registry").string();
}
std::string DraServerConfig::RegistrationSocket() const {
  return (std::filesystem::path(RegistrationDir()) / absl::StrCat(driver_name, "-reg.sock"))
      .string();
}

std::string DraServerConfig::HandoverFile() const {
  return (std::filesystem::path(PluginDir()) / kHandoverFile).string();
}

namespace {

std::vector<std::string> ServicesOffered(bool health) {
  std::vector<std::string> out = {kDraPluginService, kDraPluginServiceV1beta1};
  if (health) {
    out.push_back(kDraHealthService);
    out.push_back(kDraHealthServiceV1alpha1);
  }
  return out;
}

}  // namespace

DraServer::DraServer(DraServerConfig config, Driver* driver, HealthFeed* health)
    : config_(std::move(config)),
      dra_v1_(driver),
      dra_v1beta1_(driver),
      registration_(std::make_unique<RegistrationService>(
          config_.driver_name, config_.DraSocket(), ServicesOffered(health != nullptr))),
      readiness_([this] { return registered(); }),
      health_(health),
      health_v1_(health),
      health_v1alpha1_(health) {
  absl::MutexLock lock(&mu_);
  dra_.path = config_.DraSocket();
  dra_.what = "DRAPlugin";
  dra_.services = {&dra_v1_, &dra_v1beta1_, &readiness_};
  if (health_ != nullptr) {
    dra_.services.push_back(&health_v1_);
    dra_.services.push_back(&health_v1alpha1_);
  }
  reg_.path = config_.RegistrationSocket();
  reg_.what = "Registration";
  reg_.services = {registration_.get()};
}

DraServer::~DraServer() { Stop(); }

absl::Status DraServer::Start() {
  stop_fd_ = serving::NewEventFd();
  inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (stop_fd_ < 0 || !fatal_.ok() || inotify_fd_ < 0) return Errno("inotify/eventfd");
  absl::MutexLock lock(&mu_);
  // The endpoint first: the kubelet dials it as soon as it has read GetInfo.
  if (absl::Status s = Serve(dra_); !s.ok()) return s;
  if (absl::Status s = Serve(reg_); !s.ok()) {
    StopServing(dra_, absl::Now() + kShutdownGrace);
    return s;
  }
  if (!WatchDirs(/*force=*/true)) {
    StopServing(reg_, absl::Now() + kShutdownGrace);
    StopServing(dra_, absl::Now() + kShutdownGrace);
    return Errno(absl::StrCat("watching ", config_.PluginDir(), " and ",
                              config_.RegistrationDir()));
  }
  started_ = true;
  thread_ = std::thread([this] {
    try {
      Loop();
    } catch (const std::exception& e) {
      Fatal(absl::InternalError(absl::StrCat("the DRA lifecycle thread failed: ", e.what())));
    }
  });
  return absl::OkStatus();
}

void DraServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    if (started_) serving::SignalEventFd(stop_fd_);
  }
  if (health_ != nullptr) health_->Stop();  // its streams end now, not at the grace deadline
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  // The registration socket goes first (the kubelet unregisters the driver before its endpoint
  // goes); calls in flight get one grace period for both servers together.
  const absl::Time deadline = absl::Now() + kShutdownGrace;
  for (Socket* s : {&reg_, &dra_}) {
    if (s->id != 0 && serving::FileId(s->path) == s->id) ::unlink(s->path.c_str());
    s->id = 0;
    StopServing(*s, deadline);
  }
  for (int* fd : {&inotify_fd_, &stop_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

absl::Status DraServer::Wait(int stop_fd) {
  return fatal_.Wait(stop_fd);
}

void DraServer::Fatal(const absl::Status& status) {
  if (!fatal_.Raise(status)) return;
  Log()->error("{}; the driver cannot go on and exits so that it is restarted",
               std::string(status.message()));
}

absl::Status DraServer::Serve(Socket& socket) {
  StopServing(socket, absl::Now() + kShutdownGrace);
  std::error_code ec;
  const std::string dir = std::filesystem::path(socket.path).parent_path().string();
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      serving::StartUnixServer(socket.path, socket.services);
  if (!server.ok()) return server.status();
  socket.server = *std::move(server);
  socket.id = serving::FileId(socket.path);
  if (socket.id == 0) {
    StopServing(socket, absl::Now() + kShutdownGrace);
    return absl::UnavailableError(absl::StrCat(socket.path, " vanished as it was created"));
  }
  Log()->info("serving {} on {}", socket.what, socket.path);
  return absl::OkStatus();
}

void DraServer::StopServing(Socket& socket, absl::Time deadline) {
  if (socket.server) socket.server->Shutdown(absl::ToChronoTime(deadline));
  socket.server.reset();
}

bool DraServer::WatchDirs(bool force) {
  bool ok = true;
  struct Dir {
    std::string path;
    int* watch;
    std::uint64_t* id;
  };
  for (const Dir& d : {Dir{config_.PluginDir(), &plugin_watch_, &plugin_dir_id_},
                       Dir{config_.RegistrationDir(), &reg_watch_, &reg_dir_id_}}) {
    const std::uint64_t id = serving::DirId(d.path);
    if (!force && *d.watch >= 0 && id == *d.id) continue;
    // No inotify_rm_watch: adding a watch on a path that is watched returns the same descriptor
    // and queues nothing, and a watch of a directory that went away ends by itself.
    *d.watch = id == 0 ? -1 : ::inotify_add_watch(inotify_fd_, d.path.c_str(), kDirEvents);
    *d.id = *d.watch >= 0 ? id : 0;
    ok = ok && *d.watch >= 0;
  }
  return ok;
}

void DraServer::Loop() {
  absl::Duration backoff = config_.retry_min;
  absl::Time next_try = absl::InfiniteFuture();  // a failed serve is retried then
  for (;;) {
    const absl::Time wake = std::min(next_try, absl::Now() + config_.recheck);
    struct pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    const std::int64_t ms = std::clamp<std::int64_t>(
        absl::ToInt64Milliseconds(wake - absl::Now()) + 1, 0, INT_MAX);
    const int ready = ::poll(fds, 2, static_cast<int>(ms));
    if (ready < 0 && errno != EINTR) return Fatal(Errno("poll"));
    if (fds[0].revents != 0) return;
    if (fds[1].revents & (POLLERR | POLLNVAL)) {
      return Fatal(absl::InternalError("poll: the inotify descriptor is not usable"));
    }
    bool lost_watch = false;  // a watched directory went away: watch it again when back
    if (fds[1].revents & POLLIN) {
      serving::ReadInotifyEvents(inotify_fd_, [&](const serving::InotifyEvent& ev) {
        Log()->debug("inotify: {} wd={} mask={:#x}", ev.name, ev.wd, ev.mask);
        if (ev.mask & (IN_IGNORED | IN_Q_OVERFLOW)) lost_watch = true;
      });
    }
    if (config_.handover && serving::FileId(config_.HandoverFile()) != 0) {
      std::string pid;
      std::ifstream(config_.HandoverFile()) >> pid;
      const std::string who = absl::StrCat("another driver instance (pid ", pid.empty() ? "?" : pid,
                                           ") asks for ", config_.PluginDir());
      if (fatal_.Raise(absl::AbortedError(who))) Log()->info("{}: handing over", who);
      return;
    }
    absl::MutexLock lock(&mu_);
    bool failed = false;
    // The endpoint before the registration socket, as at Start; and when the endpoint had to be
    // served again, the registration socket too: a kubelet that registered us while the endpoint
    // was gone sees a new socket and registers us again, now that the endpoint is there.
    bool dra_again = false;
    for (Socket* s : {&dra_, &reg_}) {
      // id 0: not served (the last attempt failed).
      const bool gone = s->id == 0 || serving::FileId(s->path) != s->id;
      if (!gone && !(s == &reg_ && dra_again)) continue;
      if (gone && s->id != 0) Log()->info("{} was removed or replaced: serving it again", s->path);
      if (s == &dra_) dra_again = true;
      if (absl::Status st = Serve(*s); !st.ok()) {
        Log()->warn("{}; retrying", st.ToString());
        s->id = 0;
        failed = true;
        break;  // no registration socket without its endpoint
      }
    }
    WatchDirs(lost_watch);  // directories re-created by Serve, or replaced
    if (failed) {
      next_try = absl::Now() + backoff;
      backoff = std::min(backoff * 2, config_.recheck);
    } else {
      next_try = absl::InfiniteFuture();
      backoff = config_.retry_min;
    }
  }
}

}  // namespace rdp::dra
