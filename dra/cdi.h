#pragma once

// CDI (Container Device Interface) specs for prepared claims: one spec file per claim, kind
// "<driver>/hca", one device named after the claim's UID whose containerEdits give a container
// exactly that claim's HCAs, as device-plugin Allocate does (hca::BuildAllocation: the same
// device nodes and env).
//
// cdiVersion is kCdiVersion, "0.5.0": what tags.cncf.io/container-device-interface (v1.1.x,
// specs-go MinimumRequiredVersion) requires for what we write. We use nothing newer than 0.3.0
// (kind, devices, containerEdits.env/deviceNodes with type, major, minor, permissions) except a
// device name that starts with a digit, which a claim UID (a UUID) often does, and that needs
// 0.5.0. A fixed version for every claim, so that a spec never depends on the UID's first
// character. Every CDI library since v0.5.x parses it: containerd 1.7 and 2.x, CRI-O.

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "base/env.h"
#include "nlohmann/json.hpp"
#include "hca/hca.h"

namespace rdp::dra {

inline constexpr char kCdiVersion[] = "0.5.0";
inline constexpr char kCdiClass[] = "hca";
inline constexpr char kDefaultCdiRoot[] = "/var/run/cdi";

// "<driver>/hca=<claim-uid>": what NodePrepareResources returns for each of the claim's devices.
std::string CdiDeviceId(const std::string& driver, const std::string& claim_uid);
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

// The spec for one claim: its one device "<claim-uid>" with allocation's device nodes (type "c",
// permissions as given, major and minor when ReadDeviceNumber knows them: then the runtime need
// not stat the host path; else it does) and env ("KEY=VALUE", sorted by key).
nlohmann::json BuildCdiSpec(const std::string& driver, const std::string& claim_uid,
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
  std::string PathOf(const std::string& claim_uid) const;
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  const std::string driver_;
};

}  // namespace rdp::dra
