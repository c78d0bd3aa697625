#pragma once

// What `rdma-device-plugin check` does (cmd/check_cmd.cc only wires its flags): run inside a
// workload container (it is what `helm test` runs). Lists
// the HCAs whose verbs device the container can really open and compares them with what Allocate
// gave it (RDMA_HCA_NAMES and the RDMA_HCA_NAMES_<suffix> of each resource or request, else
// NCCL_IB_HCA). Seeing more than it was given means exclusive
// isolation does not hold; the classic cause is a GPU plugin with MOFED_ENABLED / NVIDIA_MOFED=true
// injecting every /dev/infiniband device.
//
// Exit codes: 0 the sets are equal; 1 they differ (a plain explanation is printed); 2 bad flags or
// a root that cannot be read (nothing was checked).

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/env.h"
#include "nlohmann/json.hpp"

namespace rdp::check {

// What the container was allocated, from the environment Allocate set.
struct Allocation {
  enum class Source { kNone, kRdmaHcaNames, kNcclIbHca };
  Source source = Source::kNone;
  std::vector<std::string> names;  // sorted, unique HCA names
  std::vector<std::string> notes;  // caveats worth printing (prefix matching, ignored lists)
};

// RDMA_HCA_NAMES ("mlx5_0,mlx5_3") wins when set. Else NCCL_IB_HCA in NCCL's forms: a leading
// '=' (exact match), entries "name[:port]"; a leading '^' makes it an exclude list, which says
// nothing about the allocation and is ignored (with a note). Neither set: Source::kNone and no
// names, i.e. nothing was allocated. nullopt means "variable not set".
Allocation ParseAllocation(const std::optional<std::string>& rdma_hca_names,
                           const std::optional<std::string>& nccl_ib_hca);

// RDMA_HCA_NAMES and every RDMA_HCA_NAMES_<suffix> of `environ` (the process's "NAME=VALUE"
// entries, in their order), joined with ',': ParseAllocation's rdma_hca_names. A container holding
// several of the device plugin's resources, or several of the DRA driver's requests, has each
// one's HCAs under a name of its own (docs/server.md, "A container holding several resources";
// docs/dra.md), and the plain name names one resource's at most. nullopt when none is set.
std::optional<std::string> AllocatedHcaNames(const std::vector<std::string>& environ);

// One HCA seen in sysfs and whether the container may open its verbs device read-write: the
// open succeeded, or it reached the device and found no driver (ENXIO, ENODEV: only a device the
// container's device cgroup allows gets that far; a denied one fails with EPERM).
struct HcaAccess {
  std::string name;    // mlx5_0
  std::string pci;     // 0000:1a:00.0
  std::string uverbs;  // uverbs0, "" when unknown
  bool openable = false;
  std::string error;   // what open() said when it failed: "Operation not permitted", ...
};

enum class Verdict { kMatch, kMore, kFewer, kDifferent };

struct CheckReport {
  Verdict verdict = Verdict::kMatch;
  std::vector<HcaAccess> hcas;        // as given, sorted by name
  Allocation allocation;
  std::vector<std::string> openable;  // names, sorted
  std::vector<std::string> extra;     // openable but not allocated
  std::vector<std::string> missing;   // allocated but not openable (or not on this node)
  std::string explanation;            // one paragraph, for people

  int ExitCode() const { return verdict == Verdict::kMatch ? 0 : 1; }
};

// The comparison, pure: no I/O.
CheckReport Compare(std::vector<HcaAccess> hcas, Allocation allocation);

// Tries open(/dev/infiniband/<uverbs>, O_RDWR | O_CLOEXEC), on the filesystem `env` reads from,
// for each HCA found in sysfs (topology::ReadSysfsHcas) and closes it again. An error (NotFound
// naming the path) only when the HCAs cannot be listed at all, e.g. no /sys.
absl::StatusOr<std::vector<HcaAccess>> ProbeHcas(Env& env);

const char* VerdictName(Verdict verdict);
nlohmann::json ToJson(const CheckReport& report);
void PrintText(const CheckReport& report, std::ostream& out);

struct CheckOptions {
  std::string sysfs_root = "/";
  std::string dev_root = "/";
  std::string proc_root = "/";  // GPUDirect RDMA's signals (topology/gpudirect.h)
  bool json = false;
  // RLIMIT_MEMLOCK of the container (the cmd reads its own); nullopt: not reported.
  std::optional<std::uint64_t> memlock;
  // Exit 1 also when GPUDirect RDMA cannot work here (check/gpudirect_check.h).
  bool require_gpudirect = false;
};

// Exit code when nothing could be checked (a root that cannot be read).
inline constexpr int kExitCannotCheck = 2;

// The whole subcommand with the environment passed in: probes, compares, prints the report to
// out (errors to err), then whether GPUDirect RDMA can work here and the locked-memory limit
// (check/gpudirect_check.h; JSON: key "gpudirect"), and returns the exit code (0, 1 or
// kExitCannotCheck; 1 also when options.require_gpudirect and it cannot).
int RunCheck(const CheckOptions& options, const std::optional<std::string>& rdma_hca_names,
             const std::optional<std::string>& nccl_ib_hca, std::ostream& out, std::ostream& err);

}  // namespace rdp::check
