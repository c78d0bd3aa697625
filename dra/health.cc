#include "dra/health.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <type_traits>

#include "base/log.h"
#include "dra/devices.h"
#include "hca/hca.h"

namespace rdp::dra {
namespace {

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("dra"); }

// How often a stream that waits looks whether the kubelet has gone (the synchronous API tells a
// handler of a cancellation only when asked).
constexpr absl::Duration kCancelCheck = absl::Milliseconds(200);
// DeviceHealth.message: "at most 1024 characters".
constexpr std::size_t kMaxMessage = 1024;

template <typename Response>
void Fill(const std::vector<DeviceHealth>& devices, std::int64_t timeout_seconds, Response& out) {
  using Health = std::remove_reference_t<decltype(*out.add_devices())>;
  const std::int64_t now = absl::ToUnixSeconds(absl::Now());
  for (const DeviceHealth& d : devices) {
    Health* h = out.add_devices();
    h->mutable_device()->set_pool_name(d.pool);
    h->mutable_device()->set_device_name(d.device);
    // Both versions number HealthStatus alike; v1's values name them.
    using Status = std::remove_cv_t<decltype(h->health())>;
    switch (d.state) {
      case DeviceHealth::State::kHealthy:
        h->set_health(static_cast<Status>(healthpb::HEALTHY));
        break;
      case DeviceHealth::State::kUnhealthy:
        h->set_health(static_cast<Status>(healthpb::UNHEALTHY));
        break;
      case DeviceHealth::State::kUnknown:
        h->set_health(static_cast<Status>(healthpb::UNKNOWN));
        break;
    }
    h->set_last_updated_time(now);
    h->set_health_check_timeout_seconds(timeout_seconds);
    h->set_message(d.message.substr(0, kMaxMessage));
  }
}

}  // namespace

std::vector<DeviceHealth> DeviceHealthOf(const node::View& node, const std::string& pool) {
  std::vector<DeviceHealth> out;
  out.reserve(node.topology->hcas().size());
  for (const topology::Hca& hca : node.topology->hcas()) {
    const hca::Verdict v = node.Verdict(hca);
    out.push_back({pool, DeviceName(hca),
                   v.usable ? DeviceHealth::State::kHealthy : DeviceHealth::State::kUnhealthy,
                   v.usable ? "" : hca.name + ": " + v.reason});
  }
  return out;
}

HealthFeed::HealthFeed(HealthFeedConfig config) : config_(config) {}

void HealthFeed::Publish(std::vector<DeviceHealth> devices) {
  absl::MutexLock lock(&mu_);
  if (devices == devices_ && generation_ != 0) return;
  devices_ = std::move(devices);
  ++generation_;
  changed_.SignalAll();
}

void HealthFeed::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  changed_.SignalAll();
}

HealthFeed::Snapshot HealthFeed::Current() const {
  absl::MutexLock lock(&mu_);
  return {generation_, devices_, stopped_};
}

HealthFeed::Snapshot HealthFeed::WaitChange(std::uint64_t seen, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  // A CondVar and a loop, not Mutex::Await: the condition is then evaluated by this thread
  // under the lock, which ThreadSanitizer sees (Debian's abseil is not instrumented).
  while (!stopped_ && generation_ == seen) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return {generation_, devices_, stopped_};
}

template <typename Service>
grpc::Status HealthService<Service>::NodeWatchResources(
    grpc::ServerContext* context, const typename Service::Request*,
    grpc::ServerWriter<typename Service::Response>* writer) {
  try {
    const HealthFeedConfig& config = feed_->config();
    const std::int64_t timeout_seconds = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::ceil(absl::ToDoubleSeconds(config.timeout))));
    HealthFeed::Snapshot snap = feed_->Current();
    while (!snap.stopped && !context->IsCancelled()) {
      typename Service::Response response;
      Fill(snap.devices, timeout_seconds, response);
      if (!writer->Write(response)) return grpc::Status::OK;  // the kubelet has gone
      const std::uint64_t sent = snap.generation;
      const absl::Time heartbeat = absl::Now() + config.heartbeat;
      for (;;) {
        snap = feed_->WaitChange(sent, std::min(heartbeat, absl::Now() + kCancelCheck));
        if (snap.stopped || context->IsCancelled() || snap.generation != sent ||
            absl::Now() >= heartbeat) {
          break;
        }
      }
    }
    return grpc::Status::OK;
  } catch (const std::exception& e) {
    Log()->error("NodeWatchResources failed: {}", e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

template class HealthService<HealthServiceV1>;
template class HealthService<HealthServiceV1alpha1>;

}  // namespace rdp::dra
