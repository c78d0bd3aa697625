#pragma once

// The IDs GPU device plugins advertise, to the PCI addresses of the GPUs they name, from the
// NVIDIA driver's /proc files and, for what those do not tell, `nvidia-smi -L`'s output.
//
// NVIDIA's device plugin names a GPU (docs/server.md, "GPU IDs"):
//   "GPU-<uuid>"                 the uuid ID strategy (its default): /proc/driver/nvidia;
//   "<index>"                    the index strategy: the GPU's NVML index; from the list file when
//                                one is given, else the index of the GPU among the driver's GPUs
//                                in PCI address order (NVML's own order);
//   "MIG-<uuid>"                 a MIG device (drivers from R470): its parent GPU, from the list
//                                file only (no /proc file names MIG UUIDs);
// and, reduced to one of those by CanonicalGpuId:
//   "<id>::<n>"                  replica n of a GPU shared by time-slicing or MPS;
//   "MIG-GPU-<uuid>/<gi>/<ci>"   a MIG device on older drivers: the parent's UUID is in it;
//   "<index>:<mig index>"        a MIG device with the index strategy: the parent's index.

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "base/env.h"

namespace rdp::deviceplugin {

// GPU ID -> PCI address: every UUID in /proc/driver/nvidia/gpus/<pci>/information
// ("GPU UUID: GPU-..."), read through `env`, and every index; with `list_file` (the output of
// `nvidia-smi -L`, read at most 1 MiB of it), the indexes it gives and its MIG devices' UUIDs,
// each mapped to its GPU's address. Empty when the driver's directory is absent; an unreadable
// entry, a missing or malformed list file, or a GPU of the list the driver does not show is
// skipped. Every read is bounded and never blocks on something that is not a regular file;
// never throws.
std::map<std::string, std::string> ReadNvidiaGpuIds(Env& env, const std::string& list_file = "");
// The same on the filesystem, proc/ under proc_root.
std::map<std::string, std::string> ReadNvidiaGpuIds(const std::string& proc_root,
                                                    const std::string& list_file = "");

// The key under which ReadNvidiaGpuIds maps the GPU that `id` names: the replica suffix
// dropped ("GPU-a::3" -> "GPU-a"), an old-style MIG ID reduced to its parent
// ("MIG-GPU-a/1/0" -> "GPU-a"), an index-strategy MIG ID to its GPU's index ("1:0" -> "1").
// Any other ID unchanged.
std::string CanonicalGpuId(absl::string_view id);

}  // namespace rdp::deviceplugin
