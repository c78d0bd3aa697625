#include "nri/service.h"

#include <exception>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "nri/memlock.h"
#include "proto/nri.pb.h"

namespace rdp::nri {
namespace {

namespace api = ::nri::pkg::api::v1alpha1;

constexpr int kUnimplemented = 12;
constexpr char kMemlock[] = "RLIMIT_MEMLOCK";

ContainerView View(const api::PodSandbox& pod, const api::Container& c) {
  ContainerView v;
  v.id = c.id();
  v.name = c.name();
  v.pod = pod.name();
  v.pod_namespace = pod.namespace_();
  for (const api::LinuxDevice& d : c.linux().devices()) v.device_paths.push_back(d.path());
  for (const api::POSIXRlimit& r : c.rlimits()) {
    if (r.type() == kMemlock) v.memlock = Rlimit{r.soft(), r.hard()};
  }
  return v;
}

std::string Describe(const ContainerView& v) {
  return absl::StrCat(v.pod_namespace, "/", v.pod, "/", v.name, " (id ", v.id.substr(0, 12), ")");
}

std::string Describe(const std::optional<Rlimit>& r) {
  if (!r) return "the runtime's default";
  return absl::StrCat(FormatMemlock(r->soft), "/", FormatMemlock(r->hard));
}

}  // namespace

void NriMetrics::Write(metrics::Exposition& out) const {
  metrics::WriteCounter(out, "nri_memlock_adjustments_total",
                        "Containers holding an HCA whose RLIMIT_MEMLOCK the NRI plugin raised.",
                        adjustments);
  metrics::WriteCounter(out, "nri_errors_total",
                        "CreateContainer calls the NRI plugin answered without an adjustment "
                        "because it could not read the request.",
                        errors);
  metrics::WriteCounter(out, "nri_registrations_total",
                        "Registrations of the NRI plugin that the container runtime accepted.",
                        registrations);
  out.Family(metrics::Name("nri_connected"),
             "1 while the NRI plugin is registered and synchronized with the container runtime.",
             metrics::Exposition::Type::kGauge);
  out.Sample({}, connected.load(std::memory_order_relaxed) ? 1 : 0);
}

CallResult PluginService::Handle(std::string_view service, std::string_view method,
                                 const std::string& payload) {
  if (service == kPluginService) {
    try {
      if (method == "Configure") return Configure(payload);
      if (method == "Synchronize") return Synchronize(payload);
      if (method == "CreateContainer") return CreateContainer(payload);
      if (method == "Shutdown") {
        Logger("nri")->info("the runtime is shutting down");
        return {0, "", api::Empty().SerializeAsString()};
      }
    } catch (const std::exception& e) {
      // Only allocation can throw here; a CreateContainer is still answered OK below.
      Logger("nri")->error("{}: {}", method, e.what());
      if (method == "CreateContainer") {
        metrics_.errors.Add();
        return {0, "", api::CreateContainerResponse().SerializeAsString()};
      }
      return {13, e.what(), ""};
    }
  }
  return {kUnimplemented,
          absl::StrCat("/", std::string(service), "/", std::string(method), " is not served"), ""};
}

CallResult PluginService::Configure(const std::string& payload) {
  api::ConfigureRequest req;
  if (!req.ParseFromString(payload)) {
    // What it says is only informative: subscribe all the same.
    Logger("nri")->warn("Configure: the request does not parse; subscribing to CreateContainer");
  } else {
    Logger("nri")->info(
        "configured by {} {} (NRI {}): request timeout {} ms; raising RLIMIT_MEMLOCK to {} for "
        "containers with /dev/infiniband/uverbs*",
        req.runtime_name(), req.runtime_version(),
        req.nri_version().empty() ? "unknown" : req.nri_version(), req.request_timeout(),
        FormatMemlock(memlock_));
  }
  api::ConfigureResponse resp;
  resp.set_events(1 << (api::CREATE_CONTAINER - 1));
  return {0, "", resp.SerializeAsString()};
}

CallResult PluginService::Synchronize(const std::string& payload) {
  api::SynchronizeRequest req;
  api::SynchronizeResponse resp;
  if (!req.ParseFromString(payload)) {
    // Nothing in it is needed: the existing containers' limits were set when they were created.
    Logger("nri")->warn("Synchronize: the request does not parse; answering it all the same");
    synchronized_ = true;
    return {0, "", resp.SerializeAsString()};
  }
  std::map<std::string, const api::PodSandbox*> pods;
  for (const api::PodSandbox& p : req.pods()) pods[p.id()] = &p;
  for (const api::Container& c : req.containers()) {
    const auto pod = pods.find(c.pod_sandbox_id());
    const ContainerView v = View(pod == pods.end() ? api::PodSandbox() : *pod->second, c);
    ++sync_containers_;
    if (!DecideMemlock(v, memlock_).verbs_devices.empty()) ++sync_holders_;
  }
  // The runtime drops a plugin whose `more` differs from its request's.
  resp.set_more(req.more());
  if (!req.more()) {
    synchronized_ = true;
    Logger("nri")->info(
        "synchronized: {} existing containers, {} with an HCA (their RLIMIT_MEMLOCK stays what "
        "they were created with)",
        sync_containers_, sync_holders_);
    sync_containers_ = sync_holders_ = 0;
  }
  return {0, "", resp.SerializeAsString()};
}

CallResult PluginService::CreateContainer(const std::string& payload) {
  api::CreateContainerResponse resp;
  api::CreateContainerRequest req;
  if (!req.ParseFromString(payload)) {
    metrics_.errors.Add();
    Logger("nri")->error(
        "CreateContainer: the request does not parse; the container is created unadjusted");
    return {0, "", resp.SerializeAsString()};
  }
  const ContainerView v = View(req.pod(), req.container());
  const MemlockDecision d = DecideMemlock(v, memlock_);
  if (d.verbs_devices.empty()) return {0, "", resp.SerializeAsString()};
  if (!d.set) {
    Logger("nri")->info("container {} holds {}: RLIMIT_MEMLOCK {} is already at least {}; left alone",
                        Describe(v), absl::StrJoin(d.verbs_devices, ","), Describe(v.memlock),
                        FormatMemlock(memlock_));
    return {0, "", resp.SerializeAsString()};
  }
  api::POSIXRlimit* r = resp.mutable_adjust()->add_rlimits();
  r->set_type(kMemlock);
  r->set_soft(d.set->soft);
  r->set_hard(d.set->hard);
  metrics_.adjustments.Add();
  Logger("nri")->info("raised RLIMIT_MEMLOCK of container {} to {} (was {}): it holds {}",
                      Describe(v), Describe(d.set), Describe(v.memlock),
                      absl::StrJoin(d.verbs_devices, ","));
  return {0, "", resp.SerializeAsString()};
}

}  // namespace rdp::nri
