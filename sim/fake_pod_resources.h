#pragma once

// A fake of the kubelet's v1.PodResourcesLister on a unix socket, for tests, the demo and the
// benchmarks: List answers with the containers Set() was given. Thread-safe.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "deviceplugin/pod_resources.h"

namespace rdp::sim {

// v1.PodResourcesLister on a unix socket, answering List with what Set() was given.
class FakePodResources {
 public:
  explicit FakePodResources(std::string socket_path);
  ~FakePodResources();
  absl::Status Start();
  void Stop();
  // Containers keyed "<namespace>/<pod>/<container>" with their devices.
  void Set(const deviceplugin::PodList& pods);
  int list_calls() const;
  // Each List answers this much later (a kubelet with hundreds of pods, or a throttled one);
  // Stop releases the Lists waiting.
  void SetDelay(absl::Duration delay);

 private:
  class Service;
  const std::string path_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace rdp::sim
