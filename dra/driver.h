#pragma once

// The DRA driver's node-side domain logic behind NodePrepareResources / NodeUnprepareResources,
// independent of gRPC.
//
// Prepare, per claim: a claim in the checkpoint is answered from it (its CDI spec re-written
// from the checkpoint if the file is gone, e.g. /var/run/cdi after a reboot) without the API
// server; otherwise the claim is read through the ClaimReader by the call's deadline
// (config.api_timeout from when its reads can start: after the locks of its claims, not after
// other calls): every result must be in this node's pool and name a
// device of the current topology snapshot whose HCA is usable now (hca::Assess, with its device
// nodes checked at the call). The pods the claim is reserved for are read too, to know which of
// our (claim, request) pairs each of their containers holds (dra/consumers.h): a request's CDI
// device sets the common variables (NCCL_IB_HCA, ...) only when they name every HCA of every
// container that gets it, and never a variable that the pod spec of such a container sets itself
// (the runtime applies CDI's env after the pod spec's: ours would win); such variables of a claim
// prepared before are withdrawn (its spec re-written) when a new pod's container holds it beside
// other HCAs or sets them itself. Then the CDI spec (one
// device per request, dra/cdi.h) and the checkpoint are written. Any error leaves nothing written
// for that claim and is that claim's alone.
// Each prepared request also gets its metadata file (dra/metadata.h: its devices' attributes as
// published and their networkData), written before the CDI spec whose device mounts it.
// A result allocated for admin access (AllocatedDevice::admin_access, KEP-5018: monitoring and
// diagnostics beside the HCA's holders) is prepared as any other, with the HCA's device nodes,
// whoever else holds the HCA, and also when the HCA is not usable now (the nodes that exist);
// it is never counted as a holder: it names no device in anyone's common variables and its own
// request's CDI device sets none; one info line names the claim and its HCAs at its prepare.
// Unprepare, per claim: the checkpoint entry is dropped, then the CDI spec file and the metadata
// files removed; a claim that is not prepared is OK (its files are removed if any were left
// behind).
// With a ClaimStatusWriter, a prepared claim's status.devices gets an entry per device of ours
// (dra/device_status.h) and an unprepared one loses them; the writer does it in the background:
// neither call waits on it, and its failures are not the call's.
// Thread-safe: calls run concurrently; calls for one claim UID are serialised. Calls read the
// API server in parallel and then, one at a time, decide the common variables and commit; a call
// that learns, then, that another committed since its reads began with a pod whose container uses
// one of its claims (a holder it may not have read) reads again, up to kReadAttempts times in all,
// after which that claim's CDI device sets only its requests' own variables.

#include <cstdint>
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
#include "dra/consumers.h"
#include "dra/metadata.h"
#include "dra/model.h"
#include "hca/hca.h"
#include "node/node.h"
#include "topology/topology.h"

namespace rdp::dra {

struct DriverConfig {
  std::string driver_name = kDefaultDriverName;
  std::string node_name;  // our pool's name
  // The API reads of one Prepare call, retries included, together: the kubelet gives a call
  // 45 s; a claim answered from the checkpoint needs none.
  absl::Duration api_timeout = absl::Seconds(10);
  // The clock those reads' deadline is set on. Tests replace it.
  std::function<absl::Time()> now = [] { return absl::Now(); };
  // The kubelet's DRA checkpoint (<kubelet root dir>/dra_manager_state, dra/kubelet_state.h),
  // read by Start; "" for none (nothing is reconciled with the kubelet).
  std::string kubelet_state;
  // The devices of our ResourceSlices for a view of the node, as the plugin publishes them
  // (BuildDevices with its options): a prepared request's metadata file takes each device's
  // attributes from here. Unset: BuildDevices with driver_name and default options.
  std::function<std::vector<nlohmann::json>(const node::View&)> published_devices;
};

// One entry of a claim's NodePrepareResources answer.
struct PreparedDevice {
  std::vector<std::string> requests;  // the result's request, subrequest suffix stripped
  std::string pool;
  std::string device;
  // The request's CDI devices on the first of its devices, none on the others: the kubelet
  // hands a container the IDs of every device of the requests it uses, and one is enough. The
  // request's device (CdiDeviceId) and, but for a claim of a version 1 checkpoint, the one that
  // mounts its metadata file (MetadataCdiDeviceId).
  std::vector<std::string> cdi_ids;
  std::string share_id;  // "" when the allocation has none
  bool operator==(const PreparedDevice& o) const {
    return requests == o.requests && pool == o.pool && device == o.device &&
           cdi_ids == o.cdi_ids && share_id == o.share_id;
  }
};

class Driver {
 public:
  // `reader`, `cdi`, `metadata`, `checkpoint` and `node` are not owned and must outlive the
  // driver. The
  // driver reads the node through `node` (its view, its device-node check, the grant a container
  // gets); a claim naming a device the view lacks (an HCA hot-plugged since) makes it discover
  // the node again (node::Node::Rediscover, on the calling thread). `status` (optional, not owned,
  // outlives the driver) keeps the claims' status.devices.
  Driver(DriverConfig config, ClaimReader& reader, CdiStore& cdi, MetadataStore& metadata,
         Checkpoint& checkpoint, node::Node& node, ClaimStatusWriter* status = nullptr);

  // Loads the checkpoint (see Checkpoint::Load) and writes back what was recovered (a claim
  // without a time of prepare gets the file's modification time), then unprepares the claims the
  // kubelet has forgotten: with config.kubelet_state, each claim of the checkpoint that the
  // kubelet's DRA checkpoint does not list for this driver, and that was prepared before the
  // kubelet last wrote it, loses its checkpoint entry, its CDI spec and its status.devices
  // entries (an info log each, with the reason). When that file is absent, unreadable, corrupt
  // (checksum) or of a version we do not know, a warning names it and no claim is unprepared.
  // The kubelet lists a claim before it asks us to prepare it and until it has unprepared it; a
  // claim prepared after its last write is kept all the same (docs/dra.md, "Claims the kubelet
  // forgot"). Then it makes the CDI directory agree with the checkpoint (before any call, while this instance holds the plugin
  // directory; a crash or a driver reload since the last run left it otherwise):
  //   - temporary files of spec writes a crash interrupted are removed;
  //   - a spec file of this driver for a claim the checkpoint does not hold is removed (a crash
  //     between the spec and the checkpoint: the kubelet got no answer and asks again);
  //   - each claim of the checkpoint gets its spec as built now: a missing one (/var/run/cdi after
  //     a reboot) is written, one that differs (an HCA's uverbs node or major:minor changed when
  //     the kernel module was reloaded, or the file is not JSON) is re-written. An HCA that is
  //     known but not usable now (a port DOWN) keeps its device nodes in the spec; a claim naming
  //     a device the node no longer has loses its spec file (its old device nodes may name
  //     another HCA now): its containers cannot start until it is unprepared. The entry stays
  //     (the kubelet unprepares it).
  // The metadata files follow: the directories of claims the checkpoint does not hold and the
  // temporary files of interrupted writes are removed; a claim whose spec is (re)written or kept
  // gets its metadata files as built now (re-written where they differ, with the next
  // generation); a claim that loses its spec loses them too.
  // A failure to write or remove one file is logged and the others go on. Errors when the
  // checkpoint cannot be read or written, or the CDI directory cannot be listed.
  absl::Status Start();

  // Each claim's devices, or its error, by UID (a claim listed twice is answered once).
  // InvalidArgument for a claim without namespace or name, or whose uid is not a UUID.
  std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>> Prepare(
      const std::vector<ClaimRef>& claims);
  // Each claim's outcome by UID.
  std::map<std::string, absl::Status> Unprepare(const std::vector<ClaimRef>& claims);

  // After the node's RDMA driver is back from a reload: each prepared claim's CDI spec is built
  // again and re-written where it differs (the kernel numbered the uverbs nodes anew), so that a
  // container started from now on gets its HCAs' new device nodes; a spec that cannot be built is
  // removed, as at Start. A claim on an HCA whose driver is still away keeps its spec. Each
  // claim's calls wait for its own.
  void RefreshSpecs() ABSL_LOCKS_EXCLUDED(mu_);

  // The claims prepared now.
  PreparedClaims Prepared() const;
  // The claims Start unprepared because the kubelet had forgotten them.
  int UnpreparedAtStart() const;
  const DriverConfig& config() const { return config_; }

 private:
  // What the pods a batch of claims is reserved for say of each pair they hold.
  struct Consumers {
    Commons commons;                                      // CommonDevices
    std::map<RequestKey, std::set<std::string>> pod_env;  // PodSetVariables
    std::set<std::string> named;  // "ns/name" of every claim a container of those pods uses
  };
  // The times at most a batch's claims and their holders are read: again while NamedSince says
  // another call's commit named one of them.
  static constexpr int kReadAttempts = 3;

  // Claims not in the checkpoint, read (outside prepare_mu_) and prepared together; their locks
  // are held and none is prepared.
  void PrepareFresh(const std::vector<ClaimRef>& refs,
                    std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>>& out)
      ABSL_LOCKS_EXCLUDED(prepare_mu_);
  // A batch's reads begin: the number of commits so far, for NamedSince and EndReads.
  uint64_t BeginReads() ABSL_LOCKS_EXCLUDED(mu_);
  // The UIDs of `read` that a commit since `since` named (Consumers::named): the batch's reads
  // may have missed those claims' holders.
  std::set<std::string> NamedSince(
      uint64_t since, const std::map<std::string, std::pair<ClaimRef, ClaimAllocation>>& read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(prepare_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // The reads that began at `since` are over (decided on, failed or thrown).
  void EndReads(uint64_t since) ABSL_LOCKS_EXCLUDED(mu_);
  // Decides each claim of `read` from `consumers`, writes its spec and checkpoint entry, its
  // answer to `out`, and re-writes the prepared claims the consumers change (UpdateShared).
  void CommitFresh(const std::map<std::string, std::pair<ClaimRef, ClaimAllocation>>& read,
                   const Consumers& consumers,
                   std::map<std::string, absl::StatusOr<std::vector<PreparedDevice>>>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(prepare_mu_);
  // CommonDevices and PodSetVariables over the pods the claims `read` are reserved for; a pair
  // of a claim whose pods could not all be read is nullopt in commons.
  Consumers ConsumersOf(const std::map<std::string, std::pair<ClaimRef, ClaimAllocation>>& read,
                        absl::Time deadline) ABSL_LOCKS_EXCLUDED(prepare_mu_);
  // Re-writes the prepared claims outside `batch` whose holders `consumers` changed: common
  // variables that are not right for one of their holders are withdrawn, and the variables a
  // holder's pod spec sets are left out of those that stay.
  void UpdateShared(const Consumers& consumers, const std::set<std::string>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(prepare_mu_);
  // The answer of a claim in the checkpoint; its CDI spec written again if it is gone.
  absl::StatusOr<std::vector<PreparedDevice>> AnswerKnown(const PreparedClaim& claim);
  // The claim's CDI spec: its HCAs checked in the snapshot and, with `require_usable`, usable now.
  absl::StatusOr<nlohmann::json> SpecFor(const PreparedClaim& claim, bool require_usable = true);
  // Start's agreement of the CDI directory with prepared_.
  absl::Status Reconcile() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its part for the metadata directory: orphans and temporary files removed.
  absl::Status ReconcileMetadata() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each prepared claim's spec on disk built again, re-written where it differs, removed where it
  // cannot be built; a missing one stays missing (the kubelet's next prepare writes it).
  struct SpecCounts {
    int written = 0;
    int dropped = 0;
  };
  SpecCounts RewriteSpecs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RewriteSpec(const PreparedClaim& claim, SpecCounts& counts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Start's unprepare of the claims the kubelet has forgotten (config_.kubelet_state).
  absl::Status UnprepareForgotten() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the spec, then the checkpoint entry; on failure neither is left.
  absl::Status Commit(const PreparedClaim& claim, const nlohmann::json& spec);
  std::vector<PreparedDevice> Answer(const PreparedClaim& claim) const;
  // Writes each request's metadata file as built now from the node's view where it is missing
  // or differs (then with the next generation). Nothing for a legacy claim.
  absl::Status WriteMetadata(const PreparedClaim& claim);
  // Removes the claim's metadata files; a failure is logged.
  void RemoveMetadata(const ClaimRef& ref);
  // The claim's status.devices entries of ours, to status_ (when there is one).
  void WriteStatus(const ClaimRef& ref);
  absl::Status UnprepareOne(const ClaimRef& ref);
  // Serialises work on one claim UID.
  void LockClaim(const std::string& uid);
  // Locks a prepared claim, waiting only while it stays prepared (the holder of an unprepared
  // claim's lock may wait for prepare_mu_); false, without the lock, once it is not prepared.
  bool LockIfPrepared(const std::string& uid);
  void UnlockClaim(const std::string& uid);

  const DriverConfig config_;
  ClaimReader& reader_;
  CdiStore& cdi_;
  MetadataStore& metadata_;
  node::Node& node_;
  ClaimStatusWriter* const status_;

  // Held by a Prepare while it decides what the common variables say and commits: no API read
  // is made under it.
  absl::Mutex prepare_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  Checkpoint& checkpoint_ ABSL_GUARDED_BY(mu_);
  PreparedClaims prepared_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> busy_ ABSL_GUARDED_BY(mu_);  // claim UIDs being worked on
  int unprepared_at_start_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar claim_done_;                          // a UID left busy_
  uint64_t commits_ ABSL_GUARDED_BY(mu_) = 0;         // batches committed
  // The last commit whose consumers named a claim ("ns/name"), while some batch is being read.
  std::map<std::string, uint64_t> named_at_ ABSL_GUARDED_BY(mu_);
  std::multiset<uint64_t> reads_since_ ABSL_GUARDED_BY(mu_);  // BeginReads of batches reading
};

}  // namespace rdp::dra
