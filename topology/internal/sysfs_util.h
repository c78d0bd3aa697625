#pragma once

// Internal to topology/: helpers of the sysfs reader, the hwloc loader and discovery.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "base/log.h"

namespace rdp::topology {

// Lower-case hex of `v` in exactly `digits` digits, appended (PCI addresses, roots and IDs are
// named this way for every device of every discovery: no formatting library per call).
inline void AppendHex(std::string& out, unsigned v, int digits) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) {
    out.push_back(kDigits[(v >> shift) & 0xf]);
  }
}

// Keeps the first of several entries with one PCI address (place.pci) and warns about the others:
// a hand-edited or corrupt XML, or two names for one function, must never show the kubelet one
// device ID twice. `what` names the kind ("HCA", "GPU"); name(item) names the entry.
template <typename T, typename NameFn>
void DropDuplicatePci(std::vector<T>& items, const char* what, NameFn name) {
  // Decided first, moved after: the views point into the items' own strings.
  std::vector<std::string_view> seen;  // sorted
  std::vector<char> drop(items.size(), 0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string_view pci = items[i].place.pci;
    auto at = std::lower_bound(seen.begin(), seen.end(), pci);
    if (at == seen.end() || *at != pci) {
      seen.insert(at, pci);
      continue;
    }
    Logger("topology")->warn("ignoring {} {}: another {} is at {}", what, name(items[i]), what,
                             items[i].place.pci);
    drop[i] = 1;
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (drop[i]) continue;
    if (kept != i) items[kept] = std::move(items[i]);
    ++kept;
  }
  items.erase(items.begin() + static_cast<std::ptrdiff_t>(kept), items.end());
}

// "pci0000:15" from a resolved device path of the node, "/sys/devices/pci0000:15/...": the first
// component below /sys/devices; "" when the path is not below it or not under a host bridge.
std::string PcieRootFromDevicePath(const std::string& resolved);

}  // namespace rdp::topology
