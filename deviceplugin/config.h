#pragma once

// The plugin's configuration: what `rdma-device-plugin serve` reads from its flags and
// environment. Plain data; Validate() checks it once at start.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hca/early_warning.h"
#include "hca/hca.h"
#include "resources/resources.h"
#include "topology/discovery.h"

namespace rdp::deviceplugin {

struct Config {
  hca::Mode mode = hca::Mode::kShared;
  std::string resource_name = "rdma/hca";
  int shared_devices = 1000;
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string socket_name = "rdma-hca.sock";
  // Empty turns the pod-resources client off (and with it mode-switch withholding and the GPU
  // context). Set, the plugin offers no HCA until a List on it has answered (fail closed).
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  // --sysfs-root, --dev-root, --topology-xml, GPU classes/vendors: see DiscoveryOptions.
  topology::DiscoveryOptions discovery;
  std::string proc_root = "/";
  // `nvidia-smi -L`'s output, read on each health poll: the NVIDIA GPU indexes and MIG device
  // UUIDs it lists (deviceplugin/nvidia_gpus.h). Empty: indexes in PCI address order, no MIG
  // UUIDs.
  std::string nvidia_gpu_list;
  absl::Duration health_interval = absl::Seconds(5);
  std::string node_name;
  std::string exclusive_label;  // set by the chart when the node's label chose exclusive mode
  std::vector<std::string> gpu_resources = {"nvidia.com/gpu", "amd.com/gpu"};
  // A container first seen holding GPUs (and none of our devices) this recently is taken to be
  // the one being admitted (docs/server.md, GPU context).
  absl::Duration admission_window = absl::Seconds(10);
  // --allocation-dir: a host directory (the same path in the plugin's container) where Allocate
  // writes the files it mounts at hca::kAllocationFile (hca::AllocationFileName); "" for none.
  std::string allocation_dir;
  // Early-warning health (hca/early_warning.h): --degraded-symbol-errors, --degraded-link-downed,
  // --degraded-window, --flap-count, --flap-window, --flap-stable.
  hca::EarlyWarningConfig early_warning;

  // Seams and tuning, not flags.
  absl::Duration register_backoff_min = absl::Milliseconds(100);
  absl::Duration register_backoff_max = absl::Seconds(5);
  absl::Duration register_timeout = absl::Seconds(1);
  // The deadline of one pod-resources List. Seconds, not milliseconds: a kubelet with hundreds of
  // pods, or a throttled one, answers in hundreds of milliseconds, and a List cut short leaves
  // the pod list unknown (every HCA withheld) for ever.
  absl::Duration pod_resources_timeout = absl::Seconds(5);
  // How long the admission path (an exclusive GetPreferredAllocation) waits for a List newer than
  // the call before it answers with the last list; the List goes on, for the next call.
  absl::Duration admission_wait = absl::Seconds(1);
  // How long Start waits for the first List before serving (the pods thread goes on trying).
  absl::Duration pod_resources_first_wait = absl::Milliseconds(100);
  // Retries of the pod-resources List while it fails: from the minimum, doubling, up to
  // health_interval; and at once when the socket appears.
  absl::Duration pod_resources_backoff_min = absl::Milliseconds(100);
  // An HCA absent from this many consecutive health polls, that no container holds, is no
  // longer listed.
  int forget_after_polls = 12;

  // The node's trees: --sysfs-root (or "/"), --dev-root, --proc-root.
  NodeRoots Roots() const;
  std::string SocketPath() const;         // <kubelet_dir>/<socket_name>
  std::string KubeletSocketPath() const;  // <kubelet_dir>/kubelet.sock
};

// InvalidArgument naming the first bad field and value: an unknown mode, a resource name that is
// not "<domain>/<name>", shared_devices outside 1..100000, a socket name with a '/', an interval
// below 10 ms, a root or XML that does not exist.
absl::Status Validate(const Config& config);

// The socket each of `served` is served on in config.kubelet_dir: Resource::SocketName()
// ("rdma-storage.sock"), prefixed by config.socket_name without ".sock" and a '-' when that is
// not the default ("rdp-exclusive-rdma-storage.sock": the chart's per-mode names stay apart
// through a mode swap), or config.socket_name for the one resource of the Config alone
// (`served` empty).
std::vector<std::string> SocketNames(const Config& config,
                                     const std::vector<resources::Resource>& served);

// The names under which one resource's Allocate hands a container its variables and allocation
// file (docs/server.md, "A container holding several resources"). A container that asks for
// several resources gets an Allocate answer from each; the kubelet merges them keeping, of each
// variable name and each mount path, the value it meets first, walking the resources in no fixed
// order (a Go map), and logs a conflict. So the plain names come from one resource only, and
// every resource of several sets its own under names no other resource uses.
struct AllocationNaming {
  // Sets the plain variables (NCCL_IB_HCA, RDMA_HCA_NAMES, RDMA_HCA_PCI, UCX_NET_DEVICES,
  // NCCL_IB_GID_INDEX: hca::BuildAllocation's) and mounts the file at hca::kAllocationFile.
  bool common = true;
  // "" for none. Else Resource::VariableSuffix(): the resource also sets each of those variables
  // as hca::OwnVariableName(key, suffix) (RDMA_HCA_NAMES_RDMA_STORAGE) and mounts the same file
  // at `own_file` too, "/etc/rdma/<suffix in lower case>/allocation.json".
  std::string suffix;
  std::string own_file;
};

// The naming of each of `served`, in order (empty: the one resource of the Config alone). A
// resource served alone sets the plain names and no other. Of several, the first listed sets the
// plain names, and each sets its own.
std::vector<AllocationNaming> AllocationNamings(const std::vector<resources::Resource>& served);

// InvalidArgument naming the resource and what is wrong when one of `served` has a name that is
// not "<domain>/<name>" or shared_devices outside 1..100000, when two share a name, when two
// would be served on one socket (names that differ only in '/' and '.') or one on kubelet.sock,
// or when two have one Resource::VariableSuffix (names that differ only in case and in
// characters other than letters and digits): their containers' own variables would clash.
absl::Status ValidateResources(const Config& config,
                               const std::vector<resources::Resource>& served);

}  // namespace rdp::deviceplugin
