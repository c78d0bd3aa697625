#pragma once

// Builds a Topology snapshot from sysfs and hwloc. Every input root is configurable so that
// tests never read this machine's hardware.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/env.h"
#include "topology/topology.h"

namespace rdp::topology {

struct DiscoveryOptions {
  // Root under which /sys lives. Empty means "not given": the live "/" is used for HCAs unless
  // topology_xml is set, in which case HCAs come from the XML's OpenFabrics OS devices.
  std::string sysfs_root;
  // Root under which /dev lives ("/" by default).
  std::string dev_root = "/";

  // The Env on the filesystem under these roots.
  NodeRoots Roots() const;
  // hwloc XML export to take the PCI tree from. Empty: hwloc discovers the machine, under
  // HWLOC_FSROOT=<sysfs_root> when sysfs_root is set and is not "/".
  std::string topology_xml;
  // A PCI function is a GPU when its class is 0x0302 (3D controller: every datacenter NVIDIA
  // GPU) and listed here, whatever its vendor, or when its class is listed here and its vendor
  // is in gpu_vendors. This keeps a server's onboard BMC VGA (ASPEED 1a03, Matrox 102b) out.
  std::vector<std::uint32_t> gpu_classes = {0x0302, 0x0300, 0x0380, 0x1200};
  std::vector<std::uint32_t> gpu_vendors = {0x10de, 0x1002};
  // Never GPUs even with a GPU vendor's ID and class: the ATI ES1000 BMC VGA (1002:515e).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> not_gpus = {{0x1002, 0x515e}};
};

// What hwloc reads from the process environment for these options: for a gathered tree (sysfs_root
// set and not "/", no topology_xml) HWLOC_FSROOT=sysfs_root, else nothing (the live machine, or
// the XML). Writes the environment, which is unsafe while other threads run: call it once,
// before the process starts threads. NotFound naming the root when it has no sys/ directory.
// Discover never writes the environment; for a gathered tree other than the one set here it
// fails with FailedPrecondition.
absl::Status PrepareHwloc(const DiscoveryOptions& options);

struct HwlocTree;

// Discovers the node again and again (at start, on hotplug) with the same options. An XML is
// read, checked and loaded at the first Discover only: it does not change under a running
// process, and loading it is the expensive and hazardous part (hwloc_tree.cc). Thread-safe.
class Discoverer {
 public:
  // Reads sysfs and /dev through `env` (default: the filesystem under options' roots); hwloc
  // reads what PrepareHwloc pointed it at.
  explicit Discoverer(DiscoveryOptions options, std::shared_ptr<Env> env = nullptr);
  ~Discoverer();
  Discoverer(const Discoverer&) = delete;
  Discoverer& operator=(const Discoverer&) = delete;

  // HCAs come from sysfs (ReadSysfsHcas) placed by hwloc's tree, an SR-IOV VF where its PF is
  // (NUMA node, root, bridges; its own address); with an XML and no sysfs_root, from the XML's
  // OpenFabrics devices (vendor, device and node_guid from the XML; driver, firmware_version,
  // netdev_link_type and physfn unknown: an export does not say which function is a VF).
  // Errors (absl::InvalidArgument / NotFound naming the path) when a root is missing or
  // unreadable, the XML is malformed or absent, or hwloc fails to load. A single broken device
  // (dangling symlink, unreadable port) is skipped with a warning instead. Logs every HCA found
  // as
  //   discovered RDMA device: mlx5_0 (PCI=0000:1a:00.0, NUMA=0, uverbs=uverbs0, pcieRoot=pci0000:15)
  absl::StatusOr<TopologyPtr> Discover();

 private:
  friend absl::StatusOr<TopologyPtr> Discover(const DiscoveryOptions& options);

  // The tree to discover from: the XML's as loaded once (shared with the cache: read only), or
  // one loaded for this call alone (the live machine, or a one-shot Discoverer's XML), which
  // Discover may consume.
  absl::StatusOr<std::shared_ptr<HwlocTree>> Tree();

  const DiscoveryOptions options_;
  const std::shared_ptr<Env> env_;
  bool one_shot_ = false;  // set by Discover(options): the XML's tree is not kept
  absl::Mutex mu_;
  std::shared_ptr<HwlocTree> xml_tree_ ABSL_GUARDED_BY(mu_);  // once loaded; never modified
};

// One discovery: Discoverer(options).Discover().
absl::StatusOr<TopologyPtr> Discover(const DiscoveryOptions& options);

// HCAs from sysfs alone (no hwloc), read through `env`: /sys/class/infiniband and friends, and
// their device nodes under /dev/infiniband (Hca::char_devices holds those node paths).
// Placement comes from the resolved sysfs path (pcie_root; bridges unknown) and numa_node.
// Identity: vendor and device from the PCI function's vendor/device ("0x15b3" -> "15b3"), driver
// and physfn from the basenames of its driver and physfn links, fw_ver and node_guid of the RDMA
// device, netdev_link_type from net/<netdevs[0]>/type; a file that cannot be read leaves its
// field "" and never skips the HCA.
// NotFound naming the path when /sys is not there; an empty list when the node has no RDMA
// devices. Broken devices are skipped with a warning. Never throws.
absl::StatusOr<std::vector<Hca>> ReadSysfsHcas(Env& env);
// The same on the filesystem: sys/ under sysfs_root, dev/ under dev_root.
absl::StatusOr<std::vector<Hca>> ReadSysfsHcas(const std::string& sysfs_root,
                                                const std::string& dev_root);

// What must match between a health scan (ReadSysfsHcas) and a snapshot's HCAs for the snapshot to
// stay current: each HCA's address, name, uverbs device, device nodes and port states, in any
// order. A health poll runs a full discovery only when the fingerprints differ.
std::string HcaFingerprint(const std::vector<Hca>& hcas);

// The snapshot to go on with when a health scan saw the HCAs change and the discovery that
// should follow failed: the scanned HCAs (ReadSysfsHcas) placed as `last` placed those it had
// (hwloc's PCIe path, the CPU NUMA node of their locality), a new VF where `last` placed its PF,
// another new one as sysfs places it, with
// the kernel's numa_node unless `last` knows that node has no CPUs (then unknown); `last`'s NUMA
// nodes (those without CPUs too) and GPUs. Without it, the raw scan would put an HCA on a node of
// GPU memory and forget every PCIe path until a discovery succeeds.
TopologyPtr WithScannedHcas(const Topology& last, std::vector<Hca> scanned);

// Parses "0x0302,0x0300" / "10de,1002" style lists for the --gpu-classes / --gpu-vendors flags.
absl::StatusOr<std::vector<std::uint32_t>> ParseHexList(const std::string& text);

}  // namespace rdp::topology
