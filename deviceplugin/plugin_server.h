#pragma once

// The plugin's lifecycle on a node: serve v1beta1.DevicePlugin on <kubelet-dir>/<socket-name>,
// then register with the kubelet on <kubelet-dir>/kubelet.sock, retrying with exponential
// backoff while the kubelet is absent; when the kubelet restarts (kubelet.sock re-created, or
// our socket removed) serve again and re-register at once. Three background threads, each
// timed by poll(2) on its own descriptors (nothing sleeps), so that none waits on another:
//  - lifecycle: serving and registration (inotify on the kubelet dir);
//  - health: the health poll and hotplug re-discovery every config.health_interval, and at once
//    when an RPC finds a device node gone;
//  - pods: the kubelet's pod list, every health_interval once known; while unknown, retried
//    with backoff and at once when the socket appears (inotify on its directory).
// A thread that cannot wait any more (poll(2) fails) is fatal: Wait() returns its error, and
// the process should exit non-zero so that it restarts instead of serving stale state.

#include <poll.h>

#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "deviceplugin/config.h"
#include "deviceplugin/node_state.h"
#include "deviceplugin/service.h"
#include "serving/fatal_latch.h"
#include "serving/thread_role.h"

namespace rdp::deviceplugin {

class PluginServer {
 public:
  // `also_served`: services served beside DevicePlugin on the plugin's socket, each time it is
  // served (not owned: they must outlive the server). A benchmark's hook (bench_rpc's payload
  // floor); the product serves none, and no flag sets it.
  PluginServer(Config config, NodeSources sources, std::vector<grpc::Service*> also_served = {});
  ~PluginServer();  // Stop(), then closes the descriptors
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Discovers the node, asks once for the kubelet's pod list (bounded), serves the socket and
  // starts the background threads (registration follows asynchronously). Errors when discovery
  // fails, the socket cannot be served or the directory cannot be watched; then nothing keeps
  // running.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every ListAndWatch stream, stops serving, removes our socket, joins the threads.
  // Idempotent; safe from any thread but not from a signal handler.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until `stop_fd` is readable (OK) or a background thread failed (its error). Does not
  // Stop().
  absl::Status Wait(int stop_fd);

  NodeState& node() { return *node_; }
  const Config& config() const { return config_; }

 private:
  // The lifecycle thread's work; it runs in Start (before the thread exists) and Stop (after
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

  void HealthLoop();

  // The pods thread's work (and Start's, before that thread exists), holding pods_role_.
  void PodsLoop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pods_role_);
  // Handles queued inotify events of the pod-resources dir; true when the socket appeared.
  bool DrainPodsInotify() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pods_role_);
  void WatchPodsDir() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pods_role_);

  // Waits on the stop descriptor and `fds` until `deadline`: which of `fds` are readable;
  // Cancelled once Stop() was called; Internal when poll(2) fails or a descriptor is invalid.
  absl::StatusOr<std::vector<bool>> WaitFor(const std::vector<int>& fds, absl::Time deadline);
  // Runs `loop`; a failure other than Cancelled is fatal.
  void RunLoop(const char* name, const std::function<void()>& loop);
  void Fatal(const absl::Status& status);

  const Config config_;
  const std::vector<grpc::Service*> also_served_;
  const std::function<int(struct pollfd*, nfds_t, int)> poll_;  // NodeSources::poll
  const std::unique_ptr<NodeState> node_;

  // Descriptors, made with the server and closed with it (-1: could not be made; Start fails).
  const int stop_fd_;           // eventfd written once by Stop(), never read: wakes every thread
  const int rescan_fd_;         // eventfd: the health thread polls at once
  const int kubelet_inotify_;   // the kubelet dir (lifecycle thread)
  const int pods_inotify_;      // the pod-resources socket's dir (pods thread)

  serving::ThreadRole lifecycle_;
  std::unique_ptr<DevicePluginService> service_ ABSL_GUARDED_BY(lifecycle_);
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(lifecycle_);
  std::uint64_t socket_id_ ABSL_GUARDED_BY(lifecycle_) = 0;   // FileId of the socket we bound
  // FileId of kubelet.sock at our last registration.
  std::uint64_t kubelet_id_ ABSL_GUARDED_BY(lifecycle_) = 0;
  // A registration failure of the current streak was logged.
  bool register_failing_ ABSL_GUARDED_BY(lifecycle_) = false;
  int kubelet_watch_ ABSL_GUARDED_BY(lifecycle_) = -1;
  std::uint64_t watched_dir_ ABSL_GUARDED_BY(lifecycle_) = 0;  // DirId of kubelet_watch_'s dir

  serving::ThreadRole pods_role_;
  int pods_watch_ ABSL_GUARDED_BY(pods_role_) = -1;

  absl::Mutex mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  serving::FatalLatch fatal_;
};

}  // namespace rdp::deviceplugin
