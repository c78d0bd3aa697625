#include "server/plugin_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "proto/deviceplugin.grpc.pb.h"
#include "server/unix_server.h"
#include "topology/log.h"

namespace rdp::server {
namespace {

constexpr char kApiVersion[] = "v1beta1";
constexpr absl::Duration kShutdownGrace = absl::Seconds(2);

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("server"); }

}  // namespace

// Identity of a file: inode plus change time, since tmpfs reuses a freed inode number at once.
// 0 when the file does not exist.
std::uint64_t PluginServer::FileId(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  const std::uint64_t ctime_ns = static_cast<std::uint64_t>(st.st_ctim.tv_sec) * 1000000000u +
                                 static_cast<std::uint64_t>(st.st_ctim.tv_nsec);
  return ((static_cast<std::uint64_t>(st.st_ino) * 1000003u) ^ ctime_ns) | 1u;
}

namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

PluginServer::PluginServer(Config config, PluginDeps deps)
    : config_(std::move(config)), plugin_(std::make_unique<Plugin>(config_, std::move(deps))) {}

PluginServer::~PluginServer() { Stop(); }

absl::Status PluginServer::Start() {
  if (absl::Status s = plugin_->Init(); !s.ok()) return s;
  std::error_code ec;
  std::filesystem::create_directories(config_.kubelet_dir, ec);
  inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (inotify_fd_ < 0 || wake_fd_ < 0) return Errno("inotify/eventfd");
  watch_ = inotify_add_watch(inotify_fd_, config_.kubelet_dir.c_str(),
                             IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM);
  if (watch_ < 0) return Errno(absl::StrCat("watching ", config_.kubelet_dir));
  if (absl::Status s = Serve(); !s.ok()) return s;
  absl::MutexLock lock(&stop_mu_);
  started_ = true;
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void PluginServer::Stop() {
  {
    absl::MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    if (started_) {
      const uint64_t one = 1;
      if (::write(wake_fd_, &one, sizeof(one)) < 0) Log()->warn("waking the plugin thread failed");
    }
  }
  if (thread_.joinable()) thread_.join();
  StopServing();
  if (socket_ino_ != 0 && FileId(config_.SocketPath()) == socket_ino_) {
    ::unlink(config_.SocketPath().c_str());
  }
  for (int* fd : {&inotify_fd_, &wake_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

absl::Status PluginServer::Serve() {
  StopServing();
  const std::string path = config_.SocketPath();
  service_ = std::make_unique<DevicePluginService>(plugin_.get());
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartUnixServer(path, {service_.get()});
  if (!server.ok()) {
    service_.reset();
    return server.status();
  }
  server_ = std::move(*server);
  socket_ino_ = FileId(path);
  ++serves_;
  Log()->info("serving {} on {}", config_.resource_name, path);
  return absl::OkStatus();
}

void PluginServer::StopServing() {
  if (service_) service_->Stop();
  if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  server_.reset();
  service_.reset();
}

bool PluginServer::TryRegister() {
  grpc::ChannelArguments args;
  // A fresh subchannel per attempt: a restarted kubelet must not wait out an old backoff.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel("unix://" + config_.KubeletSocketPath(),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version(kApiVersion);
  request.set_endpoint(config_.socket_name);
  request.set_resource_name(config_.resource_name);
  request.mutable_options()->set_pre_start_required(false);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + config_.register_timeout));
  v1beta1::Empty response;
  const std::uint64_t kubelet_ino = FileId(config_.KubeletSocketPath());
  grpc::Status status = stub->Register(&context, request, &response);
  if (!status.ok()) {
    if (!failing_) {
      Log()->warn("registering with the kubelet on {} failed, retrying with backoff: {}",
                  config_.KubeletSocketPath(), status.error_message());
    }
    failing_ = true;
    return false;
  }
  failing_ = false;
  // kubelet.sock may have appeared during the call: its IN_CREATE is not a restart.
  kubelet_ino_ = kubelet_ino != 0 ? kubelet_ino : FileId(config_.KubeletSocketPath());
  ++registrations_;
  Log()->info("Registered device plugin with Kubelet");
  return true;
}

bool PluginServer::DrainInotify() {
  alignas(struct inotify_event) char buf[8192];
  bool restart = false;
  for (;;) {
    const ssize_t n = ::read(inotify_fd_, buf, sizeof(buf));
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(buf + off);
      off += sizeof(struct inotify_event) + ev->len;
      if (ev->mask & IN_IGNORED) watch_ = -1;  // the directory itself went away
      if (ev->len == 0) continue;
      const std::string name = ev->name;
      if (name == "kubelet.sock" && (ev->mask & (IN_CREATE | IN_MOVED_TO)) &&
          FileId(config_.KubeletSocketPath()) != kubelet_ino_) {
        restart = true;
      }
      if (name == config_.socket_name && (ev->mask & (IN_DELETE | IN_MOVED_FROM)) &&
          FileId(config_.SocketPath()) != socket_ino_) {
        restart = true;
      }
    }
  }
  return restart;
}

void PluginServer::Loop() {
  absl::Time next_poll = absl::Now() + config_.health_interval;
  absl::Time next_register = absl::Now();
  absl::Duration backoff = config_.register_backoff_min;
  bool registered = false;
  bool need_serve = false;  // our socket is gone and the last attempt to serve failed
  for (;;) {
    const absl::Time now = absl::Now();
    const absl::Time wake = registered ? next_poll : std::min(next_poll, next_register);
    const int timeout_ms =
        static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wake - now) + 1));
    struct pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, timeout_ms);
    if (ready < 0 && errno != EINTR) {
      Log()->error("poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents & POLLIN) return;  // Stop()

    bool restart = (fds[1].revents & POLLIN) && DrainInotify();
    if (watch_ < 0 && std::filesystem::is_directory(config_.kubelet_dir)) {
      watch_ = inotify_add_watch(inotify_fd_, config_.kubelet_dir.c_str(),
                                 IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM);
      restart = restart || watch_ >= 0;
    }
    if (restart) {
      Log()->info("kubelet restart detected in {}: serving again and re-registering",
                  config_.kubelet_dir);
      need_serve = need_serve || FileId(config_.SocketPath()) != socket_ino_;
      registered = false;
      backoff = config_.register_backoff_min;
      next_register = absl::Now();
    }
    if (need_serve && absl::Now() >= next_register) {
      if (absl::Status s = Serve(); s.ok()) {
        need_serve = false;
      } else {
        Log()->warn("{}; retrying", s.ToString());
        next_register = absl::Now() + backoff;
        backoff = std::min(backoff * 2, config_.register_backoff_max);
      }
    }
    if (absl::Now() >= next_poll) {
      try {
        plugin_->Poll();
      } catch (const std::exception& e) {  // keep serving the last good state
        Log()->error("health poll failed: {}", e.what());
      }
      next_poll = absl::Now() + config_.health_interval;
    }
    if (!registered && !need_serve && absl::Now() >= next_register) {
      registered = TryRegister();
      if (!registered) {
        next_register = absl::Now() + backoff;
        backoff = std::min(backoff * 2, config_.register_backoff_max);
      }
    }
  }
}

}  // namespace rdp::server
