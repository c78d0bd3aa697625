#include "hca/scan_change.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_join.h"
#include "topology/discovery.h"

namespace rdp::hca {

ScanChange CompareScan(const std::vector<topology::Hca>& known,
                       const std::vector<topology::Hca>& scanned) {
  if (topology::HcaFingerprint(scanned) == topology::HcaFingerprint(known)) {
    return ScanChange::kNone;
  }
  return PciFunctions(scanned) == PciFunctions(known) ? ScanChange::kState
                                                      : ScanChange::kFunctions;
}

std::string PciFunctions(const std::vector<topology::Hca>& hcas) {
  std::vector<std::string> pcis;
  pcis.reserve(hcas.size());
  for (const topology::Hca& h : hcas) pcis.push_back(h.place.pci);
  std::sort(pcis.begin(), pcis.end());
  return absl::StrJoin(pcis, ";");
}

topology::TopologyPtr WithScannedState(const topology::Topology& snapshot,
                                       const std::vector<topology::Hca>& scanned) {
  std::vector<topology::Hca> hcas = snapshot.hcas();
  for (const topology::Hca& s : scanned) {
    const int idx = snapshot.HcaIndex(s.place.pci);
    if (idx < 0) continue;
    topology::Hca& h = hcas[idx];
    h.name = s.name;
    h.uverbs = s.uverbs;
    h.umad = s.umad;
    h.issm = s.issm;
    h.netdevs = s.netdevs;
    h.ports = s.ports;
    h.char_devices = s.char_devices;
  }
  return std::make_shared<const topology::Topology>(topology::Topology::WithNumaNodes(
      snapshot.all_numa_nodes(), std::move(hcas), snapshot.gpus()));
}

}  // namespace rdp::hca
