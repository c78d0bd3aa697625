#pragma once

// The DRA driver's serving lifecycle on a node: DRAPlugin (v1 and v1beta1), DRAResourceHealth
// (v1 and v1alpha1, when given a feed) and the readiness health check on
// <kubelet-dir>/plugins/<driver>/dra.sock, then pluginregistration.Registration on
// <kubelet-dir>/plugins_registry/<driver>-reg.sock, whose appearance makes the kubelet's plugin
// watcher register us (it calls GetInfo, dials the endpoint, and tells us
// NotifyRegistrationStatus).
//
// A socket of ours that is removed or replaced (a kubelet restart wiping its directories, an
// operator) is served again at once: one background thread waits with poll(2) on an inotify
// watch of both directories (re-watched when they come back) and, as a safety net for missed
// events, re-checks every config.recheck. The registration socket is re-created last, and
// whenever the DRA socket was, so that the kubelet's last registration is always one made while
// the endpoint was there. Sockets are bound under a hidden name and renamed into place
// (serving::StartUnixServer): the plugin watcher ignores dot files, so it sees each socket once,
// complete. Each serve logs "serving <DRAPlugin|Registration> on <path>"; a serve that fails
// logs its error and "; retrying".

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dra/dra_service.h"
#include "dra/driver.h"
#include "dra/health.h"
#include "grpcpp/grpcpp.h"
#include "serving/fatal_latch.h"

namespace rdp::dra {

struct DraServerConfig {
  std::string kubelet_dir = "/var/lib/kubelet";
  std::string driver_name = kDefaultDriverName;
  absl::Duration recheck = absl::Seconds(5);
  absl::Duration retry_min = absl::Milliseconds(100);  // serving again after a failure
  // Hand over when another instance asks for the plugin directory (its HandoverFile appears,
  // dra/plugin_lock.h): Wait then returns Aborted, and the caller stops and releases the lock.
  bool handover = false;

  std::string PluginDir() const;           // <kubelet_dir>/plugins/<driver>
  std::string DraSocket() const;           // <PluginDir>/dra.sock
  std::string RegistrationDir() const;     // <kubelet_dir>/plugins_registry
  std::string RegistrationSocket() const;  // <RegistrationDir>/<driver>-reg.sock
  std::string HandoverFile() const;        // <PluginDir>/handover
};

class DraServer {
 public:
  // `driver` is not owned and must outlive the server. With a `health` feed (not owned, outlives
  // the server), the DRA socket also serves DRAResourceHealth (v1 and v1alpha1) from it and
  // GetInfo lists both after DRAPlugin's versions; Stop() stops the feed (its streams end).
  DraServer(DraServerConfig config, Driver* driver, HealthFeed* health = nullptr);
  ~DraServer();  // Stop()
  DraServer(const DraServer&) = delete;
  DraServer& operator=(const DraServer&) = delete;

  // Creates the directories, serves both sockets, starts the lifecycle thread. Errors when a
  // socket cannot be served or the directories cannot be watched; then nothing keeps running.
  absl::Status Start();
  // Removes the registration socket (the kubelet unregisters us), stops serving, removes the
  // DRA socket, joins the thread. Idempotent.
  void Stop();
  // Blocks until `stop_fd` is readable (OK) or the lifecycle thread failed (its error), or, with
  // config.handover, another instance asked for the plugin directory (Aborted naming its pid;
  // the sockets are still served: the caller stops the server).
  absl::Status Wait(int stop_fd);

  RegistrationService& registration() { return *registration_; }
  // Whether the kubelet has the driver registered now (the last NotifyRegistrationStatus).
  bool registered() const { return registration_->state().registered; }
  const DraServerConfig& config() const { return config_; }

 private:
  struct Socket {
    std::string path;
    std::string what;  // for the log: "DRAPlugin", "Registration"
    std::vector<grpc::Service*> services;
    std::unique_ptr<grpc::Server> server;
    std::uint64_t id = 0;  // serving::FileId of what we bound
  };
  absl::Status Serve(Socket& socket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the socket's server; calls in flight may run until `deadline`.
  void StopServing(Socket& socket, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // (Re)watches both directories: those whose identity changed, or both when `force`. False
  // when one is not there or cannot be watched.
  bool WatchDirs(bool force);
  void Loop();
  void Fatal(const absl::Status& status);

  const DraServerConfig config_;
  DraService<DraServiceV1> dra_v1_;
  DraService<DraServiceV1beta1> dra_v1beta1_;
  std::unique_ptr<RegistrationService> registration_;
  ReadinessService readiness_;
  HealthFeed* const health_;
  HealthService<HealthServiceV1> health_v1_;
  HealthService<HealthServiceV1alpha1> health_v1alpha1_;

  absl::Mutex mu_;
  Socket dra_ ABSL_GUARDED_BY(mu_);
  Socket reg_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  serving::FatalLatch fatal_;

  int stop_fd_ = -1;   // eventfd written by Stop()
  int inotify_fd_ = -1;
  int plugin_watch_ = -1;  // lifecycle thread (and Start) only
  int reg_watch_ = -1;
  std::uint64_t plugin_dir_id_ = 0;
  std::uint64_t reg_dir_id_ = 0;
  std::thread thread_;
};

}  // namespace rdp::dra
