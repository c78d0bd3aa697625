#pragma once

// What the kubelet's DRA manager holds: its own checkpoint, <kubelet root dir>/dra_manager_state,
// read (never written) at the driver's start, so that claims the kubelet has forgotten lose their
// CDI spec and checkpoint entry (Driver::Start, docs/dra.md "Claims the kubelet forgot").
//
// The format kubelets 1.32 to 1.37 write (k8s.io/kubernetes pkg/kubelet/cm/dra/state, read for
// each of them): {"Data": "<JSON text>", "Checksum": <CRC-32 (IEEE) of Data's bytes>}, Data being
//   {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
//    "ClaimInfoStateList": [{"ClaimUID": ..., "ClaimName": ..., "Namespace": ...,
//      "PodUIDs": {...}, "DriverState": {"<driver>": {"Devices": [...]}}}, ...]}
// (ClaimInfoStateList is null when the kubelet holds no claim). The kubelet writes it atomically
// (a temporary file renamed over it). Kubelets before 1.32 wrote {"version": "v1", "entries": ...,
// "checksum": ...} with a checksum of Go's in-memory structure, which cannot be verified here:
// that format, like any other kind or apiVersion, is "a version we do not know".

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rdp::dra {

inline constexpr char kKubeletDraStateFile[] = "dra_manager_state";

// The kubelet's DRA checkpoint as far as one driver is concerned.
struct KubeletClaims {
  std::string path;
  absl::Time written;          // the file's modification time: the kubelet's last write
  std::set<std::string> uids;  // the claims whose DriverState names the driver
};

// Reads the kubelet's DRA checkpoint at `path` for `driver`. Errors, each naming the path:
// NotFound when there is no file; Internal when it cannot be read; DataLoss when it is not JSON
// of the expected shape or its checksum does not match its data; Unimplemented for a format,
// kind or apiVersion other than the one above.
absl::StatusOr<KubeletClaims> ReadKubeletClaims(const std::string& path, std::string_view driver);

// CRC-32 with the IEEE polynomial (Go's crc32.ChecksumIEEE, zlib's crc32): the kubelet's
// checksum of Data.
std::uint32_t Crc32Ieee(std::string_view data);

}  // namespace rdp::dra
