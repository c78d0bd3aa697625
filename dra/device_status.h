#pragma once

// What a claim's status.devices says about a device of ours (resource.k8s.io/v1
// AllocatedDeviceStatus; DRAResourceClaimDeviceStatus, GA in 1.37), so that
// `kubectl get resourceclaim -o yaml` tells what a pod got:
//   {"driver": <driver>, "pool": <node>, "device": "hca-0000-1a-00-0",
//    "data": {"hcaName": "mlx5_0", "uverbs": "/dev/infiniband/uverbs0"},
//    "networkData": {"interfaceName": "ens1f0np0", "hardwareAddress": "b8:3f:d2:..."}}
// data.uverbs is left out when the uverbs device is not known; networkData is left out for an
// HCA without a netdev (InfiniBand without IPoIB), and names the first of its netdevs (sorted);
// hardwareAddress is left out when the netdev's address cannot be read.
// A device with a shareID (shared mode) gets it in its entry too (the Driver adds it); the
// Driver hands the entries to dra/claim_status.h after a prepare.

#include <string>

#include "base/env.h"
#include "nlohmann/json.hpp"
#include "topology/topology.h"

namespace rdp::dra {

// `env` reads /sys/bus/pci/devices/<pci>/net/<netdev>/address under the node's roots.
nlohmann::json AllocatedDeviceStatus(const std::string& driver, const std::string& pool,
                                     const topology::Hca& hca, Env& env);

}  // namespace rdp::dra
