#pragma once

// Mode switching without sharing an HCA by mistake: which HCAs containers still hold under the
// other mode's IDs. Pure.

#include <set>
#include <string>
#include <vector>

#include "deviceplugin/config.h"
#include "deviceplugin/pod_resources.h"
#include "topology/topology.h"

namespace rdp::deviceplugin {

// HCAs (PCI addresses) that containers hold under the other mode's IDs, with one reason line per
// container: in exclusive mode a container holding shared IDs of `resource` sees every HCA, so
// all are withheld; in shared mode a container holding PCI-address IDs withholds those HCAs.
struct Withholding {
  std::set<std::string> pcis;
  std::vector<std::string> reasons;
};
Withholding ComputeWithheld(const PodList& pods, const std::string& resource, hca::Mode mode,
                            const topology::Topology& topology);

}  // namespace rdp::deviceplugin
