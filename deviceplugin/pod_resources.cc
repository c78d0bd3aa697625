#include "deviceplugin/pod_resources.h"

#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/podresources.grpc.pb.h"
#include "serving/happens_before.h"

namespace rdp::deviceplugin {
namespace {

class GrpcPodResources : public PodResourcesSource {
 public:
  explicit GrpcPodResources(std::string socket_path) : path_(std::move(socket_path)) {}
  // The channel is left alive (one per client, so one per plugin process): destroying it right
  // after a call's callback returned races with gRPC 1.51's callback completion queue, whose
  // "nexting" thread may still hold that call's event; the queue's refcount then underflows and
  // the process aborts (grpc_cq_internal_unref: "prior > 0"). NodeMetricsTest
  // .PodResourcesErrorsAreCounted aborted about one run in 20 that way.
  ~GrpcPodResources() override {
    absl::MutexLock lock(&mu_);
    if (stub_) KeepForever(std::move(stub_));
  }

  // One call: what the callback needs, alive until it runs (and while Cancel holds it).
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
    Done done;
  };

  void List(absl::Duration timeout, Done done) override {
    // The call carries bytes, parsed in the callback: the response message is then created and
    // filled by the thread that reads it, never by gRPC's (a typed call would parse into a
    // message this thread constructed, an order ThreadSanitizer cannot see through libgrpc's
    // queues).
    auto owned_here = std::make_shared<Call>();
    Call* call = owned_here.get();
    call->done = std::move(done);
    bool own_buffer = false;
    if (grpc::Status s = grpc::SerializationTraits<v1::ListPodResourcesRequest>::Serialize(
            v1::ListPodResourcesRequest(), &call->request, &own_buffer);
        !s.ok()) {
      call->done(absl::InternalError(absl::StrCat("pod-resources List request: ",
                                                  s.error_message())));
      return;
    }
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    // Waits for a connection within the deadline: a socket that appeared a moment ago is
    // reached by this call rather than failed by the channel's last connect attempt.
    call->context.set_wait_for_ready(true);
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) calls_.emplace(call, std::move(owned_here));
    }
    if (owned_here) {  // cancelled: not started
      call->done(absl::CancelledError(
          absl::StrCat("pod-resources List on ", path_, ": the plugin is stopping")));
      return;
    }
    // The map holds the call until its callback takes it; Cancel holds it while cancelling.
    serving::HappensBefore(call);
    Stub()->UnaryCall(
        &call->context, ListMethod(), grpc::StubOptions(), &call->request, &call->response,
        [this, call](grpc::Status status) {
          serving::HappensAfter(call);
          std::shared_ptr<Call> owned;
          {
            absl::MutexLock lock(&mu_);
            auto it = calls_.find(call);
            owned = std::move(it->second);
            calls_.erase(it);
          }
          if (!status.ok()) {
            owned->done(absl::UnavailableError(
                absl::StrCat("pod-resources List on ", path_, ": ", status.error_message())));
            return;
          }
          v1::ListPodResourcesResponse response;
          if (grpc::Status s =
                  grpc::SerializationTraits<v1::ListPodResourcesResponse>::Deserialize(
                      &owned->response, &response);
              !s.ok()) {
            owned->done(absl::UnavailableError(absl::StrCat(
                "pod-resources List on ", path_, ": unreadable answer: ", s.error_message())));
            return;
          }
          owned->done(ToPodList(response));
        });
  }

  void Cancel() override {
    std::vector<std::shared_ptr<Call>> running;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      for (const auto& [raw, call] : calls_) running.push_back(call);
    }
    // Outside the lock: gRPC may run the call's callback on this thread.
    for (const auto& call : running) call->context.TryCancel();
  }

 private:
  // The method's path on the wire, from the generated service's name.
  static const std::string& ListMethod() {
    static const std::string* const method =
        new std::string(absl::StrCat("/", v1::PodResourcesLister::service_full_name(), "/List"));
    return *method;
  }

  // One channel for the life of the client (a channel must not be destroyed from its own
  // callbacks), dialled at the first List. While the socket is absent it retries connecting
  // every second at most, instead of gRPC's default backoff that grows to two minutes, so that
  // a socket that appears (or a kubelet that restarts) is reached at once.
  grpc::GenericStub* Stub() {
    absl::MutexLock lock(&mu_);
    if (!stub_) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // gRPC's default is 4 MiB; a node with hundreds of pods answers more.
      args.SetMaxReceiveMessageSize(kMaxListBytes);
      stub_ = std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
          "unix://" + path_, grpc::InsecureChannelCredentials(), args));
    }
    return stub_.get();
  }

  // Process-lifetime storage for retired channels (reachable, so not a leak to LeakSanitizer).
  static void KeepForever(std::unique_ptr<grpc::GenericStub> stub) {
    static absl::Mutex* const mu = new absl::Mutex;
    static auto* const kept = new std::vector<std::unique_ptr<grpc::GenericStub>>;
    absl::MutexLock lock(mu);
    kept->push_back(std::move(stub));
  }

  const std::string path_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::GenericStub> stub_ ABSL_GUARDED_BY(mu_);
  std::map<Call*, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);  // in flight
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

PodList ToPodList(const v1::ListPodResourcesResponse& response) {
  PodList out;
  for (const auto& pod : response.pod_resources()) {
    for (const auto& container : pod.containers()) {
      ContainerDevices c;
      c.key = absl::StrCat(pod.namespace_(), "/", pod.name(), "/", container.name());
      for (const auto& d : container.devices()) {
        auto& ids = c.devices[d.resource_name()];
        ids.insert(ids.end(), d.device_ids().begin(), d.device_ids().end());
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::unique_ptr<PodResourcesSource> NewGrpcPodResources(const std::string& socket_path) {
  return std::make_unique<GrpcPodResources>(socket_path);
}

std::vector<std::string> HeldIds(const PodList& pods, const std::string& resource) {
  std::vector<std::string> out;
  for (const ContainerDevices& c : pods) {
    auto it = c.devices.find(resource);
    if (it != c.devices.end()) out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

}  // namespace rdp::deviceplugin
