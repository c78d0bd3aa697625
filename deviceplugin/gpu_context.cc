#include "deviceplugin/gpu_context.h"

#include <algorithm>
#include <set>

#include "deviceplugin/nvidia_gpus.h"

namespace rdp::deviceplugin {
namespace {

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

// The node's GPUs a container holds, by PCI address: a GPU plugin's ID is one gpu_ids maps (in
// any form CanonicalGpuId reduces: a UUID, an index, a replica, a MIG device) or a PCI address,
// in any spelling the snapshot resolves; one without its domain names a GPU only when a single
// GPU has that bus:dev.fn (on Grace each root complex is a domain: 01:00.0 is in each).
std::vector<std::string> GpuPcis(const ContainerDevices& c, const Config& config,
                                 const std::map<std::string, std::string>& gpu_ids,
                                 const topology::Topology& topology) {
  std::vector<std::string> out;
  for (const std::string& r : config.gpu_resources) {
    const auto* ids = Find(c, r);
    if (ids == nullptr) continue;
    for (const std::string& id : *ids) {
      if (auto it = gpu_ids.find(CanonicalGpuId(id)); it != gpu_ids.end()) {
        out.push_back(it->second);
      } else if (const int i = topology.GpuIndex(id); i >= 0) {
        out.push_back(topology.gpus()[i].place.pci);
      }
    }
  }
  return out;
}

}  // namespace

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
                           const Config& config, const std::string& resource,
                           const std::map<std::string, std::string>& gpu_ids,
                           const topology::Topology& topology) {
  GpuSelection out;
  std::set<std::string> held;
  const ContainerDevices* chosen = nullptr;
  for (const ContainerDevices& c : pods) {
    for (const std::string& pci : GpuPcis(c, config, gpu_ids, topology)) held.insert(pci);
    if (!HoldsGpus(c, config.gpu_resources)) continue;
    const auto* ours = Find(c, resource);
    if (ours != nullptr && !ours->empty()) continue;
    auto seen = first_seen.find(c.key);
    if (seen == first_seen.end() || now - seen->second > config.admission_window) continue;
    ++out.candidates;
    chosen = &c;
  }
  if (out.candidates == 1) {
    out.container = chosen->key;
    out.context.container_gpus = GpuPcis(*chosen, config, gpu_ids, topology);
    std::sort(out.context.container_gpus.begin(), out.context.container_gpus.end());
  }
  for (const auto& gpu : topology.gpus()) {
    if (held.count(gpu.place.pci) == 0) out.context.free_gpus.push_back(gpu.place.pci);
  }
  out.context.free_gpus_known = true;
  return out;
}

}  // namespace rdp::deviceplugin
