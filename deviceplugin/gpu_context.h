#pragma once

// The allocator's GPU context from the kubelet's pod list: which GPUs the container being
// admitted holds, and which GPUs no container holds. Pure.

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "allocator/allocator.h"
#include "deviceplugin/config.h"
#include "deviceplugin/pod_resources.h"
#include "topology/topology.h"

namespace rdp::deviceplugin {

// The container being admitted for `resource` is the one that holds GPU devices of
// config.gpu_resources, none of `resource`, and was first seen holding them within
// config.admission_window of `now`; with exactly one such container its GPUs are the context
// (the kubelet sends no pod identity in GetPreferredAllocation). Free GPUs: the snapshot's GPUs
// minus those any container holds. GPU IDs map to PCI addresses through `gpu_ids`
// (ReadNvidiaGpuIds: UUIDs, indexes, MIG UUIDs; each ID looked up as CanonicalGpuId gives it) or
// are PCI addresses themselves; others are ignored.
struct GpuSelection {
  allocator::GpuContext context;
  std::string container;  // the container chosen, "" when none
  int candidates = 0;
};
GpuSelection GpuContextFor(const PodList& pods,
                           const std::map<std::string, absl::Time>& first_seen, absl::Time now,
                           const Config& config, const std::string& resource,
                           const std::map<std::string, std::string>& gpu_ids,
                           const topology::Topology& topology);

// Records when each container was first seen holding GPUs of gpu_resources; forgets containers
// that are gone.
void UpdateFirstSeen(const PodList& pods, const std::vector<std::string>& gpu_resources,
                     absl::Time now, std::map<std::string, absl::Time>* first_seen);

}  // namespace rdp::deviceplugin
