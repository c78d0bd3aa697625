#pragma once

// The resources a node's HCAs are sold as: each a name the kubelet and the pods know
// ("rdma/hca", "rdma/storage") and a selector that says which HCAs are in it. Plain data, read
// from `serve --config` (resources/config.h) or made from --resource-name alone; both doors read
// the same definition.

#include <string>
#include <vector>

#include "topology/topology.h"

namespace rdp::resources {

// Whether a selector takes SR-IOV virtual functions (topology::Hca::IsVirtualFunction).
enum class VirtualFunctions { kExclude, kInclude, kOnly };

// Which HCAs a resource holds. Every key is optional: the values of one key are ORed, the keys
// are ANDed; an empty key does not constrain. With every key empty, the selector takes the
// node's physical functions (and bonds): VFs only where virtual_functions says so.
struct Selector {
  std::vector<std::string> vendors;        // PCI vendor IDs, hex without 0x: "15b3"
  std::vector<std::string> device_ids;     // PCI device IDs: "1021"
  std::vector<std::string> drivers;        // the bound driver: "mlx5_core"
  std::vector<std::string> link_layers;    // a port's link layer: "InfiniBand", "Ethernet"
  std::vector<std::string> hca_names;      // shell globs on the RDMA device name: "mlx5_*"
  std::vector<std::string> netdevs;        // shell globs on any of the function's netdevs
  std::vector<std::string> pci_addresses;  // "0000:1a:00.0" (any case; "1a:00.0" for any domain)
  std::vector<int> numa_nodes;
  VirtualFunctions virtual_functions = VirtualFunctions::kExclude;
  // The Mellanox shared plugin's keys, with its semantics: the exact name of the function's first
  // netdev (its `ifNames`, `devices`), and that netdev's netlink link type ("ether",
  // "infiniband"): a function without a netdev matches neither.
  std::vector<std::string> if_names;
  std::vector<std::string> link_types;

  bool Matches(const topology::Hca& hca) const;
};

struct Resource {
  std::string name = "rdma/hca";  // "<domain>/<name>", as the kubelet registers it
  Selector selector;
  // Shared mode: the units this resource advertises, each of which mounts all its HCAs.
  int shared_devices = 1000;
  // Shared whatever the node label says (the Mellanox shared plugin's resources are).
  bool always_shared = false;

  // The device plugin's socket in the kubelet's directory: "rdma-hca.sock" for "rdma/hca"; the
  // name's '/' and '.' become '-'.
  std::string SocketName() const;
  // What the resource's own container variables and allocation file are named by, when one
  // process serves several resources (docs/server.md): the name upper-cased, each character
  // other than a letter or digit made '_' ("RDMA_STORAGE" for "rdma/storage").
  std::string VariableSuffix() const;
};

// The HCAs of `hcas` that the resource selects, by index, in order.
std::vector<std::size_t> Select(const Selector& selector, const std::vector<topology::Hca>& hcas);

}  // namespace rdp::resources
