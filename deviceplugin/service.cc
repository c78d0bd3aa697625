#include "deviceplugin/service.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "grpcpp/alarm.h"
#include "serving/happens_before.h"
#include "base/log.h"

namespace rdp::deviceplugin {
namespace {

constexpr char kHealthy[] = "Healthy";
constexpr char kPreferRpc[] = "GetPreferredAllocation";
constexpr char kUnhealthy[] = "Unhealthy";

// Runs a handler body; turns an escaping exception into INTERNAL, logged once here.
template <typename F>
grpc::Status Guard(const char* rpc, F&& body) {
  try {
    return ToGrpc(body());
  } catch (const std::exception& e) {
    rdp::Logger("server")->error("{} failed: {}", rpc, e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat(rpc, ": ", e.what()));
  } catch (...) {
    rdp::Logger("server")->error("{} failed with an unknown exception", rpc);
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat(rpc, ": unknown error"));
  }
}

// The grant's variables and file mount under the names `naming` gives (config.h).
void AddNamed(const AllocationNaming& naming, const node::Grant& grant,
              v1beta1::ContainerAllocateResponse* out) {
  auto& envs = *out->mutable_envs();
  if (naming.common) envs.insert(grant.allocation.envs.begin(), grant.allocation.envs.end());
  if (!naming.suffix.empty()) {
    for (const auto& [key, value] : grant.allocation.envs) {
      envs[hca::OwnVariableName(key, naming.suffix)] = value;
    }
  }
  if (grant.file_mount.empty()) return;
  auto mount = [&grant, out](const std::string& container_path) {
    auto* m = out->add_mounts();
    m->set_container_path(container_path);
    m->set_host_path(grant.file_mount);
    m->set_read_only(true);
  };
  if (naming.common) mount(hca::kAllocationFile);
  if (!naming.suffix.empty()) mount(naming.own_file);
}

std::vector<std::string> Ids(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  return {ids.begin(), ids.end()};
}

// Views of the request's IDs, which outlive the call that reads them.
std::vector<std::string_view> Views(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  return {ids.begin(), ids.end()};
}

absl::Status PreferAll(const ResourceState& resource,
                       const v1beta1::PreferredAllocationRequest& request,
                       v1beta1::PreferredAllocationResponse* response) {
  if (request.container_requests().empty()) {
    return absl::InvalidArgumentError("empty request: no container_requests");
  }
  response->Clear();
  for (const auto& c : request.container_requests()) {
    absl::StatusOr<std::vector<std::string>> ids =
        resource.Prefer(Views(c.available_deviceids()), Views(c.must_include_deviceids()),
                    c.allocation_size());
    if (!ids.ok()) return ids.status();
    auto* out = response->add_container_responses();
    for (std::string& id : *ids) out->add_deviceids(std::move(id));
  }
  return absl::OkStatus();
}

// A reactor that finishes once with Done(status) and is deleted when gRPC is done with the call:
// unary calls, and a ListAndWatch refused at once (the service is stopping, or too many
// streams). gRPC reads the response (Finish) and destroys it (after OnDone) on whichever of its
// threads completes the call; what the handler wrote before Finish, possibly on another thread
// (a GetPreferredAllocation that waited for the pod list), comes before that, and OnDone states
// it to TSan (happens_before.h). gRPC's DefaultReactor would leave that edge unstated.
template <typename Reactor>
class FinishOnce final : public Reactor {
 public:
  void Done(const grpc::Status& status) {
    serving::HappensBefore(this);
    this->Finish(status);
  }
  // Done, after recording the call's latency (from this reactor's creation) and status.
  void Done(const grpc::Status& status, PluginMetrics& metrics, Rpc rpc) {
    metrics.ObserveRpc(rpc, absl::Now() - start_, static_cast<int>(status.error_code()));
    Done(status);
  }
  void OnDone() override {
    serving::HappensAfter(this);
    delete this;
  }

 private:
  const absl::Time start_ = absl::Now();
};
using UnaryReactor = FinishOnce<grpc::ServerUnaryReactor>;
using Stream = grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>;

Stream* RefusedStream(const grpc::Status& status) {
  auto* reactor = new FinishOnce<Stream>;
  reactor->Done(status);
  return reactor;
}

}  // namespace

// One ListAndWatch stream: writes the device list when it is newer than the last one written,
// one write at a time, on whichever thread saw the change. It keeps itself alive (self_) until
// gRPC is done with it; the service holds it weakly.
class DeviceStream final : public grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse> {
 public:
  explicit DeviceStream(const ResourceState* resource) : resource_(resource) {}

  void Begin(std::shared_ptr<DeviceStream> self) {
    self_ = std::move(self);
    serving::HappensBefore(this);  // gRPC may run a reaction before Changed() starts an operation
    Changed();
  }

  void Changed() ABSL_LOCKS_EXCLUDED(mu_) {
    // The list is read before the stream's lock is taken, so that no lock of the node or the
    // resource is ever taken under it; versions only grow, so a list that is not newer than the
    // one sent is dropped (a newer one was, or OnWriteDone reads it again).
    ResourceState::DeviceList list = resource_->Devices();
    {
      absl::MutexLock lock(&mu_);
      if (finishing_ || writing_ || list.version <= sent_) return;
      response_.Clear();
      ToProto(list.devices, &response_);
      sent_ = list.version;
      writing_ = true;
    }
    serving::HappensBefore(this);
    StartWrite(&response_);
  }

  // Finishes the stream once, after the write in flight if there is one.
  void End(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      finishing_ = true;
      end_status_ = status;
      if (writing_) return;  // OnWriteDone finishes
      finished_ = true;
    }
    serving::HappensBefore(this);
    Finish(status);
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    serving::HappensAfter(this);
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !finishing_) {  // the client went away
        finishing_ = true;
        end_status_ = grpc::Status::OK;
      }
      if (finishing_ && !finished_) {
        finish = finished_ = true;
        status = end_status_;
      }
    }
    if (finish) {
      serving::HappensBefore(this);
      Finish(status);
      return;
    }
    Changed();
  }

  void OnCancel() override {
    serving::HappensAfter(this);
    End(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    serving::HappensAfter(this);
    self_.reset();  // last: may delete this
  }

 private:
  const ResourceState* const resource_;
  std::shared_ptr<DeviceStream> self_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  std::uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  // Filled under mu_ while no write is in flight; then read by the write in flight (writing_),
  // which gRPC runs outside any lock of ours.
  v1beta1::ListAndWatchResponse response_;
};

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

void ToProto(const std::vector<DeviceState>& devices, v1beta1::ListAndWatchResponse* out) {
  for (const DeviceState& d : devices) {
    v1beta1::Device* device = out->add_devices();
    device->set_id(d.id);
    device->set_health(d.healthy ? kHealthy : kUnhealthy);
    if (d.numa) device->mutable_topology()->add_nodes()->set_id(*d.numa);
  }
}

void FillOptions(v1beta1::DevicePluginOptions* options) {
  options->set_pre_start_required(false);
  options->set_get_preferred_allocation_available(true);
}

grpc::Status HandleAllocate(const ResourceState& resource, const v1beta1::AllocateRequest& request,
                            v1beta1::AllocateResponse* response) {
  return Guard("Allocate", [&]() -> absl::Status {
    if (request.container_requests().empty()) {
      return absl::InvalidArgumentError("empty request: no container_requests");
    }
    for (const auto& c : request.container_requests()) {
      absl::StatusOr<node::Grant> grant = resource.Allocate(Ids(c.devices_ids()));
      if (!grant.ok()) return grant.status();
      hca::ContainerAllocation& a = grant->allocation;
      auto* out = response->add_container_responses();
      out->mutable_devices()->Reserve(static_cast<int>(a.devices.size()));
      for (auto& spec : a.devices) {
        auto* d = out->add_devices();
        d->set_container_path(std::move(spec.container_path));
        d->set_host_path(std::move(spec.host_path));
        d->set_permissions(std::move(spec.permissions));
      }
      AddNamed(resource.naming(), *grant, out);
    }
    return absl::OkStatus();
  });
}

namespace {

// Runs `answer` once a pod-resources List that started after this call has ended, or after
// `at_most` with the state as it is (a grpc::Alarm), whichever comes first; exactly once, with
// true when that List ended first and succeeded.
void AfterAFreshPodList(NodeState& node, absl::Duration at_most,
                        std::function<void(bool fresh)> answer) {
  struct Pending {
    std::atomic<bool> answered{false};
    std::function<void(bool)> answer;
    // Made only when the list is not answered at once: making and destroying a grpc::Alarm
    // costs microseconds on every Allocate. Destroyed (cancelled) with the last holder.
    std::optional<grpc::Alarm> alarm;
    void Answer(bool fresh) {
      if (!answered.exchange(true)) answer(fresh);
    }
  };
  auto pending = std::make_shared<Pending>();
  pending->answer = std::move(answer);
  node.RefreshPods([pending, &node] { pending->Answer(node.last_list_ok()); });
  // Answered already (no pod-resources source): no alarm. Setting one and cancelling it costs a
  // trip through gRPC's timer thread on every call.
  if (pending->answered) return;
  std::weak_ptr<Pending> weak = pending;
  pending->alarm.emplace();
  pending->alarm->Set(absl::ToChronoTime(absl::Now() + at_most), [weak](bool fired) {
    if (!fired) return;
    if (std::shared_ptr<Pending> p = weak.lock()) p->Answer(false);
  });
}

}  // namespace

void HandlePreferredAllocation(ResourceState& resource,
                               const v1beta1::PreferredAllocationRequest& request,
                               v1beta1::PreferredAllocationResponse* response,
                               std::function<void(grpc::Status)> done) {
  auto answer = [&resource, &request, response, done = std::move(done)](bool fresh) {
    const grpc::Status s =
        Guard(kPreferRpc, [&] { return PreferAll(resource, request, response); });
    // The container's Allocate, next, may decide on the same List (ResourceState::KeepPreferred).
    std::optional<std::vector<std::string>> kept;
    if (fresh && s.ok() && response->container_responses_size() == 1 &&
        response->container_responses(0).deviceids_size() > 0) {
      const auto& ids = response->container_responses(0).deviceids();
      kept.emplace(ids.begin(), ids.end());
    }
    resource.KeepPreferred(std::move(kept));
    done(s);
  };
  if (resource.mode() == hca::Mode::kShared || request.container_requests().empty()) {
    answer(false);
    return;
  }
  // Exclusive: the GPU context comes from a pod list at least as new as this call. One refresh
  // serves every container of the request; `answer` runs once it is over, or after
  // config().admission_wait with the last list (the call is advice; a slow kubelet must not
  // hold admission for the List's whole deadline), whichever comes first.
  NodeState& node = resource.node();
  AfterAFreshPodList(node, node.config().admission_wait, std::move(answer));
}

namespace {

// One call's messages on one arena (DevicePluginService::OnArena).
template <typename Request, typename Response>
class ArenaHolder final : public grpc::MessageHolder<Request, Response> {
 public:
  ArenaHolder() {
    this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
    this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
  }
  void Release() override { delete this; }

 private:
  google::protobuf::Arena arena_;
};

}  // namespace

template <typename Request, typename Response>
grpc::MessageHolder<Request, Response>*
DevicePluginService::OnArena<Request, Response>::AllocateMessages() {
  return new ArenaHolder<Request, Response>;
}

DevicePluginService::DevicePluginService(ResourceState* resource)
    : resource_(resource), node_(resource->node()) {
  SetMessageAllocatorFor_GetPreferredAllocation(&prefer_messages_);
  SetMessageAllocatorFor_Allocate(&allocate_messages_);
  listener_ = node_.AddListener([this] { Changed(); });
}

DevicePluginService::~DevicePluginService() {
  node_.RemoveListener(listener_);
  Stop();
}

void DevicePluginService::Changed() {
  std::vector<std::shared_ptr<DeviceStream>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : streams_) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
  }
  for (const auto& s : live) s->Changed();
}

void DevicePluginService::Stop() {
  std::vector<std::shared_ptr<DeviceStream>> live;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (const auto& weak : streams_) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
    streams_.clear();
  }
  for (const auto& s : live) s->End(grpc::Status::OK);
}

int DevicePluginService::streams() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& weak : streams_) n += weak.expired() ? 0 : 1;
  return n;
}

grpc::ServerUnaryReactor* DevicePluginService::GetDevicePluginOptions(
    grpc::CallbackServerContext*, const v1beta1::Empty*,
    v1beta1::DevicePluginOptions* response) {
  auto* reactor = new UnaryReactor;
  FillOptions(response);
  reactor->Done(grpc::Status::OK, resource_->metrics(), Rpc::kGetDevicePluginOptions);
  return reactor;
}

grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* DevicePluginService::ListAndWatch(
    grpc::CallbackServerContext*, const v1beta1::Empty*) {
  std::shared_ptr<DeviceStream> stream;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return RefusedStream(grpc::Status::OK);
    streams_.erase(std::remove_if(streams_.begin(), streams_.end(),
                                  [](const auto& weak) { return weak.expired(); }),
                   streams_.end());
    if (streams_.size() >= static_cast<std::size_t>(kMaxStreams)) {
      rdp::Logger("server")->warn("ListAndWatch refused: {} streams are open already",
                                  streams_.size());
      return RefusedStream(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("ListAndWatch: ", kMaxStreams, " streams are open already")));
    }
    stream = std::make_shared<DeviceStream>(resource_);
    streams_.push_back(stream);
  }
  DeviceStream* raw = stream.get();
  raw->Begin(std::move(stream));
  return raw;
}

grpc::ServerUnaryReactor* DevicePluginService::GetPreferredAllocation(
    grpc::CallbackServerContext*, const v1beta1::PreferredAllocationRequest* request,
    v1beta1::PreferredAllocationResponse* response) {
  auto* reactor = new UnaryReactor;
  HandlePreferredAllocation(*resource_, *request, response,
                            [reactor, resource = resource_](grpc::Status s) {
                              reactor->Done(s, resource->metrics(), Rpc::kGetPreferredAllocation);
                            });
  return reactor;
}

grpc::ServerUnaryReactor* DevicePluginService::Allocate(grpc::CallbackServerContext*,
                                                        const v1beta1::AllocateRequest* request,
                                                        v1beta1::AllocateResponse* response) {
  auto* reactor = new UnaryReactor;
  // Withholding is checked against a pod list at least as new as the call: a container the other
  // mode's plugin admitted a moment ago (its Allocate was in flight when we registered) is in no
  // older list. An exclusive Allocate of the IDs that the GetPreferredAllocation just before it
  // answered from a List begun after that call decides on that List: it is the same admission,
  // and the kubelet admits nothing in between (ResourceState::KeepPreferred); one List per
  // admission keeps the next admission's List within the kubelet's rate limit. Any other
  // Allocate (the kubelet skips GetPreferredAllocation when the aligned set equals the request;
  // shared mode) reads a List of its own, shared with concurrent callers, waiting for it at most
  // admission_wait, then decides with the state as it is (fail closed while no List has ever
  // answered; the last list after): a pod-resources server that never answers must not hold the
  // kubelet's admission for the List's whole deadline.
  auto answer = [reactor, resource = resource_, request, response](bool) {
    reactor->Done(HandleAllocate(*resource, *request, response), resource->metrics(),
                  Rpc::kAllocate);
  };
  std::vector<std::string> ids;
  if (request->container_requests_size() == 1) {
    const auto& c = request->container_requests(0).devices_ids();
    ids.assign(c.begin(), c.end());
  }
  if (resource_->TakePreferred(std::move(ids)) && resource_->mode() == hca::Mode::kExclusive) {
    answer(true);
  } else {
    AfterAFreshPodList(node_, node_.config().admission_wait, std::move(answer));
  }
  return reactor;
}

grpc::ServerUnaryReactor* DevicePluginService::PreStartContainer(
    grpc::CallbackServerContext*, const v1beta1::PreStartContainerRequest*,
    v1beta1::PreStartContainerResponse*) {
  auto* reactor = new UnaryReactor;
  reactor->Done(grpc::Status::OK, resource_->metrics(), Rpc::kPreStartContainer);
  return reactor;
}

}  // namespace rdp::deviceplugin
