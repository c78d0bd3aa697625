#pragma once

// What `rdma-device-plugin check` says about GPUDirect RDMA in the container it runs in: whether
// an HCA can read and write the container's GPU memory directly, and if not, why. Without it NCCL
// still runs, staging through host memory, at a fraction of the bandwidth; the HCA comparison
// (container_check.h) cannot show that.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/env.h"
#include "nlohmann/json.hpp"
#include "topology/gpudirect.h"

namespace rdp::check {

struct GpuDirectReport {
  bool possible = false;
  std::vector<std::string> reasons;  // why not (empty when possible), for people
  std::vector<std::string> gpus;     // the NVIDIA GPUs the container sees: "nvidia0", ...
  topology::GpuDirectState node;     // the node's mechanisms
  // RLIMIT_MEMLOCK (soft) of the check's own process, the container's; nullopt: not known.
  std::optional<std::uint64_t> memlock;
  std::string memlock_note;  // "" or why the limit stops RDMA (any RDMA, not only GPUDirect)
};

// The NVIDIA GPUs whose device node the container has: /dev/nvidiaN (N a number), sorted.
std::vector<std::string> VisibleGpus(Env& env);

// Pure: GPUDirect RDMA can work when the container can open an HCA, sees a GPU, and the node has
// a mechanism (nvidia-peermem or dma-buf). Every missing one is a reason.
GpuDirectReport AssessGpuDirect(const topology::GpuDirectState& node,
                                const std::vector<std::string>& gpus,
                                const std::vector<std::string>& openable_hcas,
                                std::optional<std::uint64_t> memlock);

// Below this RLIMIT_MEMLOCK a note says RDMA registration will fail for collective libraries
// (NCCL registers hundreds of MiB per process).
inline constexpr std::uint64_t kLowMemlock = std::uint64_t{1} << 30;

nlohmann::json ToJson(const GpuDirectReport& report);
void PrintText(const GpuDirectReport& report, std::ostream& out);

}  // namespace rdp::check
