#pragma once

// A kubelet stand-in for tests, `demo` and benchmarks, over real unix sockets: the Registration
// service on <dir>/kubelet.sock that, like the kubelet, dials each registered plugin, asks for
// its options and follows its ListAndWatch stream; a kubelet restart (wipe the sockets, serve
// again); and a fake v1.PodResourcesLister. Thread-safe.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/deviceplugin.grpc.pb.h"
#include "serving/unix_server.h"

namespace rdp::sim {

// A one-container GetPreferredAllocation request, as the kubelet builds it.
v1beta1::PreferredAllocationRequest PreferredRequest(const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must_include,
                                                     int size);

class KubeletSim {
 public:
  // dir: the device-plugin directory (created if missing).
  explicit KubeletSim(std::string dir);
  ~KubeletSim();  // Stop()
  KubeletSim(const KubeletSim&) = delete;
  KubeletSim& operator=(const KubeletSim&) = delete;

  // Serves Registration on <dir>/kubelet.sock.
  absl::Status Start();
  // Stops serving, ends every plugin stream, removes kubelet.sock.
  void Stop();
  // What a restarting kubelet does: Stop(), remove every socket in the directory (the
  // plugins' too), Start().
  absl::Status Restart();

  struct Registration {
    std::string version;
    std::string endpoint;
    std::string resource_name;
    bool pre_start_required = false;
    bool get_preferred_allocation_available = false;
    int generation = 0;  // which Start() of the simulator received it (1 = the first)
  };
  int registrations() const;
  // Waits until more than `count` registrations arrived; the latest one, or nullopt on timeout.
  std::optional<Registration> WaitForRegistration(int count, absl::Duration timeout) const;
  // Waits until a registration of `resource` arrived; the latest one, or nullopt on timeout.
  std::optional<Registration> WaitForRegistrationOf(const std::string& resource,
                                                    absl::Duration timeout) const;
  // Waits until a registration reached the current run of the simulator (since the last Start
  // or Restart); that registration, or nullopt on timeout.
  std::optional<Registration> WaitForCurrentRegistration(absl::Duration timeout) const;

  using Devices = std::vector<v1beta1::Device>;
  // Waits until the latest ListAndWatch list satisfies pred; that list, or nullopt on timeout.
  std::optional<Devices> WaitForDevices(const std::function<bool(const Devices&)>& pred,
                                        absl::Duration timeout) const;
  // The same for the streams of one resource: its latest list once one arrived.
  std::optional<Devices> WaitForDevicesOf(const std::string& resource,
                                          const std::function<bool(const Devices&)>& pred,
                                          absl::Duration timeout) const;
  // Number of lists received so far on all streams.
  int list_updates() const;
  // The most Healthy devices any list received so far had.
  int max_healthy() const;

  // While held, Register answers only once released (or after 10 s): a plugin's Register call
  // is then still under way while the simulator already dials it, as can happen with the kubelet.
  void HoldRegisterAnswers(bool hold);

  // A DevicePlugin stub on the endpoint of the latest registration.
  std::unique_ptr<v1beta1::DevicePlugin::Stub> PluginStub() const;
  // A DevicePlugin stub on the endpoint of the latest registration of `resource` (an endpoint
  // of "" when it has none).
  std::unique_ptr<v1beta1::DevicePlugin::Stub> PluginStubOf(const std::string& resource) const;
  std::string dir() const { return dir_; }

 private:
  class RegistrationService;
  struct Watcher {
    std::string resource;
    grpc::ClientContext context;
    std::thread thread;
  };
  void OnRegister(const Registration& r);
  void WaitWhileRegisterAnswersHeld();
  void Watch(Watcher* w, std::string endpoint, std::string resource);
  void StopWatchers();

  const std::string dir_;
  std::unique_ptr<RegistrationService> service_;
  std::unique_ptr<grpc::Server> server_;

  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  std::vector<std::unique_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(mu_);
  std::vector<Registration> registrations_ ABSL_GUARDED_BY(mu_);
  Devices devices_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Devices> devices_of_ ABSL_GUARDED_BY(mu_);  // by resource
  int list_updates_ ABSL_GUARDED_BY(mu_) = 0;
  int max_healthy_ ABSL_GUARDED_BY(mu_) = 0;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  int generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_register_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rdp::sim
