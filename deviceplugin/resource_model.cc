#include "deviceplugin/resource_model.h"

#include "allocator/allocator.h"

namespace rdp::deviceplugin {
namespace {

bool Usable(const hca::AdvertisedHca& h, const std::set<std::string>& withheld) {
  return h.present && h.healthy && withheld.count(h.pci) == 0;
}

}  // namespace

std::vector<DeviceState> ExclusiveDevices(const std::vector<hca::AdvertisedHca>& hcas,
                                          const std::set<std::string>& withheld) {
  bool all_numa = true;
  for (const hca::AdvertisedHca& h : hcas) all_numa = all_numa && h.numa.has_value();
  std::vector<DeviceState> out;
  out.reserve(hcas.size());
  for (const hca::AdvertisedHca& h : hcas) {
    out.push_back({h.pci, Usable(h, withheld), all_numa ? h.numa : std::nullopt});
  }
  return out;
}

std::vector<DeviceState> SharedDevices(int count, const std::vector<hca::AdvertisedHca>& hcas,
                                       const std::set<std::string>& withheld) {
  if (hcas.empty()) return {};
  bool any = false;
  for (const hca::AdvertisedHca& h : hcas) any = any || Usable(h, withheld);
  std::vector<DeviceState> out;
  out.reserve(count);
  for (int i = 0; i < count; ++i) out.push_back({SharedId(i), any, std::nullopt});
  return out;
}

std::string SharedId(int index) { return allocator::SharedId(static_cast<std::uint32_t>(index)); }

bool IsSharedId(std::string_view id, int count) {
  const std::optional<std::uint32_t> index = allocator::SharedIndex(id);
  return index && static_cast<std::int64_t>(*index) < count;
}

}  // namespace rdp::deviceplugin
