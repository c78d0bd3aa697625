#pragma once

// NVIDIA GPU device IDs (UUIDs, as NVIDIA's device plugin advertises them) to PCI addresses, from
// the driver's /proc files.

#include <map>
#include <string>

namespace rdp::server {

// GPU UUID -> PCI address from <proc_root>/proc/driver/nvidia/gpus/<pci>/information
// ("GPU UUID: GPU-..."). Empty when the directory is absent; an unreadable entry is skipped.
// Never throws; every read is bounded and never blocks on something that is not a regular file.
std::map<std::string, std::string> ReadNvidiaGpuIds(const std::string& proc_root);

}  // namespace rdp::server
