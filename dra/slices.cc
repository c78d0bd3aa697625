#include "dra/slices.h"

#include <algorithm>

namespace rdp::dra {

namespace {

std::string SliceName(const PoolMeta& meta, std::size_t index) {
  const std::string suffix = "-" + meta.driver + "-" + std::to_string(index);
  constexpr std::size_t kMaxName = 253;  // a DNS subdomain
  std::string node = meta.node_name;
  if (node.size() + suffix.size() > kMaxName) node.resize(kMaxName - std::min(kMaxName, suffix.size()));
  return node + suffix;
}

}  // namespace

std::vector<nlohmann::json> BuildResourceSlices(const std::vector<nlohmann::json>& devices,
                                                const PoolMeta& meta) {
  std::vector<nlohmann::json> slices;
  const std::size_t count = (devices.size() + kMaxDevicesPerSlice - 1) / kMaxDevicesPerSlice;
  for (std::size_t i = 0; i < count; ++i) {
    nlohmann::json slice = {
        {"apiVersion", "resource.k8s.io/v1"},
        {"kind", "ResourceSlice"},
        {"metadata", {{"name", SliceName(meta, i)}}},
    };
    if (!meta.node_uid.empty()) {
      slice["metadata"]["ownerReferences"] = nlohmann::json::array({{
          {"apiVersion", "v1"},
          {"kind", "Node"},
          {"name", meta.node_name},
          {"uid", meta.node_uid},
          {"controller", true},
      }});
    }
    const auto first = devices.begin() + static_cast<std::ptrdiff_t>(i * kMaxDevicesPerSlice);
    const auto last = devices.begin() + static_cast<std::ptrdiff_t>(
                                            std::min(devices.size(), (i + 1) * kMaxDevicesPerSlice));
    slice["spec"] = {
        {"driver", meta.driver},
        {"nodeName", meta.node_name},
        {"pool",
         {{"name", meta.node_name},
          {"generation", meta.generation},
          {"resourceSliceCount", static_cast<std::int64_t>(count)}}},
        {"devices", nlohmann::json(std::vector<nlohmann::json>(first, last))},
    };
    slices.push_back(std::move(slice));
  }
  return slices;
}

}  // namespace rdp::dra
