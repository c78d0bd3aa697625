#include "deviceplugin/plugin_server.h"

#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "proto/deviceplugin.grpc.pb.h"
#include "serving/event_fd.h"
#include "serving/file_watch.h"
#include "serving/unix_server.h"
#include "base/log.h"

namespace rdp::deviceplugin {
namespace {

constexpr char kApiVersion[] = "v1beta1";
constexpr absl::Duration kShutdownGrace = absl::Seconds(2);
constexpr std::uint32_t kDirEvents = IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM;

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("server"); }

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

PluginServer::PluginServer(Config config, NodeSources sources,
                           std::vector<grpc::Service*> also_served)
    : config_(std::move(config)),
      also_served_(std::move(also_served)),
      poll_(sources.poll),
      node_(std::make_unique<NodeState>(config_, std::move(sources))),
      stop_fd_(serving::NewEventFd()),
      rescan_fd_(serving::NewEventFd()),
      kubelet_inotify_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)),
      pods_inotify_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {}

PluginServer::~PluginServer() {
  Stop();
  for (int fd : {kubelet_inotify_, pods_inotify_, stop_fd_, rescan_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

absl::Status PluginServer::Start() {
  if (stop_fd_ < 0 || !fatal_.ok() || rescan_fd_ < 0 || kubelet_inotify_ < 0 ||
      pods_inotify_ < 0) {
    return Errno("inotify/eventfd");
  }
  if (absl::Status s = node_->Init(); !s.ok()) return s;
  node_->SetRescanRequest([fd = rescan_fd_] { serving::SignalEventFd(fd); });
  if (node_->has_pod_resources()) {
    serving::ThreadRole::Scope pods(&pods_role_);
    WatchPodsDir();
    // One short try before serving, so that the kubelet's first list is not needlessly all
    // withheld; the List goes on, and the pods thread retries.
    node_->RefreshPodsAndWait(config_.pod_resources_first_wait);
  }
  {
    serving::ThreadRole::Scope lifecycle(&lifecycle_);
    std::error_code ec;
    std::filesystem::create_directories(config_.kubelet_dir, ec);
    if (!WatchKubeletDir()) return Errno(absl::StrCat("watching ", config_.kubelet_dir));
    if (absl::Status s = Serve(); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  started_ = true;
  threads_.emplace_back([this] {
    RunLoop("lifecycle", [this] {
      serving::ThreadRole::Scope lifecycle(&lifecycle_);
      LifecycleLoop();
    });
  });
  threads_.emplace_back([this] { RunLoop("health", [this] { HealthLoop(); }); });
  if (node_->has_pod_resources()) {
    threads_.emplace_back([this] {
      RunLoop("pod-resources", [this] {
        serving::ThreadRole::Scope pods(&pods_role_);
        PodsLoop();
      });
    });
  }
  return absl::OkStatus();
}

void PluginServer::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    if (started_) serving::SignalEventFd(stop_fd_);
    threads.swap(threads_);
  }
  node_->StopPodLists();  // the pods thread may wait for a List: it ends at once
  for (std::thread& t : threads) t.join();
  serving::ThreadRole::Scope lifecycle(&lifecycle_);
  StopServing();
  if (socket_id_ != 0 && serving::FileId(config_.SocketPath()) == socket_id_) {
    ::unlink(config_.SocketPath().c_str());
  }
  node_->SetRescanRequest(nullptr);
}

absl::Status PluginServer::Wait(int stop_fd) { return fatal_.Wait(stop_fd); }

void PluginServer::Fatal(const absl::Status& status) {
  if (!fatal_.Raise(status)) return;
  Log()->error("{}; the plugin cannot go on and exits so that it is restarted",
               std::string(status.message()));
}

void PluginServer::RunLoop(const char* name, const std::function<void()>& loop) {
  try {
    loop();
  } catch (const std::exception& e) {
    Fatal(absl::InternalError(absl::StrCat("the ", name, " thread failed: ", e.what())));
  }
}

absl::StatusOr<std::vector<bool>> PluginServer::WaitFor(const std::vector<int>& fds,
                                                        absl::Time deadline) {
  std::vector<struct pollfd> p;
  p.push_back({stop_fd_, POLLIN, 0});
  for (int fd : fds) p.push_back({fd, POLLIN, 0});
  const std::int64_t ms =
      deadline == absl::InfiniteFuture()
          ? -1
          : std::clamp<std::int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()) + 1, 0,
                                     INT_MAX);
  const int ready = poll_(p.data(), p.size(), static_cast<int>(ms));
  std::vector<bool> out(fds.size(), false);
  if (ready < 0) {
    if (errno == EINTR) return out;
    return Errno("poll");
  }
  if (p[0].revents != 0) return absl::CancelledError("stopping");
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (p[i + 1].revents & (POLLERR | POLLNVAL)) {
      return absl::InternalError(absl::StrCat("poll: descriptor ", fds[i], " is not usable"));
    }
    out[i] = (p[i + 1].revents & POLLIN) != 0;
  }
  return out;
}

absl::Status PluginServer::Serve() {
  StopServing();
  const std::string path = config_.SocketPath();
  service_ = std::make_unique<DevicePluginService>(node_.get());
  std::vector<grpc::Service*> services = {service_.get()};
  services.insert(services.end(), also_served_.begin(), also_served_.end());
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = serving::StartUnixServer(path, services);
  if (!server.ok()) {
    service_.reset();
    return server.status();
  }
  server_ = std::move(*server);
  socket_id_ = serving::FileId(path);
  if (socket_id_ == 0) {
    // Removed as soon as it appeared (a kubelet wiping its directory): no socket of ours to watch.
    StopServing();
    return absl::UnavailableError(absl::StrCat(path, " vanished as it was created"));
  }
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
  const std::uint64_t kubelet_ino = serving::FileId(config_.KubeletSocketPath());
  node_->KeepPreferred(std::nullopt);  // the kubelet's endpoint changes hands
  grpc::Status status = stub->Register(&context, request, &response);
  if (!status.ok()) {
    if (!register_failing_) {
      Log()->warn("registering with the kubelet on {} failed, retrying with backoff: {}",
                  config_.KubeletSocketPath(), status.error_message());
    }
    register_failing_ = true;
    return false;
  }
  register_failing_ = false;
  // kubelet.sock may have appeared during the call: its IN_CREATE is not a restart.
  kubelet_id_ = kubelet_ino != 0 ? kubelet_ino : serving::FileId(config_.KubeletSocketPath());
  // Counted before the line is logged: a reader that saw the line sees the count.
  node_->metrics().registrations.Add();
  Log()->info("Registered device plugin with Kubelet");
  return true;
}

bool PluginServer::DrainInotify() {
  bool restart = false;
  bool lost_watch = false;
  const std::uint64_t kubelet_id = kubelet_id_;
  const std::uint64_t socket_id = socket_id_;
  const int watch = kubelet_watch_;
  serving::ReadInotifyEvents(kubelet_inotify_, [&](const serving::InotifyEvent& ev) {
    const std::uint32_t mask = ev.mask;
    const std::string& name = ev.name;
    Log()->debug("inotify: {} wd={} mask={:#x}", name.empty() ? config_.kubelet_dir : name, ev.wd,
                 mask);
    // The directory we watch went away. The IN_IGNORED of a watch replaced earlier (a directory
    // seen replaced is watched again at once, and inotify_rm_watch queues one) is no news: that
    // replacement was a restart already, and taking it for a new one would re-register under the
    // kubelet's calls.
    if ((mask & IN_IGNORED) && ev.wd == watch) lost_watch = true;
    if (mask & IN_Q_OVERFLOW) restart = true;  // events were lost: assume the worst
    if (name == "kubelet.sock" && (mask & (IN_CREATE | IN_MOVED_TO)) &&
        serving::FileId(config_.KubeletSocketPath()) != kubelet_id) {
      restart = true;
    }
    if (name == config_.socket_name && (mask & (IN_DELETE | IN_MOVED_FROM))) {
      const std::uint64_t now = serving::FileId(config_.SocketPath());
      if (now == 0 || now != socket_id) restart = true;
    }
  });
  if (lost_watch) kubelet_watch_ = -1;
  return restart;
}

void PluginServer::LifecycleLoop() {
  absl::Time next_register = absl::Now();
  absl::Duration backoff = config_.register_backoff_min;
  bool registered = false;
  bool need_serve = false;  // our socket is gone and the last attempt to serve failed
  for (;;) {
    // Registered, an event wakes this thread, and so does a check every register_backoff_max:
    // inotify alone can miss a restart (the directory replaced between a read and a new watch,
    // a queue overflow), and while the directory is gone there is nothing to watch.
    const absl::Time wake =
        !registered ? next_register : absl::Now() + config_.register_backoff_max;
    absl::StatusOr<std::vector<bool>> ready = WaitFor({kubelet_inotify_}, wake);
    if (absl::IsCancelled(ready.status())) return;
    if (!ready.ok()) return Fatal(ready.status());

    bool restart = (*ready)[0] && DrainInotify();
    // The watch must be on the directory that is there now: re-watch one that came back or was
    // replaced (that is a restart: whatever happened in it was not seen). A directory removed
    // and made again may get the old one's inode number, so a lost watch alone says it too.
    if (!WatchingKubeletDir() && WatchKubeletDir()) {
      restart = true;
    }
    // Our socket must be the one we served, and kubelet.sock, once there, the one we registered
    // with. A kubelet.sock that is gone is a kubelet on its way down: registering before the new
    // one has cleared the directory (it removes our socket as it starts) only times out.
    const bool ours_gone = serving::FileId(config_.SocketPath()) != socket_id_;
    const std::uint64_t kubelet_now = serving::FileId(config_.KubeletSocketPath());
    if (registered && (ours_gone || (kubelet_now != 0 && kubelet_now != kubelet_id_))) {
      restart = true;
    }
    if (restart) {
      node_->metrics().kubelet_restarts.Add();
      Log()->info("kubelet restart detected in {}: serving again and re-registering",
                  config_.kubelet_dir);
      need_serve = need_serve || ours_gone;
      registered = false;
      backoff = config_.register_backoff_min;
      next_register = absl::Now();
    }
    // Never register an endpoint that is not there (the kubelet dials it at once).
    if (!registered && ours_gone) need_serve = true;
    if (need_serve && absl::Now() >= next_register) {
      if (absl::Status s = Serve(); s.ok()) {
        need_serve = false;
      } else {
        Log()->warn("{}; retrying", s.ToString());
        next_register = absl::Now() + backoff;
        backoff = std::min(backoff * 2, config_.register_backoff_max);
      }
    }
    if (!registered && !need_serve && absl::Now() >= next_register) {
      // Never registered without a watch on the directory served in: registered, only an event
      // wakes this thread. The directory may have come back between the check above and Serve
      // (a kubelet re-creating it), and what happened in it before the watch was not seen: our
      // socket must still be there.
      if (!WatchingKubeletDir() && !WatchKubeletDir()) {
        next_register = absl::Now() + backoff;
        backoff = std::min(backoff * 2, config_.register_backoff_max);
        continue;
      }
      if (serving::FileId(config_.SocketPath()) != socket_id_) {
        need_serve = true;
        continue;
      }
      registered = TryRegister();
      if (!registered) {
        next_register = absl::Now() + backoff;
        backoff = std::min(backoff * 2, config_.register_backoff_max);
      }
    }
  }
}

bool PluginServer::WatchingKubeletDir() const {
  return kubelet_watch_ >= 0 && serving::DirId(config_.kubelet_dir) == watched_dir_;
}

bool PluginServer::WatchKubeletDir() {
  const std::uint64_t dir = serving::DirId(config_.kubelet_dir);
  if (dir == 0) return false;
  if (kubelet_watch_ >= 0) ::inotify_rm_watch(kubelet_inotify_, kubelet_watch_);
  kubelet_watch_ = ::inotify_add_watch(kubelet_inotify_, config_.kubelet_dir.c_str(), kDirEvents);
  if (kubelet_watch_ < 0) return false;
  // The directory may have been replaced between the stat and the watch: then the next check
  // sees a different id and watches again.
  watched_dir_ = dir;
  return true;
}

void PluginServer::HealthLoop() {
  absl::Time next_poll = absl::Now() + config_.health_interval;
  for (;;) {
    absl::StatusOr<std::vector<bool>> ready = WaitFor({rescan_fd_}, next_poll);
    if (absl::IsCancelled(ready.status())) return;
    if (!ready.ok()) return Fatal(ready.status());
    if ((*ready)[0]) serving::DrainEventFd(rescan_fd_);
    if ((*ready)[0] || absl::Now() >= next_poll) {
      try {
        node_->Poll();
      } catch (const std::exception& e) {  // keep serving the last good state
        Log()->error("health poll failed: {}", e.what());
      }
      next_poll = absl::Now() + config_.health_interval;
    }
  }
}

void PluginServer::WatchPodsDir() {
  if (pods_watch_ >= 0 || config_.pod_resources_socket.empty()) return;
  const std::string dir =
      std::filesystem::path(config_.pod_resources_socket).parent_path().string();
  pods_watch_ = ::inotify_add_watch(pods_inotify_, dir.empty() ? "." : dir.c_str(),
                                    IN_CREATE | IN_MOVED_TO);
}

bool PluginServer::DrainPodsInotify() {
  const std::string socket =
      std::filesystem::path(config_.pod_resources_socket).filename().string();
  bool appeared = false;
  bool lost_watch = false;
  const int watch = pods_watch_;
  serving::ReadInotifyEvents(pods_inotify_, [&](const serving::InotifyEvent& ev) {
    if ((ev.mask & IN_IGNORED) && ev.wd == watch) lost_watch = true;
    if (ev.name == socket && (ev.mask & (IN_CREATE | IN_MOVED_TO))) appeared = true;
  });
  if (lost_watch) pods_watch_ = -1;
  return appeared;
}

void PluginServer::PodsLoop() {
  absl::Duration backoff = config_.pod_resources_backoff_min;
  const bool known = node_->pods_known();
  absl::Time next = absl::Now() + (known ? config_.health_interval : backoff);
  for (;;) {
    absl::StatusOr<std::vector<bool>> ready = WaitFor({pods_inotify_}, next);
    if (absl::IsCancelled(ready.status())) return;
    if (!ready.ok()) return Fatal(ready.status());
    if ((*ready)[0] && DrainPodsInotify()) {
      Log()->info("pod-resources socket {} appeared", config_.pod_resources_socket);
      next = absl::Now();
      backoff = config_.pod_resources_backoff_min;
    }
    WatchPodsDir();  // the directory may have appeared, or been re-created
    if (absl::Now() < next) continue;
    if (node_->RefreshPodsAndWait()) {
      backoff = config_.pod_resources_backoff_min;
      next = absl::Now() + config_.health_interval;
    } else {
      next = absl::Now() + backoff;
      backoff = std::min(backoff * 2, config_.health_interval);
    }
  }
}

}  // namespace rdp::deviceplugin
