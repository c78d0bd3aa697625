#pragma once

// The node's HCAs as both front doors (the device plugin, dra/) see them: what makes an HCA
// usable, what a container holding some of them gets, and the node's mode. Pure functions, but
// for WithDeviceNodesNow, which reads the node through an Env. No locks, no protobuf.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/env.h"
#include "topology/topology.h"

namespace rdp::hca {

// How the node hands out its HCAs: shared (every consumer sees every HCA) or exclusive (one
// consumer owns each). Chosen per node by a label (DESIGN.md).
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
};

// `hca` with each of its device nodes (char_devices) checked now through `env`, one stat each:
// the scan that saw them may be a poll old, and a DeviceSpec or CDI entry naming a missing node
// makes the container runtime refuse the container. Both doors call it, then Assess, when they
// hand HCAs out.
topology::Hca WithDeviceNodesNow(const topology::Hca& hca, Env& env);
// Where the node-wide RDMA CM device is (a node path, as Env takes it).
inline constexpr char kRdmaCmPath[] = "/dev/infiniband/rdma_cm";

// DeviceSpecs ("rw", host path = container path) for each of the HCA's device nodes that is
// present in its char_devices (uverbsN, umadN, issmN, in that order), then
// /dev/infiniband/rdma_cm when with_rdma_cm; envs NCCL_IB_HCA ("=a,b": NCCL's exact-match form;
// an HCA with a port that is not ACTIVE is named with its ACTIVE ports, "=a:1,b", so that NCCL
// uses only those), RDMA_HCA_NAMES ("a,b") and RDMA_HCA_PCI, in the order given.
ContainerAllocation BuildAllocation(const std::vector<topology::Hca>& hcas,
                                    bool with_rdma_cm);

}  // namespace rdp::hca
