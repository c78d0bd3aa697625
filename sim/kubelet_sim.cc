#include "sim/kubelet_sim.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "serving/unix_server.h"

namespace rdp::sim {
namespace {

using serving::StartUnixServer;
using serving::UnixChannel;

constexpr absl::Duration kRpcTimeout = absl::Seconds(2);

}  // namespace

class KubeletSim::RegistrationService final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationService(KubeletSim* sim) : sim_(sim) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    if (request->version() != "v1beta1") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "unsupported version " + request->version());
    }
    Registration r{request->version(), request->endpoint(), request->resource_name(),
                   request->options().pre_start_required(),
                   request->options().get_preferred_allocation_available()};
    sim_->OnRegister(r);
    sim_->WaitWhileRegisterAnswersHeld();
    return grpc::Status::OK;
  }

 private:
  KubeletSim* const sim_;
};

KubeletSim::KubeletSim(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
}

KubeletSim::~KubeletSim() {
  Stop();
  StopWatchers();
}

absl::Status KubeletSim::Start() {
  const std::string path = (std::filesystem::path(dir_) / "kubelet.sock").string();
  service_ = std::make_unique<RegistrationService>(this);
  {
    // Before the socket appears: a plugin may register the moment it does, and that
    // registration belongs to this run.
    absl::MutexLock lock(&mu_);
    ++generation_;
  }
  auto server = serving::StartUnixServer(path, {service_.get()});
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  absl::MutexLock lock(&mu_);
  serving_ = true;
  return absl::OkStatus();
}

void KubeletSim::Stop() {
  {
    absl::MutexLock lock(&mu_);
    hold_register_ = false;  // a held Register must not hold the server's shutdown
    cv_.SignalAll();
    if (!serving_) return;
    serving_ = false;
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  server_.reset();
  service_.reset();
  StopWatchers();
  ::unlink((std::filesystem::path(dir_) / "kubelet.sock").c_str());
}

absl::Status KubeletSim::Restart() {
  Stop();
  std::error_code ec;
  // Like a kubelet starting: every socket in the directory goes (error codes throughout: a
  // plugin removing its own socket meanwhile is not an error).
  std::error_code rm;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_socket(rm)) std::filesystem::remove(it->path(), rm);
  }
  return Start();
}

void KubeletSim::StopWatchers() {
  std::vector<std::unique_ptr<Watcher>> watchers;
  {
    absl::MutexLock lock(&mu_);
    watchers.swap(watchers_);
  }
  for (auto& w : watchers) w->context.TryCancel();
  for (auto& w : watchers) {
    if (w->thread.joinable()) w->thread.join();
  }
}

void KubeletSim::OnRegister(const Registration& r) {
  absl::MutexLock lock(&mu_);
  // The kubelet replaces a resource's endpoint on re-registration: drop its old streams.
  for (auto& w : watchers_) {
    if (w->resource == r.resource_name) w->context.TryCancel();
  }
  registrations_.push_back(r);
  registrations_.back().generation = generation_;
  auto w = std::make_unique<Watcher>();
  Watcher* raw = w.get();
  raw->resource = r.resource_name;
  const std::string endpoint = (std::filesystem::path(dir_) / r.endpoint).string();
  watchers_.push_back(std::move(w));
  raw->thread = std::thread(
      [this, raw, endpoint, resource = r.resource_name] { Watch(raw, endpoint, resource); });
  cv_.SignalAll();
}

void KubeletSim::Watch(Watcher* w, std::string endpoint, std::string resource) {
  auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(endpoint));
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    v1beta1::Empty empty;
    v1beta1::DevicePluginOptions options;
    stub->GetDevicePluginOptions(&context, empty, &options);
  }
  auto reader = stub->ListAndWatch(&w->context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse response;
  while (reader->Read(&response)) {
    absl::MutexLock lock(&mu_);
    devices_.assign(response.devices().begin(), response.devices().end());
    devices_of_[resource] = devices_;
    ++list_updates_;
    int healthy = 0;
    for (const auto& d : devices_) healthy += d.health() == "Healthy" ? 1 : 0;
    max_healthy_ = std::max(max_healthy_, healthy);
    cv_.SignalAll();
  }
  reader->Finish();
}

void KubeletSim::HoldRegisterAnswers(bool hold) {
  absl::MutexLock lock(&mu_);
  hold_register_ = hold;
  cv_.SignalAll();
}

void KubeletSim::WaitWhileRegisterAnswersHeld() {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::MutexLock lock(&mu_);
  // A CondVar loop, not Mutex::Await: ThreadSanitizer sees this thread read under the lock.
  while (hold_register_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
}

int KubeletSim::registrations() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(registrations_.size());
}

std::optional<KubeletSim::Registration> KubeletSim::WaitForRegistration(
    int count, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (static_cast<int>(registrations_.size()) <= count) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (static_cast<int>(registrations_.size()) <= count) return std::nullopt;
  return registrations_.back();
}

std::optional<KubeletSim::Registration> KubeletSim::WaitForRegistrationOf(
    const std::string& resource, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto latest = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<Registration> {
    for (auto it = registrations_.rbegin(); it != registrations_.rend(); ++it) {
      if (it->resource_name == resource) return *it;
    }
    return std::nullopt;
  };
  while (!latest()) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return latest();
}

std::optional<KubeletSim::Registration> KubeletSim::WaitForCurrentRegistration(
    absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto current = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !registrations_.empty() && registrations_.back().generation == generation_;
  };
  while (!current()) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (!current()) return std::nullopt;
  return registrations_.back();
}

std::optional<KubeletSim::Devices> KubeletSim::WaitForDevices(
    const std::function<bool(const Devices&)>& pred, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!(list_updates_ > 0 && pred(devices_))) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (list_updates_ > 0 && pred(devices_)) return devices_;
  return std::nullopt;
}

std::optional<KubeletSim::Devices> KubeletSim::WaitForDevicesOf(
    const std::string& resource, const std::function<bool(const Devices&)>& pred,
    absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = devices_of_.find(resource);
    return it != devices_of_.end() && pred(it->second);
  };
  while (!holds()) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (!holds()) return std::nullopt;
  return devices_of_.at(resource);
}

int KubeletSim::list_updates() const {
  absl::MutexLock lock(&mu_);
  return list_updates_;
}

int KubeletSim::max_healthy() const {
  absl::MutexLock lock(&mu_);
  return max_healthy_;
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> KubeletSim::PluginStub() const {
  std::string endpoint;
  {
    absl::MutexLock lock(&mu_);
    if (!registrations_.empty()) endpoint = registrations_.back().endpoint;
  }
  return v1beta1::DevicePlugin::NewStub(
      serving::UnixChannel((std::filesystem::path(dir_) / endpoint).string()));
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> KubeletSim::PluginStubOf(
    const std::string& resource) const {
  std::string endpoint;
  {
    absl::MutexLock lock(&mu_);
    for (const Registration& r : registrations_) {
      if (r.resource_name == resource) endpoint = r.endpoint;
    }
  }
  return v1beta1::DevicePlugin::NewStub(
      serving::UnixChannel((std::filesystem::path(dir_) / endpoint).string()));
}

v1beta1::PreferredAllocationRequest PreferredRequest(const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must_include,
                                                     int size) {
  v1beta1::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : available) c->add_available_deviceids(id);
  for (const auto& id : must_include) c->add_must_include_deviceids(id);
  c->set_allocation_size(size);
  return request;
}

}  // namespace rdp::sim
