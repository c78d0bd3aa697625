#pragma once

// Which of our HCA sets each container holds, and what the variables common to all of a
// container's sets may say (docs/dra.md, "What a container gets"). Pure: no I/O.
//
// The kubelet hands CDI devices out per request (a claim's request, or the request of the
// scheduler-made claim an extended resource maps a container to): a container that uses several
// of our (claim, request) pairs gets several of our CDI devices, and a variable that two of them
// set keeps only the value of the last (CDI cannot merge). So each pair's device sets its own
// variables under names no other pair uses, and the common ones (NCCL_IB_HCA, RDMA_HCA_NAMES,
// ...) only when they can name every HCA of every container that receives them:
// CommonDevices says when that is.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dra/model.h"

namespace rdp::dra {

// One of our (claim, request) pairs: the unit the kubelet hands to a container.
struct RequestKey {
  std::string claim_uid;
  std::string request;  // a base request name (no subrequest suffix)
  bool operator<(const RequestKey& o) const {
    return claim_uid != o.claim_uid ? claim_uid < o.claim_uid : request < o.request;
  }
  bool operator==(const RequestKey& o) const {
    return claim_uid == o.claim_uid && request == o.request;
  }
};

// A claim as CommonDevices needs it: its uid, and the devices of ours each of its requests got.
// A claim with no result of ours has no requests.
struct ClaimDevices {
  std::string uid;
  std::map<std::string, std::vector<std::string>> requests;  // base request -> device names
};

// The claims the pods' containers name, by "<namespace>/<name>"; nullopt: the claim could not be
// read (its devices are not known).
using ClaimTable = std::map<std::string, std::optional<ClaimDevices>>;

// The devices the common variables of each pair's CDI device may name. For every pair that some
// container of `pods` holds: the sorted union of the devices of all pairs of ours that container
// holds, when every container holding the pair holds the same devices and all of them are known;
// nullopt otherwise (two holders with different sets, or a holder using a claim that is not in
// `claims` or could not be read): then no value is right for every container that gets the pair,
// and its CDI device sets no common variable. Pairs no container holds are not in the result.
// A use of request "" holds every request of the claim.
using Commons = std::map<RequestKey, std::optional<std::vector<std::string>>>;
Commons CommonDevices(const std::vector<PodClaims>& pods, const ClaimTable& claims);

// The variables the pod specs set (PodClaims::Container::env) of the containers of `pods` that
// hold each pair, by pair: the names its CDI device leaves out of the common variables, so that
// the pod spec's value stays (the runtime applies CDI's env after the pod spec's; device-plugin
// Allocate's env comes before it, so there the pod spec wins by itself). Every pair that some
// container holds is in the result, with no names when none sets any.
std::map<RequestKey, std::set<std::string>> PodSetVariables(const std::vector<PodClaims>& pods,
                                                            const ClaimTable& claims);

}  // namespace rdp::dra
