#pragma once

// CDI (Container Device Interface) specs for prepared claims: one spec file per claim, kind
// "<driver>/hca", one device per request of the claim ("<claim-uid>-<request>"): the kubelet
// hands CDI devices to containers per request, so a container gets exactly the HCAs of the
// requests it uses. Each device's containerEdits are what device-plugin Allocate gives for its
// HCAs (hca::BuildAllocation: the same device nodes), its variables under names of its own
// ("<KEY>_<suffix>", OwnVariableSuffix), and the common variables (NCCL_IB_HCA, RDMA_HCA_NAMES,
// ...) only when the driver knows that they name every HCA of every container that gets the
// device (dra/consumers.h): CDI keeps one value of a variable that two devices set, so a
// container holding several of our requests would otherwise be told about one of them.
//
// cdiVersion is kCdiVersion, "0.5.0": what tags.cncf.io/container-device-interface (v1.1.x,
// specs-go MinimumRequiredVersion) requires for what we write. We use nothing newer than 0.3.0
// (kind, devices, containerEdits.env/deviceNodes with type, major, minor, permissions) except a
// device name that starts with a digit, which a claim UID (a UUID) often does, and that needs
// 0.5.0. A fixed version for every claim, so that a spec never depends on the UID's first
// character. Every CDI library since v0.5.x parses it: containerd 1.7 and 2.x, CRI-O.

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/env.h"
#include "nlohmann/json.hpp"
#include "hca/hca.h"

namespace rdp::dra {

inline constexpr char kCdiVersion[] = "0.5.0";
inline constexpr char kCdiClass[] = "hca";
inline constexpr char kDefaultCdiRoot[] = "/var/run/cdi";

// "<claim-uid>-<request>": the CDI device of one request of a claim.
std::string CdiDeviceName(const std::string& claim_uid, const std::string& request);
// "<driver>/hca=<claim-uid>-<request>": what NodePrepareResources returns for the request's
// devices.
std::string CdiDeviceId(const std::string& driver, const std::string& claim_uid,
                        const std::string& request);
// "<claim-uid>_<request>": the CDI device that mounts the request's metadata file (dra/metadata.h).
// Never a request's device name: a uid is 36 characters, then '-' there, '_' here.
std::string MetadataCdiDeviceName(const std::string& claim_uid, const std::string& request);
// "<driver>/hca=<claim-uid>_<request>": answered beside the request's CdiDeviceId.
std::string MetadataCdiDeviceId(const std::string& driver, const std::string& claim_uid,
                                const std::string& request);
// "<driver>/hca=<claim-uid>": the one CDI device of a claim prepared by a version before
// per-request devices (checkpoint version 1); such claims keep it until unprepared.
std::string LegacyCdiDeviceId(const std::string& driver, const std::string& claim_uid);
// "<32 hex digits of the claim uid>_<request with '-' as '_'>": the suffix of a request's own
// variables (RDMA_HCA_NAMES_0f3b6c2e4d1a4c559b7e2a1d3c4b5e6f_hca). Unique per (claim, request):
// a uid is a UUID (ValidateClaimUid) and a request a DNS label, which has no '_'.
std::string OwnVariableSuffix(const std::string& claim_uid, const std::string& request);
// OK for a canonical UUID (8-4-4-4-12 hex digits, either case), as the API server gives every
// object; InvalidArgument otherwise. A uid becomes part of file and device names.
absl::Status ValidateClaimUid(std::string_view uid);
// "<driver>-hca_<claim-uid>.json": the spec's file name in the CDI directory.
std::string CdiSpecFileName(const std::string& driver, const std::string& claim_uid);

struct DeviceNumber {
  int major = 0;
  int minor = 0;
};
// The major:minor of a device node under /dev/infiniband, from the "dev" attribute of its sysfs
// class entry (uverbsN: /sys/class/infiniband_verbs/uverbsN/dev; umadN, issmN:
// /sys/class/infiniband_mad/<name>/dev; rdma_cm: /sys/class/misc/rdma_cm/dev), read through env.
// nullopt when unknown (another path, no such file, not "<int>:<int>").
std::optional<DeviceNumber> ReadDeviceNumber(Env& env, const std::string& dev_path);

// One request's CDI device.
struct CdiRequest {
  std::string request;           // base request name
  hca::ContainerAllocation own;  // the request's HCAs: its device nodes and, suffixed, its env
  // The common variables, under their plain names; nullopt: none (dra/consumers.h).
  std::optional<std::map<std::string, std::string>> common;
  // With common: the host file that describes the same HCAs (hca::AllocationFileName), mounted
  // read-only at hca::kAllocationFile; nullopt: no mount.
  std::optional<std::string> allocation_file;
  // The request's metadata file: host path and path in the container; nullopt: none.
  struct Mount {
    std::string host_path;
    std::string container_path;
  };
  std::optional<Mount> metadata;
};

// The spec for one claim: a device CdiDeviceName(uid, r.request) per request with its device
// nodes (type "c", permissions as given, major and minor when ReadDeviceNumber knows them: then
// the runtime need not stat the host path; else it does) and env ("KEY=VALUE", sorted by key):
// each of own.envs as "<KEY>_<OwnVariableSuffix>", and each of common's as is. A request with
// metadata has a second device, MetadataCdiDeviceName(uid, r.request), that only bind-mounts
// the file read-only (a device of its own, as the kubelet-plugin helper's).
nlohmann::json BuildCdiSpec(const std::string& driver, const std::string& claim_uid,
                            const std::vector<CdiRequest>& requests, Env& env);
// The spec of a claim prepared before per-request devices: one device "<claim-uid>" with
// allocation's device nodes and env under their plain names.
nlohmann::json BuildLegacyCdiSpec(const std::string& driver, const std::string& claim_uid,
                                  const hca::ContainerAllocation& allocation, Env& env);

// The CDI directory: writes and removes claims' spec files. Thread-safe (one file per claim;
// the caller serialises calls for one claim).
class CdiStore {
 public:
  CdiStore(std::string dir, std::string driver);

  // Writes the claim's spec atomically (mode 0644), creating the directory if needed.
  absl::Status Write(const std::string& claim_uid, const nlohmann::json& spec) const;
  // Removes the claim's spec file; one that is not there is OK.
  absl::Status Remove(const std::string& claim_uid) const;
  bool Exists(const std::string& claim_uid) const;
  // The claim's spec as the file holds it: NotFound when there is none, DataLoss when it is not
  // JSON, Internal when it cannot be read.
  absl::StatusOr<nlohmann::json> Read(const std::string& claim_uid) const;
  // The claim UIDs of this driver's spec files in the directory (none when it does not exist),
  // sorted. Internal when it cannot be listed.
  absl::StatusOr<std::vector<std::string>> ListClaims() const;
  // Removes the temporary files of this driver's spec writes that a crash interrupted; returns
  // their paths. Only while no Write runs (at start).
  absl::StatusOr<std::vector<std::string>> RemoveTemporaryFiles() const;
  std::string PathOf(const std::string& claim_uid) const;
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  const std::string driver_;
};

}  // namespace rdp::dra
