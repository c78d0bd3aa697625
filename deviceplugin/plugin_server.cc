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

class PluginServer::Endpoint {
 public:
  Endpoint(PluginServer& server, ResourceState& resource, std::string socket_name)
      : server_(server),
        resource_(resource),
        socket_name_(std::move(socket_name)),
        socket_path_((std::filesystem::path(server.config_.kubelet_dir) / socket_name_).string()),
        kubelet_inotify_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {}
  ~Endpoint() {
    if (kubelet_inotify_ >= 0) ::close(kubelet_inotify_);
  }

  bool ok() const { return kubelet_inotify_ >= 0; }
  const std::string& socket_path() const { return socket_path_; }

  // Watches the kubelet dir and serves the socket (Start, before the thread exists).
  absl::Status Begin() ABSL_LOCKS_EXCLUDED(lifecycle_) {
    serving::ThreadRole::Scope lifecycle(&lifecycle_);
    if (!WatchKubeletDir()) {
      return Errno(absl::StrCat("watching ", server_.config_.kubelet_dir));
    }
    return Serve();
  }
  // The lifecycle thread's body.
  void Run() ABSL_LOCKS_EXCLUDED(lifecycle_) {
    serving::ThreadRole::Scope lifecycle(&lifecycle_);
    LifecycleLoop();
  }
  // Stops serving and removes the socket when it is still ours (Stop, after the thread ended).
  void End() ABSL_LOCKS_EXCLUDED(lifecycle_) {
    serving::ThreadRole::Scope lifecycle(&lifecycle_);
    StopServing();
    if (socket_id_ != 0 && serving::FileId(socket_path_) == socket_id_) {
      ::unlink(socket_path_.c_str());
    }
  }

 private:
  // The lifecycle thread's work; it runs in Begin (before the thread exists) and End (after
  // it is joined) too, each holding lifecycle_.
  absl::Status Serve() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_);  // (re)creates the socket
  void StopServing() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_);
  bool TryRegister() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_);
  void LifecycleLoop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_);
  // Handles queued inotify events of the kubelet dir; returns true when the kubelet restarted.
  bool DrainInotify() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_);
  // (Re)watches the kubelet dir; false when it is not there or cannot be watched.
  bool WatchKubeletDir() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_);
  // Whether the kubelet directory there now is the one watched.
  bool WatchingKubeletDir() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_);

  PluginServer& server_;
  ResourceState& resource_;
  const std::string socket_name_;
  const std::string socket_path_;
  const int kubelet_inotify_;  // the kubelet dir

  serving::ThreadRole lifecycle_;
  std::unique_ptr<DevicePluginService> service_ ABSL_GUARDED_BY(lifecycle_);
  std::unique_ptr<grpc::Server> grpc_server_ ABSL_GUARDED_BY(lifecycle_);
  std::uint64_t socket_id_ ABSL_GUARDED_BY(lifecycle_) = 0;   // FileId of the socket we bound
  // FileId of kubelet.sock at our last registration.
  std::uint64_t kubelet_id_ ABSL_GUARDED_BY(lifecycle_) = 0;
  // A registration failure of the current streak was logged.
  bool register_failing_ ABSL_GUARDED_BY(lifecycle_) = false;
  int kubelet_watch_ ABSL_GUARDED_BY(lifecycle_) = -1;
  std::uint64_t watched_dir_ ABSL_GUARDED_BY(lifecycle_) = 0;  // DirId of kubelet_watch_'s dir
};

PluginServer::PluginServer(Config config, NodeSources sources,
                           std::vector<resources::Resource> served,
                           std::vector<grpc::Service*> also_served)
    : config_(std::move(config)),
      also_served_(std::move(also_served)),
      served_(std::move(served)),
      poll_(sources.poll),
      node_(std::make_unique<NodeState>(config_, std::move(sources), served_)),
      stop_fd_(serving::NewEventFd()),
      rescan_fd_(serving::NewEventFd()),
      pods_inotify_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  const std::vector<std::string> sockets = SocketNames(config_, served_);
  for (std::size_t i = 0; i < sockets.size(); ++i) {
    endpoints_.push_back(std::make_unique<Endpoint>(*this, node_->resource(i), sockets[i]));
  }
}

PluginServer::~PluginServer() {
  Stop();
  endpoints_.clear();
  for (int fd : {pods_inotify_, stop_fd_, rescan_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

std::vector<std::string> PluginServer::SocketPaths() const {
  std::vector<std::string> out;
  for (const auto& e : endpoints_) out.push_back(e->socket_path());
  return out;
}

absl::Status PluginServer::Prepare(const ResourceCheck& check) {
  absl::MutexLock lock(&mu_);
  if (prepared_) return absl::OkStatus();
  if (absl::Status s = node_->Init(); !s.ok()) return s;
  if (check) {
    std::vector<resources::Resource> served;
    for (const auto& r : node_->resources()) served.push_back(r->resource());
    if (absl::Status s = check(served, *node_->topology()); !s.ok()) return s;
  }
  prepared_ = true;
  return absl::OkStatus();
}

absl::Status PluginServer::Start() {
  bool ok = stop_fd_ >= 0 && fatal_.ok() && rescan_fd_ >= 0 && pods_inotify_ >= 0;
  for (const auto& e : endpoints_) ok = ok && e->ok();
  if (!ok) return Errno("inotify/eventfd");
  if (absl::Status s = ValidateResources(config_, served_); !s.ok()) return s;
  if (absl::Status s = Prepare(); !s.ok()) return s;
  node_->SetRescanRequest([fd = rescan_fd_] { serving::SignalEventFd(fd); });
  if (node_->has_pod_resources()) {
    serving::ThreadRole::Scope pods(&pods_role_);
    WatchPodsDir();
    // One short try before serving, so that the kubelet's first list is not needlessly all
    // withheld; the List goes on, and the pods thread retries.
    node_->RefreshPodsAndWait(config_.pod_resources_first_wait);
  }
  std::error_code ec;
  std::filesystem::create_directories(config_.kubelet_dir, ec);
  for (const auto& e : endpoints_) {
    if (absl::Status s = e->Begin(); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  started_ = true;
  for (const auto& e : endpoints_) {
    Endpoint* endpoint = e.get();
    threads_.emplace_back([this, endpoint] {
      RunLoop("lifecycle", [endpoint] { endpoint->Run(); });
    });
  }
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
  for (const auto& e : endpoints_) e->End();
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

absl::Status PluginServer::Endpoint::Serve() {
  StopServing();
  const std::string& path = socket_path_;
  service_ = std::make_unique<DevicePluginService>(&resource_);
  std::vector<grpc::Service*> services = {service_.get()};
  services.insert(services.end(), server_.also_served_.begin(), server_.also_served_.end());
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = serving::StartUnixServer(path, services);
  if (!server.ok()) {
    service_.reset();
    return server.status();
  }
  grpc_server_ = std::move(*server);
  socket_id_ = serving::FileId(path);
  if (socket_id_ == 0) {
    // Removed as soon as it appeared (a kubelet wiping its directory): no socket of ours to watch.
    StopServing();
    return absl::UnavailableError(absl::StrCat(path, " vanished as it was created"));
  }
  Log()->info("serving {} on {}", resource_.name(), path);
  return absl::OkStatus();
}

void PluginServer::Endpoint::StopServing() {
  if (service_) service_->Stop();
  if (grpc_server_) grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  grpc_server_.reset();
  service_.reset();
}

bool PluginServer::Endpoint::TryRegister() {
  grpc::ChannelArguments args;
  // A fresh subchannel per attempt: a restarted kubelet must not wait out an old backoff.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel("unix://" + server_.config_.KubeletSocketPath(),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version(kApiVersion);
  request.set_endpoint(socket_name_);
  request.set_resource_name(resource_.name());
  request.mutable_options()->set_pre_start_required(false);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + server_.config_.register_timeout));
  v1beta1::Empty response;
  const std::uint64_t kubelet_ino = serving::FileId(server_.config_.KubeletSocketPath());
  resource_.KeepPreferred(std::nullopt);  // the kubelet's endpoint changes hands
  grpc::Status status = stub->Register(&context, request, &response);
  if (!status.ok()) {
    if (!register_failing_) {
      Log()->warn("registering with the kubelet on {} failed, retrying with backoff: {}",
                  server_.config_.KubeletSocketPath(), status.error_message());
    }
    register_failing_ = true;
    return false;
  }
  register_failing_ = false;
  // kubelet.sock may have appeared during the call: its IN_CREATE is not a restart.
  kubelet_id_ =
      kubelet_ino != 0 ? kubelet_ino : serving::FileId(server_.config_.KubeletSocketPath());
  // Counted before the line is logged: a reader that saw the line sees the count.
  resource_.metrics().registrations.Add();
  if (server_.endpoints_.size() == 1) {
    Log()->info("Registered device plugin with Kubelet");
  } else {
    Log()->info("Registered device plugin with Kubelet: {}", resource_.name());
  }
  return true;
}

bool PluginServer::Endpoint::DrainInotify() {
  bool restart = false;
  bool lost_watch = false;
  const std::uint64_t kubelet_id = kubelet_id_;
  const std::uint64_t socket_id = socket_id_;
  const int watch = kubelet_watch_;
  serving::ReadInotifyEvents(kubelet_inotify_, [&](const serving::InotifyEvent& ev) {
    const std::uint32_t mask = ev.mask;
    const std::string& name = ev.name;
    Log()->debug("inotify: {} wd={} mask={:#x}",
                 name.empty() ? server_.config_.kubelet_dir : name, ev.wd,
                 mask);
    // The directory we watch went away. The IN_IGNORED of a watch replaced earlier (a directory
    // seen replaced is watched again at once, and inotify_rm_watch queues one) is no news: that
    // replacement was a restart already, and taking it for a new one would re-register under the
    // kubelet's calls.
    if ((mask & IN_IGNORED) && ev.wd == watch) lost_watch = true;
    if (mask & IN_Q_OVERFLOW) restart = true;  // events were lost: assume the worst
    if (name == "kubelet.sock" && (mask & (IN_CREATE | IN_MOVED_TO)) &&
        serving::FileId(server_.config_.KubeletSocketPath()) != kubelet_id) {
      restart = true;
    }
    if (name == socket_name_ && (mask & (IN_DELETE | IN_MOVED_FROM))) {
      const std::uint64_t now = serving::FileId(socket_path_);
      if (now == 0 || now != socket_id) restart = true;
    }
  });
  if (lost_watch) kubelet_watch_ = -1;
  return restart;
}

void PluginServer::Endpoint::LifecycleLoop() {
  absl::Time next_register = absl::Now();
  absl::Duration backoff = server_.config_.register_backoff_min;
  bool registered = false;
  bool need_serve = false;  // our socket is gone and the last attempt to serve failed
  for (;;) {
    // Registered, an event wakes this thread, and so does a check every register_backoff_max:
    // inotify alone can miss a restart (the directory replaced between a read and a new watch,
    // a queue overflow), and while the directory is gone there is nothing to watch.
    const absl::Time wake =
        !registered ? next_register : absl::Now() + server_.config_.register_backoff_max;
    absl::StatusOr<std::vector<bool>> ready = server_.WaitFor({kubelet_inotify_}, wake);
    if (absl::IsCancelled(ready.status())) return;
    if (!ready.ok()) return server_.Fatal(ready.status());

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
    const bool ours_gone = serving::FileId(socket_path_) != socket_id_;
    const std::uint64_t kubelet_now = serving::FileId(server_.config_.KubeletSocketPath());
    if (registered && (ours_gone || (kubelet_now != 0 && kubelet_now != kubelet_id_))) {
      restart = true;
    }
    if (restart) {
      resource_.metrics().kubelet_restarts.Add();
      Log()->info("kubelet restart detected in {}: serving again and re-registering",
                  server_.config_.kubelet_dir);
      need_serve = need_serve || ours_gone;
      registered = false;
      backoff = server_.config_.register_backoff_min;
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
        backoff = std::min(backoff * 2, server_.config_.register_backoff_max);
      }
    }
    if (!registered && !need_serve && absl::Now() >= next_register) {
      // Never registered without a watch on the directory served in: registered, only an event
      // wakes this thread. The directory may have come back between the check above and Serve
      // (a kubelet re-creating it), and what happened in it before the watch was not seen: our
      // socket must still be there.
      if (!WatchingKubeletDir() && !WatchKubeletDir()) {
        next_register = absl::Now() + backoff;
        backoff = std::min(backoff * 2, server_.config_.register_backoff_max);
        continue;
      }
      if (serving::FileId(socket_path_) != socket_id_) {
        need_serve = true;
        continue;
      }
      registered = TryRegister();
      if (!registered) {
        next_register = absl::Now() + backoff;
        backoff = std::min(backoff * 2, server_.config_.register_backoff_max);
      }
    }
  }
}

bool PluginServer::Endpoint::WatchingKubeletDir() const {
  return kubelet_watch_ >= 0 && serving::DirId(server_.config_.kubelet_dir) == watched_dir_;
}

bool PluginServer::Endpoint::WatchKubeletDir() {
  const std::uint64_t dir = serving::DirId(server_.config_.kubelet_dir);
  if (dir == 0) return false;
  if (kubelet_watch_ >= 0) ::inotify_rm_watch(kubelet_inotify_, kubelet_watch_);
  kubelet_watch_ =
      ::inotify_add_watch(kubelet_inotify_, server_.config_.kubelet_dir.c_str(), kDirEvents);
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
