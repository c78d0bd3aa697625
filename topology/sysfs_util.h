#pragma once

// Small sysfs helpers shared inside topology/ (and with server/'s /proc reader). Not part of the
// module's public interface.

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <set>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "topology/log.h"

namespace rdp::topology {

// At most max_bytes from the start of a regular file, opened without blocking; nullopt when it
// cannot be read or is not a regular file (a FIFO or device would block the reader).
std::optional<std::string> ReadHead(const std::filesystem::path& file, std::size_t max_bytes);

// The first line of a sysfs attribute, trailing blanks removed, at most 4 KiB; nullopt when the
// file cannot be read.
std::optional<std::string> ReadFirstLine(const std::filesystem::path& file);

// Sorted entry names of dir; with dirs_only, only entries that resolve to directories. Empty when
// dir cannot be read.
std::vector<std::string> ListDir(const std::filesystem::path& dir, bool dirs_only);

// Test seam: when set, called with each path just before ReadFirstLine or ListDir reads it, so
// that a test can make a file vanish at a chosen point of a scan, deterministically. Tests only;
// nullptr clears it. Calls are serialised; once this returns, the previous hook is neither
// running nor called again. The hook must not call ReadFirstLine or ListDir itself.
void SetSysfsReadHookForTesting(std::function<void(const std::filesystem::path&)> hook);

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

// "pci0000:15" from a resolved device path "<sys_devices>/pci0000:15/...", where sys_devices is the
// resolved "<sysfs root>/sys/devices"; "" when the path is not below it or not under a host
// bridge.
std::string PcieRootFromDevicePath(const std::filesystem::path& resolved,
                                   const std::filesystem::path& sys_devices);

}  // namespace rdp::topology
