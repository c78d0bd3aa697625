#include "deviceplugin/withholding.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rdp::deviceplugin {

Withholding ComputeWithheld(const PodList& pods, const std::string& resource, hca::Mode mode,
                            const topology::Topology& topology) {
  Withholding out;
  for (const ContainerDevices& c : pods) {
    auto held = c.devices.find(resource);
    if (held == c.devices.end()) continue;
    std::vector<std::string> foreign;
    for (const std::string& id : held->second) {
      const std::optional<std::string> pci = topology::NormalizePci(id);
      if (mode == hca::Mode::kExclusive && !pci) foreign.push_back(id);
      if (mode == hca::Mode::kShared && pci) foreign.push_back(*pci);
    }
    if (foreign.empty()) continue;
    std::sort(foreign.begin(), foreign.end());  // one wording whatever order the kubelet lists
    if (mode == hca::Mode::kExclusive) {
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

}  // namespace rdp::deviceplugin
