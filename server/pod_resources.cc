#include "server/pod_resources.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/podresources.grpc.pb.h"
#include "topology/sysfs_util.h"

namespace rdp::server {
namespace {

class GrpcPodResources : public PodResourcesSource {
 public:
  explicit GrpcPodResources(std::string socket_path) : path_(std::move(socket_path)) {}

  absl::StatusOr<PodList> List(absl::Duration timeout) override {
    v1::PodResourcesLister::Stub* stub = Stub();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    v1::ListPodResourcesRequest request;
    v1::ListPodResourcesResponse response;
    grpc::Status status = stub->List(&context, request, &response);
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("pod-resources List on ", path_, ": ", status.error_message()));
    }
    return ToPodList(response);
  }

 private:
  v1::PodResourcesLister::Stub* Stub() {
    absl::MutexLock lock(&mu_);
    if (!stub_) {
      stub_ = v1::PodResourcesLister::NewStub(
          grpc::CreateChannel("unix://" + path_, grpc::InsecureChannelCredentials()));
    }
    return stub_.get();
  }

  const std::string path_;
  absl::Mutex mu_;
  std::unique_ptr<v1::PodResourcesLister::Stub> stub_ ABSL_GUARDED_BY(mu_);
};

const std::vector<std::string>* Find(const ContainerDevices& c, const std::string& resource) {
  auto it = c.devices.find(resource);
  return it == c.devices.end() ? nullptr : &it->second;
}

bool HoldsGpus(const ContainerDevices& c, const std::vector<std::string>& gpu_resources) {
  for (const std::string& r : gpu_resources) {
    const auto* ids = Find(c, r);
    if (ids != nullptr && !ids->empty()) return true;
  }
  return false;
}

std::vector<std::string> GpuPcis(const ContainerDevices& c, const Config& config,
                                 const std::map<std::string, std::string>& gpu_ids) {
  std::vector<std::string> out;
  for (const std::string& r : config.gpu_resources) {
    const auto* ids = Find(c, r);
    if (ids == nullptr) continue;
    for (const std::string& id : *ids) {
      if (auto it = gpu_ids.find(id); it != gpu_ids.end()) {
        out.push_back(it->second);
      } else if (auto pci = topology::NormalizePci(id)) {
        out.push_back(*pci);
      }
    }
  }
  return out;
}

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

Withholding ComputeWithheld(const PodList& pods, const std::string& resource, Mode mode,
                            const topology::Topology& topology) {
  Withholding out;
  for (const ContainerDevices& c : pods) {
    const auto* ids = Find(c, resource);
    if (ids == nullptr) continue;
    std::vector<std::string> foreign;
    for (const std::string& id : *ids) {
      const bool is_pci = topology::NormalizePci(id).has_value();
      if (mode == Mode::kExclusive && !is_pci) foreign.push_back(id);
      if (mode == Mode::kShared && is_pci) foreign.push_back(*topology::NormalizePci(id));
    }
    if (foreign.empty()) continue;
    if (mode == Mode::kExclusive) {
      for (const auto& hca : topology.hcas()) out.pcis.insert(hca.place.pci);
      out.reasons.push_back(absl::StrCat(
          "container ", c.key, " holds shared-mode IDs (", absl::StrJoin(foreign, ","),
          ") and sees every HCA; withholding all HCAs until it is gone"));
    } else {
      out.pcis.insert(foreign.begin(), foreign.end());
      out.reasons.push_back(absl::StrCat("container ", c.key,
                                         " holds HCAs from exclusive mode (",
                                         absl::StrJoin(foreign, ","),
                                         "); withholding them from shared pods until it is gone"));
    }
  }
  return out;
}

std::map<std::string, std::string> ReadNvidiaGpuIds(const std::string& proc_root) {
  std::map<std::string, std::string> out;
  const std::filesystem::path dir =
      std::filesystem::path(proc_root.empty() ? "/" : proc_root) / "proc/driver/nvidia/gpus";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    auto pci = topology::NormalizePci(entry.path().filename().string());
    if (!pci) continue;
    // Bounded, and never blocking on something that is not a regular file.
    const auto info = topology::ReadHead(entry.path() / "information", 64 * 1024);
    if (!info) continue;
    for (absl::string_view line : absl::StrSplit(*info, '\n')) {
      if (absl::ConsumePrefix(&line, "GPU UUID:")) {
        out[std::string(absl::StripAsciiWhitespace(line))] = *pci;
        break;
      }
    }
  }
  return out;
}

void UpdateFirstSeen(const PodList& pods, const std::vector<std::string>& gpu_resources,
                     absl::Time now, std::map<std::string, absl::Time>* first_seen) {
  std::map<std::string, absl::Time> next;
  for (const ContainerDevices& c : pods) {
    if (!HoldsGpus(c, gpu_resources)) continue;
    auto it = first_seen->find(c.key);
    next[c.key] = it == first_seen->end() ? now : it->second;
  }
  first_seen->swap(next);
}

GpuSelection GpuContextFor(const PodList& pods,
                           const std::map<std::string, absl::Time>& first_seen, absl::Time now,
                           const Config& config, const std::map<std::string, std::string>& gpu_ids,
                           const topology::Topology& topology) {
  GpuSelection out;
  std::set<std::string> held;
  const ContainerDevices* chosen = nullptr;
  for (const ContainerDevices& c : pods) {
    for (const std::string& pci : GpuPcis(c, config, gpu_ids)) held.insert(pci);
    if (!HoldsGpus(c, config.gpu_resources)) continue;
    const auto* ours = Find(c, config.resource_name);
    if (ours != nullptr && !ours->empty()) continue;
    auto seen = first_seen.find(c.key);
    if (seen == first_seen.end() || now - seen->second > config.admission_window) continue;
    ++out.candidates;
    chosen = &c;
  }
  if (out.candidates == 1) {
    out.container = chosen->key;
    out.context.container_gpus = GpuPcis(*chosen, config, gpu_ids);
    std::sort(out.context.container_gpus.begin(), out.context.container_gpus.end());
  }
  for (const auto& gpu : topology.gpus()) {
    if (held.count(gpu.place.pci) == 0) out.context.free_gpus.push_back(gpu.place.pci);
  }
  out.context.free_gpus_known = true;
  return out;
}

}  // namespace rdp::server
