#pragma once

// The plugin's lifecycle on a node: serve v1beta1.DevicePlugin on <kubelet-dir>/<socket-name>,
// then register with the kubelet on <kubelet-dir>/kubelet.sock, retrying with exponential
// backoff while the kubelet is absent; poll health every config.health_interval; watch the
// directory with inotify and, when the kubelet restarts (kubelet.sock re-created, or our socket
// removed), serve again and re-register at once. One background thread does all of this, timed
// by poll(2) on the inotify descriptor, so nothing sleeps.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/config.h"
#include "server/plugin.h"
#include "server/service.h"

namespace rdp::server {

class PluginServer {
 public:
  PluginServer(Config config, PluginDeps deps);
  ~PluginServer();  // Stop()
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Discovers the node, serves the socket and starts the background thread (registration
  // follows asynchronously). Errors when discovery fails, the socket cannot be served or the
  // directory cannot be watched; then nothing keeps running.
  absl::Status Start();
  // Ends every ListAndWatch stream, stops serving, removes our socket, joins the thread.
  // Idempotent; safe from any thread but not from a signal handler.
  void Stop();

  Plugin& plugin() { return *plugin_; }
  const Config& config() const { return config_; }
  int registrations() const { return registrations_.load(); }  // successful ones so far
  int serves() const { return serves_.load(); }                // times the socket was created

 private:
  absl::Status Serve();  // (re)creates the socket and the gRPC server; loop thread or Start
  void StopServing();
  bool TryRegister();
  void Loop();
  // Handles queued inotify events; returns true when the kubelet restarted.
  bool DrainInotify();

  const Config config_;
  std::unique_ptr<Plugin> plugin_;
  std::atomic<int> registrations_{0};
  std::atomic<int> serves_{0};

  // Owned by whichever thread runs Serve/StopServing: Start, then the loop, then Stop after join.
  std::unique_ptr<DevicePluginService> service_;
  std::unique_ptr<grpc::Server> server_;
  static std::uint64_t FileId(const std::string& path);
  std::uint64_t socket_ino_ = 0;   // FileId of the socket we bound
  std::uint64_t kubelet_ino_ = 0;  // FileId of kubelet.sock at our last registration
  bool failing_ = false;           // a registration failure was logged in this streak

  int inotify_fd_ = -1;
  int watch_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  absl::Mutex stop_mu_;
  bool started_ ABSL_GUARDED_BY(stop_mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace rdp::server
