#pragma once

// The kubelet's pod-resources API as this plugin uses it: who holds which devices. The client is
// a seam (PodResourcesSource); what we conclude from a list is pure (ComputeWithheld,
// GpuContextFor) so that tests need no kubelet.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/allocator.h"
#include "server/config.h"
#include "topology/topology.h"

namespace v1 {
class ListPodResourcesResponse;
}  // namespace v1

namespace rdp::server {

// One running container and its device-plugin devices.
struct ContainerDevices {
  std::string key;  // "<namespace>/<pod>/<container>"
  std::map<std::string, std::vector<std::string>> devices;  // resource name -> device IDs
};
using PodList = std::vector<ContainerDevices>;

class PodResourcesSource {
 public:
  virtual ~PodResourcesSource() = default;
  // One List call that gives up after `timeout`. Thread-safe.
  virtual absl::StatusOr<PodList> List(absl::Duration timeout) = 0;
};

// The containers of a List answer, keyed "<namespace>/<pod>/<container>"; a resource named in
// several entries of one container has its IDs merged.
PodList ToPodList(const v1::ListPodResourcesResponse& response);

// A gRPC client of v1.PodResourcesLister on a unix socket. The channel is created lazily.
std::unique_ptr<PodResourcesSource> NewGrpcPodResources(const std::string& socket_path);

// HCAs (PCI addresses) that containers hold under the other mode's IDs, with one reason line per
// container: in exclusive mode a container holding shared IDs of `resource` sees every HCA, so
// all are withheld; in shared mode a container holding PCI-address IDs withholds those HCAs.
struct Withholding {
  std::set<std::string> pcis;
  std::vector<std::string> reasons;
};
Withholding ComputeWithheld(const PodList& pods, const std::string& resource, Mode mode,
                            const topology::Topology& topology);

// GPU UUID -> PCI address from <proc_root>/proc/driver/nvidia/gpus/<pci>/information
// ("GPU UUID: GPU-..."). Empty when the directory is absent.
std::map<std::string, std::string> ReadNvidiaGpuIds(const std::string& proc_root);

// The allocator's GPU context (allocator issue §3). The container being admitted is the one that
// holds GPU devices of `gpu_resources`, none of `resource`, and was first seen holding them
// within `window` of `now`; with exactly one such container its GPUs are the context. Free GPUs:
// the snapshot's GPUs minus those any container holds. GPU IDs map to PCI addresses through
// `gpu_ids` or are PCI addresses themselves; others are ignored.
struct GpuSelection {
  allocator::GpuContext context;
  std::string container;  // the container chosen, "" when none
  int candidates = 0;
};
GpuSelection GpuContextFor(const PodList& pods,
                           const std::map<std::string, absl::Time>& first_seen, absl::Time now,
                           const Config& config, const std::map<std::string, std::string>& gpu_ids,
                           const topology::Topology& topology);

// Records when each container was first seen holding GPUs of gpu_resources; forgets containers
// that are gone.
void UpdateFirstSeen(const PodList& pods, const std::vector<std::string>& gpu_resources,
                     absl::Time now, std::map<std::string, absl::Time>* first_seen);

}  // namespace rdp::server
