#pragma once

// GPUDirect RDMA on this node: whether an HCA can read and write GPU memory directly, and by
// which mechanism. Without it NCCL still runs, staging every transfer through host memory, at a
// fraction of the bandwidth, and says so in one INFO line ("GPU Direct RDMA Disabled").
//
// The signals (docs/server.md, "GPUDirect RDMA"), all read through rdp::Env:
// - nvidia-peermem (the peer-memory client NVIDIA's driver ships, or the older nv_peer_mem):
//   loaded when /sys/module/nvidia_peermem (or nv_peer_mem) exists or /proc/modules lists it;
//   registered with the RDMA core when /sys/kernel/mm/memory_peers/nv_mem (or nv_mem_nc)
//   exists, which MLNX_OFED's ib_core creates. NCCL looks at the same files. A node whose
//   /sys/kernel/mm/memory_peers exists but holds neither has the module loaded and unregistered:
//   unavailable.
// - dma-buf (the kernel's own mechanism: ib_umem_dmabuf, ibv_reg_dmabuf_mr): the NVIDIA driver
//   is the open kernel module flavour (/proc/driver/nvidia/version says "Open Kernel Module":
//   the proprietary flavour exports no dma-buf for CUDA memory) and the kernel is 5.12 or later
//   (/proc/sys/kernel/osrelease; uname(2) when that is not under the proc root, as a container's
//   kernel is its node's). Not checked here: that the HCA's driver implements dma-buf
//   registration (mlx5 does since 5.12) and that the GPU is Turing or newer (the open module
//   drives nothing older).

#include <string>

#include "base/env.h"

namespace rdp::topology {

struct GpuDirectMechanism {
  bool available = false;
  std::string detail;  // what was found, or why it is unavailable: one phrase
};

struct GpuDirectState {
  std::string nvidia_driver;  // "535.104.05", "" when no NVIDIA driver is loaded
  bool open_kernel_module = false;
  std::string kernel_release;  // "6.8.0-45-generic", "" when unknown
  GpuDirectMechanism peermem;  // mechanism "nvidia-peermem"
  GpuDirectMechanism dmabuf;   // mechanism "dma-buf"

  bool Available() const { return peermem.available || dmabuf.available; }
  // One line for people: "GPUDirect RDMA available: nvidia-peermem yes (...); dma-buf no (...)".
  std::string Summary() const;
};

// The metric label values of the two mechanisms (rdma_device_plugin_gpudirect_rdma{mechanism}).
inline constexpr char kPeermemMechanism[] = "nvidia-peermem";
inline constexpr char kDmaBufMechanism[] = "dma-buf";

// Reads the signals above. Never fails: what cannot be read counts as absent.
GpuDirectState ReadGpuDirect(Env& env);

}  // namespace rdp::topology
