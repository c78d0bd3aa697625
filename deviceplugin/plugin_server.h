#pragma once

// The plugin's lifecycle on a node, for each resource it serves (one device plugin per resource,
// over one NodeState): serve v1beta1.DevicePlugin on <kubelet-dir>/<socket>, then register the
// resource with the kubelet on <kubelet-dir>/kubelet.sock, retrying with exponential backoff
// while the kubelet is absent; when the kubelet restarts (kubelet.sock re-created, or the
// resource's socket removed) serve again and re-register at once. The socket is
// config.socket_name for the one resource a Config alone describes, Resource::SocketName()
// for resources given. Background threads, each timed by poll(2) on its own descriptors (nothing
// sleeps), so that none waits on another:
//  - lifecycle, one per resource: its serving and registration (inotify on the kubelet dir);
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
#include "resources/resources.h"
#include "serving/fatal_latch.h"
#include "serving/thread_role.h"
#include "topology/topology.h"

namespace rdp::deviceplugin {

class PluginServer {
 public:
  // Checks the resources against the node once it is discovered (an HCA two exclusive resources
  // select, ...): an error refuses the start, before anything is served or registered.
  using ResourceCheck = std::function<absl::Status(const std::vector<resources::Resource>&,
                                                   const topology::Topology&)>;

  // `served`: the resources, each its own device plugin (empty: DefaultResource(config) alone,
  // on config.socket_name). `also_served`: services served beside DevicePlugin on every socket,
  // each time it is served (not owned: they must outlive the server). A benchmark's hook
  // (bench_rpc's payload floor); the product serves none, and no flag sets it.
  PluginServer(Config config, NodeSources sources, std::vector<resources::Resource> served = {},
               std::vector<grpc::Service*> also_served = {});
  ~PluginServer();  // Stop(), then closes the descriptors
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Discovers the node (NodeState::Init), then runs `check` (null: none) on the resources and
  // the snapshot. The discovery's error, or the check's, unchanged; nothing is served either way.
  // Once it succeeded, later calls return OK at once.
  absl::Status Prepare(const ResourceCheck& check = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Checks the resources (ValidateResources), Prepare() unless done, asks once for the kubelet's
  // pod list (bounded), serves every resource's socket and starts the background threads
  // (registrations follow asynchronously). Errors when a resource is invalid, discovery fails,
  // a socket cannot be served or the directory cannot be watched; then nothing keeps running.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every ListAndWatch stream, stops serving, removes our socket, joins the threads.
  // Idempotent; safe from any thread but not from a signal handler.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until `stop_fd` is readable (OK) or a background thread failed (its error). Does not
  // Stop().
  absl::Status Wait(int stop_fd);

  NodeState& node() { return *node_; }
  const Config& config() const { return config_; }
  // Where each resource is served, in the order of NodeState::resources().
  std::vector<std::string> SocketPaths() const;

 private:
  // One resource's device plugin: its socket, service, registration and lifecycle thread.
  class Endpoint;

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
  const std::vector<resources::Resource> served_;  // as given (empty: the Config's one)
  const std::function<int(struct pollfd*, nfds_t, int)> poll_;  // NodeSources::poll
  const std::unique_ptr<NodeState> node_;

  // Descriptors, made with the server and closed with it (-1: could not be made; Start fails).
  const int stop_fd_;           // eventfd written once by Stop(), never read: wakes every thread
  const int rescan_fd_;         // eventfd: the health thread polls at once
  const int pods_inotify_;      // the pod-resources socket's dir (pods thread)
  // One per resource of node_, in its order; made with the server.
  std::vector<std::unique_ptr<Endpoint>> endpoints_;

  serving::ThreadRole pods_role_;
  int pods_watch_ ABSL_GUARDED_BY(pods_role_) = -1;

  absl::Mutex mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  serving::FatalLatch fatal_;
};

}  // namespace rdp::deviceplugin
