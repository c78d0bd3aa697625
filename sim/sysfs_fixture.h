#pragma once

// Writes fake sysfs and /dev trees laid out the way the Linux kernel lays them out (symlinks
// included), so that discovery, health checks and the demo run against a node that is not this
// machine. Used by tests, by `rdma-device-plugin demo` and by the kubelet conformance harness.
//
// Layout written under root (R):
//   R/sys/devices/<pcie_root>/<bridge>/.../<pci>/{numa_node,vendor,device,class}
//   R/sys/devices/.../<pci>/infiniband/<name>/ports/<n>/{state,phys_state,link_layer,rate}
//   R/sys/devices/.../<pci>/infiniband/<name>/ports/<n>/counters/<counter>
//   R/sys/devices/.../<pci>/infiniband/<name>/ports/<n>/{gids,gid_attrs/types,gid_attrs/ndevs}/<i>
//   R/sys/devices/.../<pci>/infiniband/<name>/device -> ../../../<pci>
//   R/sys/devices/.../<pci>/driver -> ../../../bus/pci/drivers/<driver>
//   R/sys/bus/pci/drivers/<driver>/<pci> -> ../../../../devices/.../<pci>
//   R/sys/devices/.../<pci>/infiniband/<name>/{fw_ver,node_guid}
//   R/sys/devices/.../<vf pci>/physfn -> ../<pf pci>, R/sys/devices/.../<pf pci>/virtfnN -> ../<vf pci>
//     (an SR-IOV VF, beside its PF)
//   R/sys/devices/.../<pci>/net/<netdev>/{address,type}
//   R/sys/devices/.../<pci>/infiniband_verbs/uverbsN/{ibdev,dev,device -> ../../../<pci>}
//   R/sys/devices/.../<pci>/infiniband_mad/{umadN,issmN}/{ibdev,port,dev}
//   R/sys/devices/virtual/misc/rdma_cm/dev, R/sys/class/misc/rdma_cm -> ...
//     (dev: "major:minor" as the kernel numbers them: uverbsN 231:192+N, umadN 231:N,
//     issmN 231:64+N, rdma_cm 10:58)
//   R/sys/class/infiniband/<name> -> ../../devices/.../<pci>/infiniband/<name>
//   R/sys/class/infiniband_verbs/uverbsN -> ../../devices/.../infiniband_verbs/uverbsN
//   R/sys/class/infiniband_mad/{umadN,issmN} -> ...
//   R/dev/infiniband/{uverbsN,umadN,issmN,rdma_cm}  (regular files standing in for char devices)
//   R/sys/bus/pci/devices/<pci> -> ../../../devices/.../<pci>  (every HCA; AddTopology: GPUs too)
// and by AddTopology, what the kernel also shows of the node's GPUs and NUMA nodes:
//   R/sys/devices/<pcie_root>/<bridge>/.../<gpu pci>/{numa_node,vendor,device,class}
//   R/sys/devices/system/node/node<N>/cpulist  ("" for a node without CPUs; a node with CPUs
//     whose CPUs are not known, as in a hand-built snapshot, is not laid out)
// Not thread-safe; each instance owns its root's contents.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "topology/topology.h"

namespace rdp::sim {

// One used entry of a RoCE port's GID table: ports/<n>/gids/<index> and gid_attrs/{types,ndevs}/<index>.
struct FixtureGid {
  int index = 0;
  std::string gid;                 // as sysfs prints it: "0000:0000:0000:0000:0000:ffff:c000:020a"
  std::string type = "RoCE v2";    // or "IB/RoCE v1"
  std::string netdev;
};
// The GID of an IPv4 address as the kernel makes it: "192.0.2.10" ->
// "0000:0000:0000:0000:0000:ffff:c000:020a".
std::string Ipv4Gid(const std::string& ipv4);
// The hardware address the fixture gives the `index`th netdev of the PCI function `pci`:
// "0000:1a:00.0", 0 -> "02:00:00:1a:00:00" (locally administered; domain's low byte, bus,
// device, function, index); "" for an address that is not domain:bus:device.function.
std::string NetdevAddress(const std::string& pci, std::size_t index);

struct FixturePort {
  int number = 1;
  std::string state = "ACTIVE";      // written as "4: ACTIVE" like the kernel
  std::string phys_state = "LinkUp";  // written as "5: LinkUp"
  std::string link_layer = "InfiniBand";
  std::string rate = "400 Gb/sec (4X NDR)";
  // Files of counters/ and their values. Empty: FixtureCounters(k, number) for the k-th HCA
  // laid out (0 first), so that every fixture node has known, distinct traffic.
  std::map<std::string, std::uint64_t> counters;
  // RoCE: the used entries of the GID table. Laid out with every unused entry below the highest
  // index as the kernel prints it (all zero, no types/ndevs file that reads), as on a real port.
  std::vector<FixtureGid> gids;
};

// The default port counters of the k-th HCA laid out (0-based), port `port`:
//   port_rcv_data     1000000 * (k+1) + port   (4-octet words, as the kernel counts them)
//   port_xmit_data    2000000 * (k+1) + port
//   port_rcv_packets  10000 * (k+1),  port_xmit_packets 20000 * (k+1)
//   symbol_error 0, link_downed k, port_rcv_errors 0
std::map<std::string, std::uint64_t> FixtureCounters(int k, int port);

struct FixtureHca {
  std::string name;                 // mlx5_0
  std::string pci;                  // 0000:1a:00.0
  int numa = 0;                     // written to numa_node; -1 for unknown
  std::string pcie_root;            // pci0000:15
  std::vector<std::string> bridges; // bridge BDFs from the root port down to the parent
  std::vector<FixturePort> ports = {FixturePort{}};
  bool umad = true;                 // one umadN + issmN per port (RoCE hosts often have none)
  // Each with net/<if>/type: 32 (infiniband) when the first port's link layer is InfiniBand,
  // else 1 (ether).
  std::vector<std::string> netdevs;
  // The PCI function's identity: vendor and device (written "0x15b3"), the driver its `driver`
  // link names (sys/bus/pci/drivers/<driver>); the RDMA device's fw_ver and node_guid ("": one
  // made from the PCI address, FixtureNodeGuid).
  std::string vendor = "15b3";
  std::string device = "1021";      // ConnectX-7; its VFs are "101e"
  std::string driver = "mlx5_core";
  std::string firmware_version = "28.39.1002";
  std::string node_guid;
  // An SR-IOV VF: its PF's PCI address. The PF must be laid out first; the VF is laid out beside
  // it (its root, bridges and numa_node; pcie_root, bridges and numa here are not used), with a
  // `physfn` link to the PF and the PF's next `virtfnN` link to it.
  std::string physfn;
};

// The node GUID the fixture gives the RDMA device of `pci` when FixtureHca::node_guid is "":
// "0000:1a:00.1" -> "b8ce:f600:001a:0001" (domain's low byte, bus, device, function).
std::string FixtureNodeGuid(const std::string& pci);

// What a node says about GPUDirect RDMA (topology/gpudirect.h), laid out by
// SysfsFixture::AddGpuDirect under the same root (R/sys, R/proc; pass the root as --proc-root).
struct FixtureGpuDirect {
  // nvidia_peermem: "sysfs" writes R/sys/module/nvidia_peermem/version, "proc-modules" only a
  // line of R/proc/modules, "" neither.
  std::string peermem;
  // Writes R/sys/kernel/mm/memory_peers/nv_mem/version (MLNX_OFED's registration) when true, and
  // an empty R/sys/kernel/mm/memory_peers when false and memory_peers_dir is set.
  bool registered = false;
  bool memory_peers_dir = false;
  // R/proc/driver/nvidia/version's first line, "" for no NVIDIA driver; e.g.
  // "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build ...".
  std::string nvidia_version;
  std::string kernel_release = "6.8.0-45-generic";  // R/proc/sys/kernel/osrelease
};

class SysfsFixture {
 public:
  // root is created if missing. Nothing is written until AddHca/AddRdmaCm.
  explicit SysfsFixture(std::string root);

  std::string sysfs_root() const { return root_; }  // pass as --sysfs-root
  std::string dev_root() const { return root_; }    // pass as --dev-root

  // Lays out one HCA (a VF when hca.physfn is set: NotFound unless its PF is laid out);
  // uverbs/umad/issm numbers are assigned in call order.
  absl::Status AddHca(const FixtureHca& hca);
  // Writes R/dev/infiniband/rdma_cm.
  absl::Status AddRdmaCm();
  // Rewrites a port's state file ("DOWN", "ACTIVE", ...).
  absl::Status SetPortState(const std::string& name, int port, const std::string& state);
  // Removes the HCA's class links, its device directory and its /dev nodes, as a hot-unplug does.
  absl::Status RemoveHca(const std::string& name);
  // Rewrites one file of a port's counters/ (atomically, as SetPortState).
  absl::Status SetCounter(const std::string& name, int port, const std::string& counter,
                          std::uint64_t value);
  // Removes only the HCA's /dev/infiniband/uverbsN.
  absl::Status RemoveUverbs(const std::string& name);
  // Removes the HCA's RDMA device (its infiniband, infiniband_verbs and infiniband_mad entries
  // and their /dev nodes) and keeps its PCI function, as unloading the RDMA driver does.
  absl::Status UnbindRdma(const std::string& name);
  // Lays the RDMA device of the PCI function `pci` out again as `name`, with the next uverbs and
  // umad/issm numbers, as loading the driver again does (it may number them differently).
  absl::Status BindRdma(const std::string& pci, const std::string& name);

  // Lays out what the node says about GPUDirect RDMA (not part of AddTopology's layout).
  absl::Status AddGpuDirect(const FixtureGpuDirect& gpudirect);

  // Lays out a GPU's PCI function: its device directory (numa_node -1 when unknown) and its
  // /sys/bus/pci/devices link.
  absl::Status AddGpu(const topology::Gpu& gpu);
  // Writes node<N>/cpulist of every NUMA node whose CPUs are known or that has none.
  absl::Status AddNumaNodes(const std::vector<topology::NumaNode>& nodes);

  // Lays out every HCA of a snapshot (placement, ports, netdevs, the identity it knows: the
  // fixture's defaults for what it does not; its VFs after the PFs) plus rdma_cm, its GPUs and
  // its NUMA nodes; used to turn an hwloc XML fixture into a full node.
  absl::Status AddTopology(const topology::Topology& topology);

 private:
  struct Laid {
    FixtureHca hca;
    std::string device_dir;  // absolute path of .../<pci>
    int uverbs = -1;
    std::vector<int> mads;   // umad/issm index per port
    bool bound = false;      // its RDMA device is laid out
    int virtfns = 0;         // a PF's virtfnN links laid out
    std::string virtfn_link; // a VF: its PF's virtfnN link to it
  };
  Laid* Find(const std::string& name);
  // The RDMA device of `laid`'s PCI function, with the next uverbs and umad/issm numbers.
  absl::Status LayOutRdma(Laid& laid);
  void RemoveRdma(Laid& laid);

  std::string root_;
  std::vector<Laid> laid_;
  int next_uverbs_ = 0;
  int next_mad_ = 0;
};

}  // namespace rdp::sim
