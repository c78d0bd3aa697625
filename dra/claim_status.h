#pragma once

// ClaimStatusWriter over the API server (the device status in the claim): after
// NodePrepareResources, a claim's status.devices says what the pod got (dra/device_status.h);
// after NodeUnprepareResources our entries go.
//
// A write is a read-modify-write of the claim: GET it, replace the entries whose driver is ours
// (other drivers' entries are kept, in their order), and PUT resourceclaims/<name>/status with the
// resourceVersion read (a 409 Conflict: read again, a few times). Nothing is PUT when our entries
// are already what they should be. The PUT's answer is compared with what was sent: a control
// plane with DRAResourceClaimDeviceStatus off drops status.devices (a warning, once). RBAC: get
// on resourceclaims, update on resourceclaims/status.
//
// The writes run on a thread of the writer's own, so that a kubelet RPC never waits on the API
// server. Per claim the last Set wins. Outcomes of a write:
//   done:     written, or nothing to write; the claim is gone (404, or another uid under its
//             name); the API server refused the entries (422: deallocated meanwhile), or the
//             writer may not write (403: the chart's RBAC is older than the driver) or the server
//             dropped them: an error log line, not retried (the next prepare of the claim tries
//             again);
//   retried:  anything else (unreachable, timeout, 429, 5xx, conflicts every time): after a
//             back-off drawn from [b/2, b], b = initial doubling up to max, until it is written, a
//             newer Set replaces it, or the writer stops.
// Thread-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dra/model.h"
#include "kube/client.h"
#include "nlohmann/json.hpp"

namespace rdp::dra {

// `current` (a claim's status.devices; null or not an array: none) with the entries whose driver
// is `driver` replaced by `ours`: the others first, in their order, then `ours`. Pure.
nlohmann::json MergeDeviceStatuses(const nlohmann::json& current, const std::string& driver,
                                   const std::vector<nlohmann::json>& ours);

// The entries of `current` whose driver is `driver`, in their order. Pure.
std::vector<nlohmann::json> DriverDeviceStatuses(const nlohmann::json& current,
                                                 const std::string& driver);

class ApiClaimStatusWriter : public ClaimStatusWriter {
 public:
  struct Options {
    // One write (its GET and PUT, the re-reads after conflicts, the client's retries) ends
    // within this; short, since Stop waits for the write in flight.
    absl::Duration timeout = absl::Seconds(5);
    // A write read again after this many 409 Conflicts in a row is retried after a back-off.
    int conflict_attempts = 4;
    absl::Duration initial_backoff = absl::Seconds(1);
    absl::Duration max_backoff = absl::Minutes(1);
  };
  struct Counts {
    std::uint64_t successes = 0;  // claims whose entries were written (or already right)
    std::uint64_t failures = 0;   // writes that failed (each retry counts)
  };

  ApiClaimStatusWriter(std::shared_ptr<kube::Client> client, std::string driver);
  ApiClaimStatusWriter(std::shared_ptr<kube::Client> client, std::string driver, Options options);
  ~ApiClaimStatusWriter() override;  // Stop()

  // Starts the writing thread; Set before Start queues.
  void Start();
  // Ends the thread after the write in flight (bounded by Options::timeout); what is still
  // pending is dropped (logged). Idempotent.
  void Stop();

  void Set(const ClaimRef& ref, std::vector<nlohmann::json> devices) override;

  Counts counts() const;
  // True once nothing is pending or in flight; false when `timeout` passed first.
  bool WaitIdle(absl::Duration timeout);

  // One write on the calling thread, as the writing thread does it: OK when written or nothing to
  // write; NotFound (the claim is gone), InvalidArgument, PermissionDenied, FailedPrecondition
  // (the server dropped status.devices), Aborted (conflicts every time) or the client's errors.
  absl::Status Write(const ClaimRef& ref, const std::vector<nlohmann::json>& devices,
                     absl::Time deadline);

 private:
  struct Pending {
    ClaimRef ref;
    std::vector<nlohmann::json> devices;
    absl::Time due;
    int failures = 0;
    std::uint64_t generation = 0;  // which Set this is
  };
  void Run();
  std::optional<Pending> Next();
  void Done(const Pending& taken, const absl::Status& s);
  absl::Duration Backoff(int failures) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<kube::Client> client_;
  const std::string driver_;
  const Options options_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // a Set, Stop, or a write ended
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);  // by claim uid
  // Our entries as last written, by claim uid (none kept once removed): a Set that changes
  // nothing sends nothing (the kubelet prepares a claim again for each pod that uses it).
  std::map<std::string, std::vector<nlohmann::json>> written_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> in_flight_ ABSL_GUARDED_BY(mu_);
  std::uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  Counts counts_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool warned_dropped_ ABSL_GUARDED_BY(mu_) = false;
  std::minstd_rand rng_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // Start and Stop only (one caller)
};

}  // namespace rdp::dra
