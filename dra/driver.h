#pragma once

// The DRA driver's node-side domain logic behind NodePrepareResources / NodeUnprepareResources,
// independent of gRPC.
//
// Prepare, per claim: a claim in the checkpoint is answered from it (its CDI spec re-written
// from the checkpointed devices if the file is gone, e.g. /var/run/cdi after a reboot) without
// the API server; otherwise the claim's allocation is read through the ClaimReader by the call's
// deadline (config.api_timeout from its start), every result must be in this node's pool and
// name a device of the current topology snapshot whose HCA is usable now (hca::Assess, with
// its device nodes checked at the call), then the CDI spec and the checkpoint are written. Any error leaves nothing written for
// that claim and is that claim's alone.
// Unprepare, per claim: the checkpoint entry is dropped, then the CDI spec file removed; a claim
// that is not prepared is OK (its spec file is removed if one was left behind).
// Thread-safe: calls run concurrently; calls for one claim UID are serialised.

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/env.h"
#include "dra/cdi.h"
#include "dra/checkpoint.h"
#include "dra/model.h"
#include "topology/topology.h"

namespace rdp::dra {

struct DriverConfig {
  std::string driver_name = kDefaultDriverName;
  std::string node_name;  // our pool's name
  // The API reads of one Prepare call, retries included, together: the kubelet gives a call
  // 45 s; a claim answered from the checkpoint needs none.
  absl::Duration api_timeout = absl::Seconds(10);
};

// One entry of a claim's NodePrepareResources answer.
struct PreparedDevice {
  std::vector<std::string> requests;  // the result's request, subrequest suffix stripped
  std::string pool;
  std::string device;
  std::vector<std::string> cdi_ids;
  bool operator==(const PreparedDevice& o) const {
    return requests == o.requests && pool == o.pool && device == o.device &&
           cdi_ids == o.cdi_ids;
  }
};

class Driver {
 public:
  // `reader`, `cdi` and `checkpoint` are not owned and must outlive the driver. `topology`
  // returns the current snapshot; `env` reads the node (device nodes, sysfs). `rediscover`
  // (optional; null when it fails or declines, e.g. rate-limited) is called when a claim names a
  // device the snapshot does not have: an HCA hot-plugged since; it runs on the calling thread.
  Driver(DriverConfig config, ClaimReader& reader, CdiStore& cdi, Checkpoint& checkpoint,
         std::function<topology::TopologyPtr()> topology, std::shared_ptr<Env> env,
         std::function<topology::TopologyPtr()> rediscover = nullptr);

  // Loads the checkpoint (see Checkpoint::Load) and writes back what was recovered. Errors when
  // it cannot be read or written.
  absl::Status Start();

  // Each claim's devices, or its error, by UID (a claim listed twice is answered once).
  // InvalidArgument for a claim without uid, namespace or name.
  std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>> Prepare(
      const std::vector<ClaimRef>& claims);
  // Each claim's outcome by UID.
  std::map<std::string, absl::Status> Unprepare(const std::vector<ClaimRef>& claims);

  // The claims prepared now.
  PreparedClaims Prepared() const;
  const DriverConfig& config() const { return config_; }

 private:
  absl::StatusOr<std::vector<PreparedDevice>> PrepareOne(const ClaimRef& ref,
                                                         absl::Time deadline);
  absl::Status UnprepareOne(const ClaimRef& ref);
  // The HCAs of `devices` in the snapshot, checked; the CDI spec for them.
  absl::StatusOr<nlohmann::json> SpecFor(const ClaimRef& ref,
                                         const std::vector<AllocatedDevice>& devices);
  std::vector<PreparedDevice> Answer(const PreparedClaim& claim) const;
  // Serialises work on one claim UID.
  void LockClaim(const std::string& uid);
  void UnlockClaim(const std::string& uid);

  const DriverConfig config_;
  ClaimReader& reader_;
  CdiStore& cdi_;
  const std::function<topology::TopologyPtr()> topology_;
  const std::function<topology::TopologyPtr()> rediscover_;
  const std::shared_ptr<Env> env_;

  mutable absl::Mutex mu_;
  Checkpoint& checkpoint_ ABSL_GUARDED_BY(mu_);
  PreparedClaims prepared_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> busy_ ABSL_GUARDED_BY(mu_);  // claim UIDs being worked on
  absl::CondVar claim_done_;                          // a UID left busy_
};


}  // namespace rdp::dra
