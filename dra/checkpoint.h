#pragma once

// The driver's record of prepared claims, in a JSON file in its plugin directory
// (<kubelet-dir>/plugins/<driver>/checkpoint.json), so that a restarted plugin answers
// NodePrepareResources for a claim it prepared before without the API server, and
// NodeUnprepareResources knows what to remove.
//
// File format (version 2):
//   {"version": 2, "claims": {"<uid>": {"namespace": ..., "name": ...,
//     "devices": [{"request": ..., "pool": ..., "device": ..., "shareID": ...,
//                  "consumedCapacity": {"<capacity>": "<quantity>", ...}, "adminAccess": true}],
//     "common": {"<request>": ["<device>", ...]}, "podEnv": {"<request>": ["<NAME>", ...]},
//     "layout": "claim", "preparedAt": "<RFC 3339 UTC>", "podClaimName": ...}}}
// "shareID" and "consumedCapacity" are the allocation's (AllocatedDevice; absent: none).
// "adminAccess": true marks a device allocated for admin access (AllocatedDevice::admin_access;
// absent: an ordinary one, which is also how a version that does not know the key reads it).
// "common" lists, per request whose CDI device sets the common variables, the devices they name
// (dra/consumers.h); "podEnv", per request, the variables the pod specs of its containers set,
// which those common variables leave out (absent in files written before it: none);
// "layout": "claim" marks a claim prepared with one CDI device per claim. A version 1 file
// (before per-request CDI devices) is read as such claims. "preparedAt": when the kubelet last
// had the claim prepared (absent in files written before it: the file's modification time, a
// bound no claim of it was prepared after: Written()). "podClaimName": the pod's name for a claim
// made from a template (absent: none, or a file written before it).

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dra/model.h"

namespace rdp::dra {

inline constexpr char kCheckpointFile[] = "checkpoint.json";

struct PreparedClaim {
  ClaimRef ref;
  std::vector<AllocatedDevice> devices;  // the claim's results for this driver, in order
  // By base request: the devices the common variables of its CDI device name; a request that is
  // not here sets none.
  std::map<std::string, std::vector<std::string>> common;
  // Prepared by a version with one CDI device per claim (a version 1 checkpoint): the kubelet
  // holds that device's ID, so the claim is answered and its spec re-written that way until it is
  // unprepared.
  bool legacy = false;
  // By base request: the variables the pod specs of the containers holding it set
  // (PodSetVariables); its CDI device's common variables leave them out.
  std::map<std::string, std::set<std::string>> pod_env;
  // When the last NodePrepareResources answered for it (set just before its checkpoint write;
  // InfinitePast when not known): a claim the kubelet's own checkpoint does not list is unprepared at start only when
  // that checkpoint was written after this (Driver::Start).
  absl::Time prepared_at = absl::InfinitePast();
  // The pod's name for a claim made from a template (ClaimAllocation::pod_claim_name): where its
  // metadata files appear in the container (dra/metadata.h).
  std::optional<std::string> pod_claim_name;
  bool operator==(const PreparedClaim& o) const {
    return ref.ns == o.ref.ns && ref.uid == o.ref.uid && ref.name == o.ref.name &&
           devices == o.devices && common == o.common && pod_env == o.pod_env &&
           legacy == o.legacy && prepared_at == o.prepared_at &&
           pod_claim_name == o.pod_claim_name;
  }
};

using PreparedClaims = std::map<std::string, PreparedClaim>;  // by claim UID

// Not thread-safe: the driver serialises Load and Save.
class Checkpoint {
 public:
  explicit Checkpoint(std::string path);

  // The claims in the file; none when there is no file. A file that is not a valid checkpoint
  // (not JSON, another version, an entry without uid/namespace/name/devices...) is renamed aside
  // to "<path>.corrupt-<unix-nanos>" with an error log naming both paths, and what could be
  // read from it (each valid entry) is returned: nothing is silently lost, and the plugin starts.
  // Errors only when the file cannot be read or renamed.
  // First removes the temporary files of a Save that a crash interrupted (a process that holds
  // the plugin directory's lock is the only writer).
  absl::StatusOr<PreparedClaims> Load();

  // Replaces the file with `claims`, atomically and durably (fsync of the file and directory);
  // creates the directory when missing.
  absl::Status Save(const PreparedClaims& claims);

  const std::string& path() const { return path_; }
  // The modification time of the file the last Load read (InfinitePast when there was none):
  // none of its claims was prepared after it.
  absl::Time Written() const { return written_; }

 private:
  const std::string path_;
  absl::Time written_ = absl::InfinitePast();
};

}  // namespace rdp::dra
