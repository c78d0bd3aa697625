#include "deviceplugin/resource_model.h"

#include <string_view>

#include "absl/strings/str_cat.h"

namespace rdp::deviceplugin {
namespace {

constexpr char kSharedPrefix[] = "shared-";

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

std::string SharedId(int index) { return absl::StrCat(kSharedPrefix, index); }

bool IsSharedId(const std::string& id, int count) {
  // By hand: a shared GetPreferredAllocation checks 1000 of these.
  constexpr std::string_view kPrefix = kSharedPrefix;
  if (id.size() <= kPrefix.size() || id.size() > kPrefix.size() + 10) return false;  // int
  for (std::size_t i = 0; i < kPrefix.size(); ++i) {
    if (id[i] != kPrefix[i]) return false;
  }
  if (id.size() > kPrefix.size() + 1 && id[kPrefix.size()] == '0') return false;
  long long n = 0;
  for (std::size_t i = kPrefix.size(); i < id.size(); ++i) {
    const char c = id[i];
    if (c < '0' || c > '9') return false;
    n = n * 10 + (c - '0');
  }
  return n < count;
}

}  // namespace rdp::deviceplugin
