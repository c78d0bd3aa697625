#pragma once

// The node's HCAs as both front doors (the device plugin, dra/) see them: what makes an HCA
// usable, what a container holding some of them gets, and the node's mode. Pure functions, but
// for CheckedNow, which reads the node through an Env. No state, no protobuf.

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "base/env.h"
#include "topology/topology.h"

namespace rdp::hca {

// How the node hands out its HCAs: shared (every consumer sees every HCA) or exclusive (one
// consumer owns each). Chosen per node by a label (docs/install.md).
enum class Mode { kShared, kExclusive };

// "shared" / "exclusive"; InvalidArgument naming the text otherwise.
absl::StatusOr<Mode> ParseMode(std::string_view text);
const char* ModeName(Mode mode);

// What a front door knows of an HCA it has advertised (vanished ones included, until
// forgotten): its identity, placement, health in the latest scan and how long it has been gone.
struct AdvertisedHca {
  std::string pci;
  std::string name;
  std::optional<int> numa;
  bool present = false;  // in the latest scan
  bool healthy = false;  // Assess(...).usable in the latest scan
  int absent_polls = 0;  // consecutive scans without it
  std::string reason;    // why it is not healthy; "" when it is
  bool operator==(const AdvertisedHca& o) const {
    return pci == o.pci && name == o.name && numa == o.numa && present == o.present &&
           healthy == o.healthy && absent_polls == o.absent_polls && reason == o.reason;
  }
  bool operator!=(const AdvertisedHca& o) const { return !(*this == o); }
};

// Whether an HCA can be handed to a container, and if not, why. The one definition of a usable
// HCA: at least one ACTIVE port (a dual-port card with one port uncabled is usable, through the
// other), a uverbs device, and every device node it has (uverbsN, and umadN/issmN where the node
// has them) present, as the scan saw them.
struct Verdict {
  bool usable = false;
  // "" when usable; else why: "port 1 is DOWN" (every port named when none is ACTIVE: "port 1
  // is DOWN, port 2 is INIT"), "no port state is known", "it has no uverbs device", "device
  // node /dev/infiniband/uverbs0 is missing".
  std::string reason;
  std::vector<int> active_ports;  // the ACTIVE ports' numbers, ascending: what a container uses
};
Verdict Assess(const topology::Hca& hca);

// An HCA of a snapshot with its device nodes as last checked: the snapshot's Hca itself, not a
// copy (Allocate's hot path hands out HCAs without copying their strings), and whether each of
// its char_devices exists, in their order. `hca` lives as long as the snapshot the caller holds.
struct HcaNow {
  const topology::Hca* hca = nullptr;
  absl::InlinedVector<bool, 6> present;
};
// The device nodes as the scan saw them.
HcaNow AsScanned(const topology::Hca& hca);
// HCAs with their device nodes as checked now, and whether rdma_cm exists.
struct NodesNow {
  std::vector<HcaNow> hcas;
  bool rdma_cm = false;
};
// Each device node of each of `hcas` (in their order) and rdma_cm, checked now (Env::Exists: a
// stat at the call): the scan that saw them may be a poll old, and a DeviceSpec or CDI entry
// naming a missing node makes the container runtime refuse the container. Both doors call it,
// then Assess, when they hand HCAs out.
NodesNow CheckedNow(const std::vector<const topology::Hca*>& hcas, Env& env);
// Assess(hca) with the device nodes as `hca.present` has them.
Verdict Assess(const HcaNow& hca);
inline bool HcaUsable(const topology::Hca& hca) { return Assess(hca).usable; }

// What a container holding some HCAs gets (device-plugin Allocate, a DRA claim's CDI device),
// before it becomes protobuf or CDI JSON.
struct ContainerAllocation {
  struct Spec {
    std::string container_path;
    std::string host_path;
    std::string permissions;
  };
  std::vector<Spec> devices;
  std::map<std::string, std::string> envs;
  // What the caller logs as a warning: why NCCL_IB_GID_INDEX is not set ("HCA mlx5_2 port 1 has
  // no RoCE v2 GID with an IPv4 address").
  std::vector<std::string> warnings;
  // The content of kAllocationFile and its AllocationFileName; both empty when the door writes
  // no file (BuildAllocation without an allocation dir). The content:
  //   {"hcas": [{"name": "mlx5_2", "pci": "0000:c9:00.0", "numa": 1, "netdevs": ["ens6f0np0"],
  //              "uverbs": "/dev/infiniband/uverbs2", "gpu": "0000:ca:00.0",   (when paired)
  //              "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "Ethernet",
  //                         "netdev": "ens6f0np0", "gid_index": 3, "gid_ipv4": "192.0.2.10"}]}],
  //    "env": {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "=mlx5_2", ...}}
  // the HCAs in PCI address order, "env" the variables of `envs`. "numa", "gpu", "uverbs",
  // "netdev", "gid_index" and "gid_ipv4" are left out when unknown or not RoCE; "netdev" is the
  // GID's netdev, else the HCA's only netdev.
  std::string file;
  std::string file_name;
};

// Where a container finds its HCAs described, for stacks other than NCCL (UCX, NIXL):
// a read-only file, mounted by device-plugin Allocate and by the DRA driver's CDI devices.
inline constexpr char kAllocationFile[] = "/etc/rdma/allocation.json";

// "<key>_<suffix>": the name under which one consumer of a container (a device-plugin resource,
// a DRA claim's request) sets its own value of a variable of ContainerAllocation::envs when
// several consumers each set theirs and the plain name is left to at most one of them. Each door
// makes suffixes that no two of its consumers share; since no key of envs followed by '_' begins
// another key, distinct suffixes give distinct names.
std::string OwnVariableName(std::string_view key, std::string_view suffix);

// Where the node-wide RDMA CM device is (a node path, as Env takes it).
inline constexpr char kRdmaCmPath[] = "/dev/infiniband/rdma_cm";

// What a container holding `hcas` (HCAs of a snapshot the caller holds, their device nodes as
// each HcaNow has them) gets. DeviceSpecs ("rw", host path = container path) for each of the
// HCA's device nodes that is present (uverbsN, umadN, issmN, in that order), then
// /dev/infiniband/rdma_cm when with_rdma_cm; envs NCCL_IB_HCA ("=a,b": NCCL's exact-match form;
// an HCA with a port that is not ACTIVE is named with its ACTIVE ports, "=a:1,b", so that NCCL
// uses only those), RDMA_HCA_NAMES ("a,b"), RDMA_HCA_PCI, and UCX_NET_DEVICES ("a:1,b:1": UCX
// names devices by port; the ACTIVE ports, every port of an HCA with none known ACTIVE), so that
// UCX opens only the container's HCAs (libibverbs lists every HCA of the node from sysfs).
//
// The HCAs are taken in PCI address order, whatever order they are given in, so that every
// container holding the same HCAs gets the same values (ranks of one job with different
// NCCL_IB_HCA orders hang). NCCL_IB_GID_INDEX: when the HCAs' ACTIVE Ethernet (RoCE) ports all
// have a RoCE v2 GID with an IPv4 address at the same index (topology::Port::roce_v2_ipv4_gid),
// that index; not set when there is no RoCE port, and not set with a warning when a RoCE port has
// none or two ports have different ones (NCCL takes one index for all).
// `paired_gpu`: PCI address of an HCA -> the PCI address of the container's GPU it pairs with,
// when the container's GPUs are known; goes into the file only.
// `allocation_dir`: the door's --allocation-dir. The file (`file`, `file_name`) is built only
// when it is not "" (the door writes the file there): without one, no file is built. The one
// rule both doors follow.
ContainerAllocation BuildAllocation(std::vector<HcaNow> hcas, bool with_rdma_cm,
                                    const std::map<std::string, std::string>& paired_gpu,
                                    const std::string& allocation_dir);

// The GPU each HCA pairs with, for the allocation file: for each of `hca_pcis` (in PCI order),
// the GPU of `gpu_pcis` with the best path class (topology::Topology::Path) not yet paired, then
// the best one at all when every GPU is paired; ties to the lower PCI address. HCAs or GPUs the
// topology does not know are left out; empty when `gpu_pcis` is.
std::map<std::string, std::string> PairGpus(const topology::Topology& topology,
                                            std::vector<std::string> hca_pcis,
                                            const std::vector<std::string>& gpu_pcis);

// The name of the host file that holds `content` (a ContainerAllocation's file): "<16 hex digits
// of its FNV-1a 64-bit hash>.json". Equal contents share one file, so a door writes a file only
// when no container got that content before, and one set of HCAs makes one file, not one per pod.
std::string AllocationFileName(const std::string& content);

}  // namespace rdp::hca
