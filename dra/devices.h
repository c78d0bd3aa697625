#pragma once

// The node's HCAs as resource.k8s.io/v1 Device objects (the `devices` of our ResourceSlices),
// and the mapping between a device name and an HCA. Pure: no I/O.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "dra/model.h"
#include "nlohmann/json.hpp"
#include "hca/early_warning.h"
#include "absl/strings/string_view.h"
#include "node/node.h"
#include "hca/hca.h"
#include "topology/topology.h"

namespace rdp::dra {

// A PCI function as the kernel places it, read the way k8s.io/dynamic-resource-allocation's
// deviceattribute helpers read it (ReadKernelPci in dra/kernel_pci.h): the source of the standard
// attributes, so that ours equal those of any driver that uses the helpers (a GPU driver whose
// devices a claim pairs with ours by matchAttribute).
struct KernelPci {
  std::string pcie_root;    // "pci0000:15"
  std::optional<int> numa;  // numa_node when >= 0
};

// The claims a shared-mode HCA serves at most unless told otherwise: the device plugin's
// default count of shared units.
inline constexpr std::int64_t kDefaultSharedUnits = 1000;
// The consumable capacities of a shared-mode device (BuildDevices).
inline constexpr char kPodsCapacity[] = "pods";
inline constexpr char kBandwidthCapacity[] = "bandwidthGbps";

struct DeviceOptions {
  // The driver's name: spec.driver of the slices and the domain of our own attributes and
  // taint key. Must be a lower-case DNS subdomain of at most 63 characters.
  std::string driver_name = kDefaultDriverName;
  // How the node offers its HCAs (flag --mode). Exclusive: a device is allocated to at most one
  // claim at a time. Shared: every device may be allocated to any number of claims at once
  // (allowMultipleAllocations; see BuildDevices).
  hca::Mode mode = hca::Mode::kExclusive;
  // Shared mode: the claims one HCA serves at most, the value of its `pods` capacity (flag
  // --shared-devices; the device plugin's shared units). At least 1.
  std::int64_t shared_units = kDefaultSharedUnits;
  // The kernel's placement by PCI address. An HCA listed here takes pcieRoot and numaNode from
  // it alone (numaNode omitted when the kernel has none, even if hwloc inferred one); an HCA not
  // listed (an XML-only topology, a tree without /sys/bus/pci) takes them from the snapshot.
  // On a node, fill it with ReadKernelPci(env, topo) (dra/kernel_pci.h) for each snapshot.
  std::map<std::string, KernelPci> kernel;
  // Whether GPUDirect RDMA can work on the node (topology::ReadGpuDirect(env).Available()),
  // read for each publication; nullopt: not known, the attribute is left out.
  std::optional<bool> gpudirect_rdma;
  // Whether the control plane keeps device taints (DRADeviceTaints). When it does not (the
  // publisher saw the server drop them), an unusable HCA is left out instead: no device, rather
  // than an untainted one the scheduler would allocate and Prepare would refuse.
  bool taints = true;
  // Whether the control plane accepts the taint effect None (Kubernetes 1.35 and later). When it
  // does not (the publisher saw the server refuse it), a taint that only informs (dra/taints.h)
  // is left out: the HCA is offered untainted, as the scheduler would treat it anyway.
  bool taint_effect_none = true;
};

// The device name of an HCA: "hca-" and its PCI address with ':' and '.' as '-'
// ("0000:1a:00.0" -> "hca-0000-1a-00-0"). A DNS label, stable across renames of the kernel
// device (mlx5_0 -> mlx5_bond_0) and reboots, as long as the card stays in its slot.
std::string DeviceName(const topology::Hca& hca);
// The same for a PCI address.
std::string DeviceNameOfPci(absl::string_view pci);

// The index in topo.hcas() of the HCA whose DeviceName is `device_name`, or -1 (a name of
// another node, or of an HCA that has gone). O(number of HCAs).
int FindHca(const topology::Topology& topo, std::string_view device_name);

// InvalidArgument (saying why) unless `name` can be a driver name: a lower-case DNS subdomain of
// at most 63 characters, as spec.driver, an attribute's domain and a taint key's prefix must be.
absl::Status ValidateDriverName(std::string_view name);
// InvalidArgument unless `name` can be a Node's name (a lower-case DNS subdomain, at most 253).
absl::Status ValidateNodeName(std::string_view name);

// The taint key that marks an unhealthy HCA: "<driver>/unhealthy".
std::string UnhealthyTaintKey(std::string_view driver_name);
// The taint key that marks a degraded HCA (early-warning health): "<driver>/degraded".
std::string DegradedTaintKey(std::string_view driver_name);

// One resource.k8s.io/v1 Device per HCA of `node.topology`, in PCI order, named DeviceName(hca).
//
// Attributes (<driver> = opts.driver_name; an attribute whose value is unknown is left out, never
// published empty, so that matchAttribute does not pair two devices on "unknown"):
//   resource.kubernetes.io/pcieRoot  string  root complex, "pci0000:15" (see KernelPci)
//   resource.kubernetes.io/pciBusID  string  "0000:1a:00.0"
//   resource.kubernetes.io/numaNode  int     the kernel's numa_node; left out when -1
//     These three are the standard attributes, spelled as deviceattribute's helpers spell them;
//     all three are left out for an address the helpers reject (a 5-digit VMD domain).
//   <driver>/hcaName         string  the kernel's RDMA device name, "mlx5_0" (may change on
//                                    reboot or bonding; the device name does not)
//   <driver>/pcieSwitch      string  the upstream port of the nearest PCIe switch above the HCA,
//                                    "0000:17:00.0" (PciPlacement::Switch()); left out when none.
//                                    matchAttribute on it asks for HCAs under one switch
//                                    (nvidia-smi's PIX between them).
//   <driver>/pcieTopSwitch   string  the upstream port of the outermost switch (the one below
//                                    the root port); equals pcieSwitch under one level of
//                                    switches; left out when none. matchAttribute on it asks for
//                                    HCAs below one top-level switch (PIX or PXB, never through
//                                    the root complex) in two-level trees (DGX-2-like).
//   <driver>/linkLayer       string  the first port's link layer: "InfiniBand" or "Ethernet"
//   <driver>/rateGbps        int     the first port's rate in whole Gb/s ("400 Gb/sec (4X NDR)"
//                                    -> 400; 1X SDR's 2.5 -> 2): ports of one HCA share a width
//                                    and speed, and CEL compares ints
//   <driver>/uverbs          string  "uverbs0" (a boot-time number; informational)
//   <driver>/allPortsActive  bool    at least one port and every port ACTIVE
//   <driver>/mode            string  "exclusive" or "shared"
//   <driver>/gpuDirectRDMA   bool    GPUDirect RDMA can work on the node (nvidia-peermem or
//                                    dma-buf; topology/gpudirect.h); left out when not known.
//                                    A claim that needs it selects
//                                    device.attributes["<driver>"].gpuDirectRDMA
//   <driver>/pciVendorID     string  the PCI vendor ID, 4 hex digits without 0x: "15b3"
//   <driver>/pciDeviceID     string  the PCI device ID: "1021" (ConnectX-7), "101e" (its VF)
//   <driver>/driver          string  the bound kernel driver: "mlx5_core"
//   <driver>/netdevs         string  the PCI function's netdevs, sorted, comma-separated:
//                                    "ens3f0np0"; left out when it has none
//   <driver>/firmwareVersion string  the HCA's fw_ver: "28.39.1002"
//   <driver>/nodeGUID        string  the HCA's node_guid: "b8ce:f603:00a1:b2c4"
//   <driver>/virtualFunction bool    an SR-IOV VF (it has a physfn); VFs are published like PFs,
//                                    so a DeviceClass that wants PFs alone selects
//                                    !device.attributes["<driver>"].virtualFunction
//   <driver>/physicalFunction string a VF's PF, "0000:1a:00.0"; left out on a PF
//     These identity attributes come from sysfs (topology::Hca); from an XML alone, driver,
//     firmwareVersion and physicalFunction are not known and left out.
// A string longer than the API's 64 characters is left out rather than make the slice invalid.
// A device carries at most 20 attributes (3 standard, 17 of our own) and, in shared mode, 2
// capacities: the API allows 32 attributes and capacities per device.
//
// Health: an HCA in a state of dra/taints.h's table (TaintedStateOf) carries that state's taint
// (TaintOf), as {key, value, effect}: an unusable one (node.Verdict) "<driver>/unhealthy" with
// effect NoSchedule and the value of its state (PortInit, PortNotActive, NoPortState,
// NoUverbsDevice, DeviceNodeMissing, DriverNotBound, ScanFailed, Flapping, Unusable); a usable one
// the early-warning rule finds degraded "<driver>/degraded" with effect None and the value
// SymbolErrors or LinkDowned. With opts.taints false, an unusable HCA is left out (no device)
// and a degraded one offered untainted; with opts.taint_effect_none false, a degraded one is
// offered untainted. A healthy HCA has no taint: the output depends only on the input.
//
// Shared mode sets allowMultipleAllocations: true on every device and gives it two consumable
// capacities (DRAConsumableCapacity, beta and on by default since 1.36), each with a request
// policy the scheduler applies to every claim it allocates the device to:
// Quantities are written as the API server writes them back ("1k" for 1000).
//   pods           value opts.shared_units; default 1, validRange {min 1, step 1}: a claim
//                  that asks nothing consumes 1, so at most shared_units claims share the HCA
//   bandwidthGbps  value the first port's rate in whole Gb/s (as rateGbps); default 0,
//                  validRange {min 0, step 1}: a claim consumes what it asks (rounded up to a
//                  whole Gb/s), nothing when it asks nothing. Left out when the rate is not
//                  known or 0 (no claim that asks bandwidth gets such an HCA).
// A step is left out where one step from min would exceed the value (shared_units 1), which
// the API refuses. Bandwidth is accounting for the scheduler, not enforced on the wire. The
// allocator gives each result a shareID and its consumedCapacity. Exclusive mode: no capacity.
// Taints apply to shared devices as to any.
std::vector<nlohmann::json> BuildDevices(const node::View& node, const DeviceOptions& opts);

}  // namespace rdp::dra
