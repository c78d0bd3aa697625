#include "sim/fake_pod_resources.h"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "proto/podresources.grpc.pb.h"
#include "serving/unix_server.h"

namespace rdp::sim {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(2);

}  // namespace

class FakePodResources::Service final : public v1::PodResourcesLister::Service {
 public:
  void Set(const deviceplugin::PodList& pods) {
    v1::ListPodResourcesResponse response;
    std::map<std::string, v1::PodResources*> by_pod;
    for (const deviceplugin::ContainerDevices& c : pods) {
      std::vector<std::string> parts = absl::StrSplit(c.key, '/');
      parts.resize(3);
      const std::string pod_key = parts[0] + "/" + parts[1];
      v1::PodResources*& pod = by_pod[pod_key];
      if (pod == nullptr) {
        pod = response.add_pod_resources();
        pod->set_namespace_(parts[0]);
        pod->set_name(parts[1]);
      }
      v1::ContainerResources* container = pod->add_containers();
      container->set_name(parts[2]);
      for (const auto& [resource, ids] : c.devices) {
        v1::ContainerDevices* d = container->add_devices();
        d->set_resource_name(resource);
        for (const std::string& id : ids) d->add_device_ids(id);
      }
    }
    absl::MutexLock lock(&mu_);
    response_ = std::move(response);
  }

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    *response = response_;
    if (delay_ > absl::ZeroDuration()) {
      // The answer is the list as it was asked for, sent late.
      // A CondVar loop, not Mutex::Await (ThreadSanitizer, test/sanitizers/).
      const absl::Time deadline = absl::Now() + delay_;
      while (!released_ && !released_cv_.WaitWithDeadline(&mu_, deadline)) {
      }
    }
    return grpc::Status::OK;
  }
  void SetDelay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
    released_cv_.SignalAll();
  }
  grpc::Status GetAllocatableResources(grpc::ServerContext*, const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* request,
                   v1::GetPodResourcesResponse* response) override {
    absl::MutexLock lock(&mu_);
    for (const auto& pod : response_.pod_resources()) {
      if (pod.name() == request->pod_name() && pod.namespace_() == request->pod_namespace()) {
        *response->mutable_pod_resources() = pod;
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such pod");
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  mutable absl::Mutex mu_;
  v1::ListPodResourcesResponse response_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar released_cv_;
};

FakePodResources::FakePodResources(std::string socket_path)
    : path_(std::move(socket_path)), service_(std::make_unique<Service>()) {}

FakePodResources::~FakePodResources() { Stop(); }

absl::Status FakePodResources::Start() {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  auto server = serving::StartUnixServer(path_, {service_.get()});
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  return absl::OkStatus();
}

void FakePodResources::Stop() {
  if (!server_) return;
  service_->Release();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  server_.reset();
  ::unlink(path_.c_str());
}

void FakePodResources::Set(const deviceplugin::PodList& pods) { service_->Set(pods); }

int FakePodResources::list_calls() const { return service_->calls(); }

void FakePodResources::SetDelay(absl::Duration delay) { service_->SetDelay(delay); }

}  // namespace rdp::sim
