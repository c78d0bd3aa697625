#pragma once

// NVIDIA GPU device IDs (UUIDs, as NVIDIA's device plugin advertises them) to PCI addresses, from
// the driver's /proc files.

#include <map>
#include <string>

#include "base/env.h"

namespace rdp::deviceplugin {

// GPU UUID -> PCI address from /proc/driver/nvidia/gpus/<pci>/information ("GPU UUID: GPU-..."),
// read through `env`. Empty when the directory is absent; an unreadable entry is skipped. Every
// read is bounded and never blocks on something that is not a regular file; never throws.
std::map<std::string, std::string> ReadNvidiaGpuIds(Env& env);
// The same on the filesystem, proc/ under proc_root.
std::map<std::string, std::string> ReadNvidiaGpuIds(const std::string& proc_root);

}  // namespace rdp::deviceplugin
