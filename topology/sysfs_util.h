#pragma once

// Small sysfs helpers shared inside topology/. Not part of the module's public interface.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace rdp::topology {

// The first line of a sysfs attribute, trailing blanks removed, at most 4 KiB; nullopt when the
// file cannot be read.
std::optional<std::string> ReadFirstLine(const std::filesystem::path& file);

// Sorted entry names of dir; with dirs_only, only entries that resolve to directories. Empty when
// dir cannot be read.
std::vector<std::string> ListDir(const std::filesystem::path& dir, bool dirs_only);

// "pci0000:15" from a resolved device path ".../sys/devices/pci0000:15/...", or "".
std::string PcieRootFromDevicePath(const std::filesystem::path& resolved);

}  // namespace rdp::topology
