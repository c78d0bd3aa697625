#pragma once

// The rule of `rdma-device-plugin nri`: which containers get a higher RLIMIT_MEMLOCK, and what.
// Registering memory with an HCA (ibv_reg_mr) pins it, and the kernel counts pinned pages
// against RLIMIT_MEMLOCK; the runtime's default (often 64 KiB or 8 MiB) makes NCCL fall back to
// TCP sockets. CAP_IPC_LOCK does not help a non-root process, and neither the device-plugin API
// nor CDI can set an rlimit: an NRI plugin can. Pure: no I/O, no protobuf.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rdp::nri {

// RLIM_INFINITY as the OCI runtime spec (and so NRI) carries it.
inline constexpr std::uint64_t kUnlimited = ~std::uint64_t{0};

struct Rlimit {
  std::uint64_t soft = 0;
  std::uint64_t hard = 0;
  bool operator==(const Rlimit& o) const { return soft == o.soft && hard == o.hard; }
};

// A container as the runtime is about to create it, as far as the rule looks at it.
struct ContainerView {
  std::string id;
  std::string name;
  std::string pod;            // the pod's name
  std::string pod_namespace;  // the pod's namespace
  std::vector<std::string> device_paths;  // its Linux device nodes, in the container
  std::optional<Rlimit> memlock;          // RLIMIT_MEMLOCK in its spec, if any
};

// "unlimited", a number of bytes ("8388608"), or one with a binary suffix ("64Ki", "8Mi", "64Gi",
// "1Ti"). InvalidArgument naming --memlock and the text otherwise (0, negative, overflow).
absl::StatusOr<std::uint64_t> ParseMemlock(std::string_view text);
// "unlimited" for kUnlimited, else bytes in the largest binary unit that divides them ("64Gi").
std::string FormatMemlock(std::uint64_t bytes);

// Whether `path` (in the container) is a verbs device node, /dev/infiniband/uverbsN: what the
// device plugin (Allocate's DeviceSpecs) and the DRA driver (its CDI spec's deviceNodes) give
// every container that holds one of our HCAs, and what ibv_reg_mr goes through.
bool IsVerbsDevice(std::string_view path);

struct MemlockDecision {
  std::vector<std::string> verbs_devices;  // the container's verbs device nodes
  // The RLIMIT_MEMLOCK to set: soft = the limit, hard = the larger of the limit and the hard
  // limit the container already has. nullopt: leave it alone (no verbs device, or its own limits
  // are already at least `limit`).
  std::optional<Rlimit> set;
};

// The rule: a container with at least one verbs device gets RLIMIT_MEMLOCK raised to `limit`
// (never lowered); any other container is left as it is.
MemlockDecision DecideMemlock(const ContainerView& container, std::uint64_t limit);

}  // namespace rdp::nri
