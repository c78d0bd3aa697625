#pragma once

// The node's RDMA NICs (HCAs), GPUs, NUMA nodes and PCIe tree as one immutable snapshot.
//
// A Topology is plain data: it can be built by hand (tests, the allocator's fixtures) or by
// Discover() (topology/discovery.h) from sysfs and hwloc. hwloc types never appear here.
// A snapshot is never modified after construction; share it as TopologyPtr and swap it whole.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rdp::topology {

// One PCI bridge on the way from a host bridge down to a device.
struct Bridge {
  std::string pci;        // the bridge's own address, "0000:16:00.0"
  std::string switch_id;  // the upstream port of the PCIe switch this bridge belongs to (the
                          // upstream port itself or one of its downstream ports); "" for a
                          // root port or a bridge that is not part of a switch
};

// Where a PCI function sits.
struct PciPlacement {
  std::string pci;                 // "0000:1a:00.0", lower-case, always set
  std::optional<int> numa;         // nullopt when unknown (sysfs numa_node -1, or no locality)
  std::string pcie_root;           // "pci0000:15": the host bridge's bus; "" when unknown
  std::vector<Bridge> bridges;     // root port first, the device's parent bridge last
  bool bridges_known = false;      // false when the device is not in the PCI tree (then the
                                   // path to anything under the same root is PHB at best)

  // The nearest switch above the device: the switch_id of the innermost bridge that belongs to
  // a switch, or "" when none does.
  std::string Switch() const;
};

struct Port {
  int number = 0;
  std::string state;       // "ACTIVE", "DOWN", "INIT", "ARMED", "ACTIVE_DEFER" or "" if unknown
  std::string phys_state;  // "LinkUp", "Disabled", ... or ""
  std::string link_layer;  // "InfiniBand", "Ethernet" or ""
  std::string rate;        // "400 Gb/sec (4X NDR)" or ""
  // RoCE (link_layer "Ethernet") only: the lowest index i of the port's GID table whose entry is
  // a RoCE v2 GID with an IPv4 address (ports/<n>/gids/<i> an IPv4-mapped address
  // ::ffff:a.b.c.d, gid_attrs/types/<i> "RoCE v2"): what NCCL_IB_GID_INDEX must name. nullopt on
  // InfiniBand and when the port has none (no IPv4 address on its netdev, only IPv6 or RoCE v1
  // entries). The two strings are empty then.
  std::optional<int> roce_v2_ipv4_gid;
  std::string gid_ipv4;    // that entry's address, "192.0.2.10"
  std::string gid_netdev;  // gid_attrs/ndevs/<i>: the netdev it belongs to, "ens1f0np0"
  bool Active() const { return state == "ACTIVE"; }
};

struct Hca {
  std::string name;                 // kernel name: mlx5_0, mlx5_bond_0, rocep26s0, ibp26s0 ...
  PciPlacement place;               // keyed by place.pci: names are not stable
  std::string uverbs;               // "uverbs0", "" when unknown (XML-only discovery)
  std::vector<std::string> umad;    // "umad0" per port that has one; often none on RoCE
  std::vector<std::string> issm;    // "issm0"
  std::vector<std::string> netdevs; // netdevs of the PCI function, sorted
  // The netlink link type of netdevs[0] (sysfs net/<if>/type: 1 "ether", 32 "infiniband"; other
  // types by number), "" when the function has no netdev.
  std::string netdev_link_type;
  // The PCI function's identity: vendor and device IDs as 4 lower-case hex digits without 0x
  // ("15b3", "1021"), the bound driver ("mlx5_core"), the HCA's firmware version (fw_ver,
  // "28.39.1002") and node GUID (node_guid, "b8ce:f603:00a1:b2c4"); "" when unknown.
  std::string vendor;
  std::string device;
  std::string driver;
  std::string firmware_version;
  std::string node_guid;
  // An SR-IOV virtual function's physical function (the physfn link), "0000:1a:00.0"; "" for a
  // physical function or a bond. A VF is placed where its PF is (NUMA node, root, switch).
  std::string physfn;
  bool IsVirtualFunction() const { return !physfn.empty(); }
  std::vector<Port> ports;          // by port number
  // The character devices, uverbs first, then umad and issm, as node paths
  // ("/dev/infiniband/uverbs0": an Env reads them under the dev root; the path is also the host
  // path the container runtime needs), and whether each existed at the scan. rdma_cm is
  // node-wide and not listed here. Whether they make the HCA usable is hca::Assess's to say.
  std::vector<std::pair<std::string, bool>> char_devices;

  // Every port ACTIVE (and at least one port): a fact of the scan, not whether the HCA can be
  // handed out (hca::Assess says that: one ACTIVE port is enough).
  bool AllPortsActive() const;
};

struct Gpu {
  PciPlacement place;
  std::string vendor;     // PCI vendor ID, 4 lower-case hex digits: "10de"
  std::string device;     // PCI device ID, "2330"
  std::string pci_class;  // PCI class, 4 lower-case hex digits: "0302"; "" when unknown
};

// One NUMA node of the machine.
struct NumaNode {
  int id = 0;
  // False for memory without CPUs: a GPU's memory on Grace (hwloc's subtype GPUMemory), the
  // empty nodes a Grace GPU's driver keeps for MIG partitions, CXL or HBM memory. Such a node is
  // never a device's NUMA node and never advertised to the kubelet, whose Topology Manager
  // aligns CPUs with devices: a pod cannot be pinned to it.
  bool has_cpus = true;
  // Its CPUs as the kernel's cpulist spells them ("0-71"); "" when it has none or they are not
  // known (a hand-built snapshot).
  std::string cpus;
  // What hwloc calls the memory of a node without CPUs ("GPUMemory", "HBM", ...); "" otherwise.
  std::string memory_kind;
};

// nvidia-smi topo -m classes, best first. PIX: the path crosses at most one PCIe switch (or one
// bridge); PXB: several switches, no host bridge; PHB: through one host bridge; NODE: between
// host bridges of one NUMA node; SYS: across NUMA nodes (or unknown locality).
enum class PathClass : std::uint8_t { kPIX = 0, kPXB = 1, kPHB = 2, kNODE = 3, kSYS = 4 };
std::string_view PathClassName(PathClass c);

// The class of the path between two placed devices. Symmetric.
PathClass Classify(const PciPlacement& a, const PciPlacement& b);

class Topology {
 public:
  // Sorts hcas and gpus by PCI address and computes every HCA x GPU path class.
  // numa_nodes: the node's NUMA nodes, all with CPUs, by OS index (sorted and deduplicated here).
  Topology(std::vector<int> numa_nodes, std::vector<Hca> hcas, std::vector<Gpu> gpus);
  // The same with NUMA nodes that may have no CPUs (sorted by id here; of several with one id,
  // the first). A factory, so that Topology({}, ...) and Topology({0, 1}, ...) stay unambiguous.
  static Topology WithNumaNodes(std::vector<NumaNode> numa_nodes, std::vector<Hca> hcas,
                                std::vector<Gpu> gpus);

  // The OS indices of the NUMA nodes that have CPUs, ascending: the ones a device can sit on
  // and the kubelet can be told about.
  const std::vector<int>& numa_nodes() const { return cpu_numa_nodes_; }
  // Every NUMA node, those without CPUs included, by id.
  const std::vector<NumaNode>& all_numa_nodes() const { return numa_nodes_; }
  const std::vector<Hca>& hcas() const { return hcas_; }
  const std::vector<Gpu>& gpus() const { return gpus_; }

  // Index into hcas()/gpus() by PCI address (any case), or -1. An address without a domain
  // ("1a:00.0") names the one device that has that bus:dev.fn in any domain, and none when
  // several have it: on a node with a PCI domain per root complex (Grace), 01:00.0 is in each.
  int HcaIndex(std::string_view pci) const;
  int GpuIndex(std::string_view pci) const;

  // Path class between hcas()[hca] and gpus()[gpu]. Precomputed; O(1).
  PathClass Path(std::size_t hca, std::size_t gpu) const {
    return paths_[hca * gpus_.size() + gpu];
  }

 private:
  struct NodesTag {};
  Topology(NodesTag, std::vector<NumaNode> numa_nodes, std::vector<Hca> hcas,
           std::vector<Gpu> gpus);

  std::vector<NumaNode> numa_nodes_;
  std::vector<int> cpu_numa_nodes_;
  std::vector<Hca> hcas_;
  std::vector<Gpu> gpus_;
  std::vector<PathClass> paths_;  // row-major: hca x gpu
};

using TopologyPtr = std::shared_ptr<const Topology>;

// "0000:1A:00.0" -> "0000:1a:00.0"; "1a:00.0" -> "0000:1a:00.0". nullopt when not a BDF.
std::optional<std::string> NormalizePci(std::string_view text);
// True when `text` is an address exactly as NormalizePci spells it ("0000:1a:00.0").
bool IsCanonicalPci(std::string_view text);

}  // namespace rdp::topology
