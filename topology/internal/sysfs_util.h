#pragma once

// Internal to topology/: helpers of the sysfs reader and of discovery.

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "base/log.h"

namespace rdp::topology {

// Keeps the first of several entries with one PCI address (place.pci) and warns about the others:
// a hand-edited or corrupt XML, or two names for one function, must never show the kubelet one
// device ID twice. `what` names the kind ("HCA", "GPU"); name(item) names the entry.
template <typename T, typename NameFn>
void DropDuplicatePci(std::vector<T>& items, const char* what, NameFn name) {
  std::set<std::string> seen;
  items.erase(std::remove_if(items.begin(), items.end(),
                             [&](const T& item) {
                               if (seen.insert(item.place.pci).second) return false;
                               Logger("topology")->warn("ignoring {} {}: another {} is at {}",
                                                        what, name(item), what, item.place.pci);
                               return true;
                             }),
              items.end());
}

// "pci0000:15" from a resolved device path of the node, "/sys/devices/pci0000:15/...": the first
// component below /sys/devices; "" when the path is not below it or not under a host bridge.
std::string PcieRootFromDevicePath(const std::string& resolved);

}  // namespace rdp::topology
