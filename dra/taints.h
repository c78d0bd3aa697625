#pragma once

// The device taints of the node's HCAs: which state of an HCA gets which taint (key, value,
// effect), in one table (TaintOf). Pure: no I/O.
//
// The rule (docs/dra.md, "Device taints"):
//  - NoSchedule where a new claim must not land: the HCA cannot serve it now (a port INIT or
//    DOWN, no port state, no uverbs device, a device node missing, its RDMA driver away, the
//    node's health scan failing) or the early-warning rule holds it (flapping). The scheduler
//    allocates it to no new claim that does not tolerate the taint; claims that hold it keep it.
//  - None where the taint only informs: a degraded HCA (error counters growing) is still usable,
//    as in device-plugin mode; DRA has no preference scoring to "prefer others" with, and a
//    NoSchedule would keep a claim for every HCA of the node off the node for a few symbol
//    errors. None is valid since Kubernetes 1.35; the scheduler ignores it.
//  - Never NoExecute: every state here can be transient (a flap, a driver reload, a port
//    training), and NoExecute evicts the running pods that hold the HCA.

#include <optional>
#include <string>
#include <string_view>

#include "node/node.h"
#include "topology/topology.h"

namespace rdp::dra {

// The states of an HCA that carry a taint; a usable HCA that is not degraded has none.
enum class TaintedState {
  kPortInit,           // no port ACTIVE, one INIT or ARMED (waiting for the subnet manager)
  kPortDown,           // no port ACTIVE, none INIT or ARMED (DOWN, ACTIVE_DEFER, unknown)
  kNoPortState,        // no port state known
  kNoUverbsDevice,     // no uverbs device
  kDeviceNodeMissing,  // a device node it has (uverbsN, umadN, issmN) is missing
  kDriverAway,         // its RDMA driver is away while its PCI function stays (a driver reload)
  kScanFailed,         // the node's health scan fails: its last state is not known to hold
  kFlapping,           // held by the early-warning rule: its ports flapped
  kUnusable,           // unusable for a reason this table does not know
  kSymbolErrors,       // degraded: a port's symbol_error counter grows over the threshold
  kLinkDowned,         // degraded: a port's link_downed counter grows over the threshold
};

// resource.k8s.io/v1 DeviceTaintEffect values.
inline constexpr char kEffectNoSchedule[] = "NoSchedule";
inline constexpr char kEffectNone[] = "None";

// A taint as a ResourceSlice's device carries it.
struct DeviceTaint {
  std::string key;     // "<driver>/unhealthy" or "<driver>/degraded"
  std::string value;   // the state's class: "PortInit", "PortNotActive", ...
  std::string effect;  // kEffectNoSchedule or kEffectNone; never NoExecute
};

// The table: the taint of an HCA in `state`, its key in `driver_name`'s domain.
//   state               key          value              effect
//   kPortInit           unhealthy    PortInit           NoSchedule
//   kPortDown           unhealthy    PortNotActive      NoSchedule
//   kNoPortState        unhealthy    NoPortState        NoSchedule
//   kNoUverbsDevice     unhealthy    NoUverbsDevice     NoSchedule
//   kDeviceNodeMissing  unhealthy    DeviceNodeMissing  NoSchedule
//   kDriverAway         unhealthy    DriverNotBound     NoSchedule
//   kScanFailed         unhealthy    ScanFailed         NoSchedule
//   kFlapping           unhealthy    Flapping           NoSchedule
//   kUnusable           unhealthy    Unusable           NoSchedule
//   kSymbolErrors       degraded     SymbolErrors       None
//   kLinkDowned         degraded     LinkDowned         None
DeviceTaint TaintOf(TaintedState state, std::string_view driver_name);

// The state of `hca` (an HCA of node.topology) that carries a taint, or nullopt when it carries
// none. Unusable when node.Verdict says so, classified by Verdict's reason and, for a port
// reason, by the ports' states; else degraded when the early-warning rule says so, by the counter
// that crossed first.
std::optional<TaintedState> TaintedStateOf(const node::View& node, const topology::Hca& hca);

}  // namespace rdp::dra
