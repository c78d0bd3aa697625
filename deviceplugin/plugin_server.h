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

#include <atomic>
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

namespace rdp::deviceplugin {

class PluginServer {
 public:
  PluginServer(Config config, NodeSources deps);
  ~PluginServer();  // Stop()
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Discovers the node, asks once for the kubelet's pod list (bounded), serves the socket and
  // starts the background threads (registration follows asynchronously). Errors when discovery
  // fails, the socket cannot be served or the directory cannot be watched; then nothing keeps
  // running.
  absl::Status Start();
  // Ends every ListAndWatch stream, stops serving, removes our socket, joins the threads.
  // Idempotent; safe from any thread but not from a signal handler.
  void Stop();
  // Blocks until `stop_fd` is readable (OK) or a background thread failed (its error). Does not
  // Stop().
  absl::Status Wait(int stop_fd);

  NodeState& node() { return *node_; }
  const Config& config() const { return config_; }
  int registrations() const { return registrations_.load(); }  // successful ones so far
  int serves() const { return serves_.load(); }                // times the socket was created

 private:
  absl::Status Serve();  // (re)creates the socket and the gRPC server; lifecycle thread or Start
  void StopServing();
  bool TryRegister();
  void LifecycleLoop();
  void HealthLoop();
  void PodsLoop();
  // Waits on the stop descriptor and `fds` until `deadline`: which of `fds` are readable;
  // Cancelled once Stop() was called; Internal when poll(2) fails or a descriptor is invalid.
  absl::StatusOr<std::vector<bool>> WaitFor(const std::vector<int>& fds, absl::Time deadline);
  // Runs `loop`; a failure other than Cancelled is fatal.
  void RunLoop(const char* name, void (PluginServer::*loop)());
  void Fatal(const absl::Status& status);
  // Handles queued inotify events of the kubelet dir; returns true when the kubelet restarted.
  bool DrainInotify();
  // Handles queued inotify events of the pod-resources dir; true when the socket appeared.
  bool DrainPodsInotify();
  void WatchPodsDir();

  const Config config_;
  const std::function<int(struct pollfd*, nfds_t, int)> poll_;  // NodeSources::poll
  std::unique_ptr<NodeState> node_;
  std::atomic<int> registrations_{0};
  std::atomic<int> serves_{0};

  // Owned by whichever thread runs Serve/StopServing: Start, then the lifecycle thread, then
  // Stop after join.
  std::unique_ptr<DevicePluginService> service_;
  std::unique_ptr<grpc::Server> server_;
  // (Re)watches the kubelet dir; false when it is not there or cannot be watched.
  bool WatchKubeletDir();
  std::uint64_t socket_ino_ = 0;   // FileId of the socket we bound
  std::uint64_t kubelet_ino_ = 0;  // FileId of kubelet.sock at our last registration
  bool failing_ = false;           // a registration failure was logged in this streak

  int stop_fd_ = -1;     // eventfd written once by Stop(), never read: wakes every thread
  int rescan_fd_ = -1;   // eventfd: the health thread polls at once
  int inotify_fd_ = -1;  // the kubelet dir
  int watch_ = -1;
  std::uint64_t watched_dir_ = 0;  // DirId of the directory watch_ is on
  int pods_inotify_fd_ = -1;  // the pod-resources socket's dir (pods thread)
  int pods_watch_ = -1;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  serving::FatalLatch fatal_;
};

}  // namespace rdp::deviceplugin
