#pragma once

// Standard device metadata (KEP-5304): for every prepared request of a claim, a file that tells
// the containers holding it which devices they got, as k8s.io/dynamic-resource-allocation's
// kubelet-plugin helper writes it (kubeletplugin/metadata.go, api/metadata), so that a workload
// reads our HCAs the way it reads any DRA driver's devices.
//
// On the host: <plugin dir>/dra-device-metadata/<claim uid>/<request>/metadata.json, <request> the
// base request name (no subrequest). By uid, not by "<namespace>_<name>" as the upstream helper
// keeps them: a name may be 253 characters, which with its namespace exceeds a file name's 255,
// and a claim re-created under its name while the old one is still prepared has files of its own.
// Only the path in the container is the consumers' contract. In the container, mounted read-only by a CDI
// device of its own (dra/cdi.h, CdiRequest::metadata):
//   /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json
// or, for a claim made from a ResourceClaimTemplate (the claim carries the annotation
// resource.kubernetes.io/pod-claim-name),
//   /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<podClaimName>/<request>/<driver>-metadata.json
//
// The file is a JSON stream: the same DeviceMetadata object once per version, newest first
// (metadata.resource.k8s.io/v1beta1, then v1alpha1), each pretty-printed and ended by a newline:
//   {"apiVersion": "metadata.resource.k8s.io/v1beta1", "kind": "DeviceMetadata",
//    "metadata": {"name": <claim>, "namespace": ..., "uid": ..., "generation": 1},
//    "podClaimName": <set for a template's claim>,
//    "requests": [{"name": <results[].request, "hca/sub" for a subrequest>,
//                  "devices": [{"driver", "pool", "name", "attributes", "networkData"}]}]}
// A reader takes the first object whose apiVersion it knows.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dra/model.h"
#include "nlohmann/json.hpp"

namespace rdp::dra {

inline constexpr char kMetadataSubDir[] = "dra-device-metadata";
inline constexpr char kMetadataContainerDir[] = "/var/run/kubernetes.io/dra-device-attributes";
// The versions written, newest first.
inline constexpr const char* kMetadataApiVersions[] = {"metadata.resource.k8s.io/v1beta1",
                                                       "metadata.resource.k8s.io/v1alpha1"};
// A device's attributes in the file (api/metadata Device.Attributes, +k8s:maxProperties=32).
inline constexpr std::size_t kMaxMetadataAttributes = 32;

// Where the container finds the request's file: under resourceclaimtemplates/<pod_claim_name>
// when the claim was made from a template, else under resourceclaims/<claim name>.
std::string MetadataContainerPath(const std::string& driver, const std::string& claim_name,
                                  const std::optional<std::string>& pod_claim_name,
                                  const std::string& base_request);

// One device of a request, as the file lists it.
struct MetadataDevice {
  std::string pool;
  std::string name;
  // The device's attributes as our ResourceSlices publish them (BuildDevices' "attributes":
  // {"<qualified name>": {"string"|"int"|"bool"|"version": value}}); at most
  // kMaxMetadataAttributes are kept, the first by name.
  nlohmann::json attributes;
  // resource.k8s.io/v1 NetworkDeviceData ({"interfaceName", "hardwareAddress"}); null: none.
  nlohmann::json network_data;
};

// The request's DeviceMetadata object in each version of kMetadataApiVersions, in that order.
// `request` is the allocation's results[].request, a subrequest's "<request>/<subrequest>" kept.
std::vector<nlohmann::json> BuildDeviceMetadata(const std::string& driver, const ClaimRef& claim,
                                                const std::optional<std::string>& pod_claim_name,
                                                const std::string& request,
                                                const std::vector<MetadataDevice>& devices,
                                                int64_t generation);
// The file's text: each object pretty-printed (2 spaces), followed by a newline.
std::string MetadataStream(const std::vector<nlohmann::json>& objects);
// The objects of a stream, in order; DataLoss when the text is not a sequence of JSON objects.
absl::StatusOr<std::vector<nlohmann::json>> ParseMetadataStream(const std::string& text);

// The metadata files of prepared claims under one directory (<plugin dir>/dra-device-metadata),
// by claim uid (a UUID: ValidateClaimUid). Thread-safe for different claims; the caller
// serialises calls for one claim.
class MetadataStore {
 public:
  explicit MetadataStore(std::string dir);

  // <dir>/<uid>/<base_request>/metadata.json
  std::string PathOf(const std::string& claim_uid, const std::string& base_request) const;
  // <dir>/<uid>: every file of the claim.
  std::string ClaimDir(const std::string& claim_uid) const;
  // Replaces the request's file with `content` atomically (mode 0644), creating its directories.
  // Internal naming the path on failure.
  absl::Status Write(const std::string& claim_uid, const std::string& base_request,
                     const std::string& content) const;
  // The file's text; NotFound when there is none, Internal when it cannot be read.
  absl::StatusOr<std::string> Read(const std::string& claim_uid,
                                   const std::string& base_request) const;
  // Removes every file of the claim; none is OK. Internal naming the path on failure.
  absl::Status RemoveClaim(const std::string& claim_uid) const;
  // The uids of the claims that have a directory here, sorted; none when `dir` does not exist.
  // Internal when it cannot be listed.
  absl::StatusOr<std::vector<std::string>> ListClaims() const;
  // Removes the temporary files of writes a crash interrupted in the claim's request
  // directories; returns their paths. Only while no Write runs (at start).
  absl::StatusOr<std::vector<std::string>> RemoveTemporaryFiles(
      const std::string& claim_uid) const;
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
};

}  // namespace rdp::dra
