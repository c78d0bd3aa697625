#pragma once

// The node both doors serve: one object that owns the topology snapshot, the health poll (a
// sysfs scan, compared with the snapshot; a change of state patched in, a change of the PCI
// functions discovered again; the early-warning rule), one rule for a failed scan and for a failed
// discovery, the HCAs known (vanished ones until forgotten), the device-node check at hand-out
// time and the allocation a container gets. It hands out an immutable View and tells listeners
// when it changes. Doors (deviceplugin/, dra/) adapt it to their protocols and never read sysfs
// or run a discovery themselves.
//
// Rules:
//  - A failed scan says nothing about the HCAs (a broken /sys mount): the last good state is
//    kept, every HCA is unusable with the scan's error as the reason, none counts as absent.
//  - A failed discovery (after a scan showed PCI functions come or go): the scanned HCAs are
//    placed as the last discovery placed them (topology::WithScannedHcas) and discovery is tried
//    again at every poll until one succeeds.
//  - An HCA the scan no longer sees is listed unusable ("it is gone from the node") and
//    forgotten only once it has been absent for Options::forget_after_polls polls and the door
//    knows that nobody holds it.
// Thread-safe. Poll and Rediscover are serialised with each other; Now() never waits for a
// discovery.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/env.h"
#include "hca/early_warning.h"
#include "hca/hca.h"
#include "metrics/metrics.h"
#include "metrics/node_metrics.h"
#include "spdlog/spdlog.h"
#include "topology/discovery.h"
#include "topology/topology.h"

namespace rdp::node {

struct Options {
  hca::EarlyWarningConfig early_warning;
  // Polls an HCA must be absent for before it may be forgotten.
  int forget_after_polls = 12;
  // Rediscover runs a discovery at most once per this time.
  absl::Duration rediscover_interval = absl::Seconds(2);
  // A host directory (the same path in this process) for the files mounted at
  // hca::kAllocationFile; "" for none: no file is built or written.
  std::string allocation_dir;
  // The logger the node's lines go to: the door's ("server", "dra"), so that the lines users grep
  // for keep their logger.
  std::string logger = "node";
};

// Where the node's knowledge comes from. Tests replace any of these.
struct Sources {
  // Every read of the node outside discovery (device nodes, counters, /proc). Required.
  std::shared_ptr<Env> env;
  // A full discovery (sysfs + hwloc). Required.
  std::function<absl::StatusOr<topology::TopologyPtr>()> discover;
  // A cheap scan of the HCAs (sysfs only) for the health poll; null: none (an XML-only node,
  // whose health is what the XML says).
  std::function<absl::StatusOr<std::vector<topology::Hca>>()> scan;
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

// The node under `options`' roots: `env`, one topology::Discoverer (an XML is read once), and the
// sysfs scan unless only an XML is given.
Sources DefaultSources(const topology::DiscoveryOptions& options, std::shared_ptr<Env> env);

// The node at one moment. Immutable: a change makes a new View.
struct View {
  // The snapshot: placement (NUMA, PCIe tree, GPUs) from the last discovery, each present HCA's
  // state from the last successful scan.
  topology::TopologyPtr topology;
  // Every HCA known, by PCI address: the present ones and the vanished ones until forgotten.
  // healthy = Verdict(hca).usable for a present one; false for a vanished one.
  std::map<std::string, hca::AdvertisedHca> hcas;
  // What the early-warning rule flags now (degraded or held).
  hca::FlaggedHcas flagged;
  // The last health scan's error; "" when it succeeded (or there is no scan).
  std::string scan_error;
  // Increases with every change.
  std::uint64_t version = 0;

  // Whether a present HCA of `topology` can be handed out, and why not: unusable while the scan
  // fails, else hca::AssessWithHistory (its own state, then the early-warning rule). The one
  // definition both doors hand out, list, taint and report by.
  hca::Verdict Verdict(const topology::Hca& hca) const;

  // A view of `topology` alone (every HCA present, nothing flagged), for one-shot tools and tests.
  static std::shared_ptr<const View> Of(topology::TopologyPtr topology,
                                        hca::FlaggedHcas flagged = {});
};
using ViewPtr = std::shared_ptr<const View>;

// What one container gets: the allocation, and the host file mounted read-only at
// hca::kAllocationFile ("" for none: no allocation dir, or the write failed, which is logged).
struct Grant {
  hca::ContainerAllocation allocation;
  std::string file_mount;
};

class Node {
 public:
  Node(Options options, Sources sources);
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // The first discovery; its error when it fails (then the node has no view).
  absl::Status Init() ABSL_LOCKS_EXCLUDED(poll_mu_, mu_);

  // The node now; never null after a successful Init.
  ViewPtr Now() const ABSL_LOCKS_EXCLUDED(mu_);

  // One health poll (the rules above). `held`: the PCI addresses of HCAs some consumer holds, or
  // nullopt when the door cannot tell (then nothing is forgotten). True when the view changed;
  // the listeners have run by then.
  bool Poll(const std::optional<std::set<std::string>>& held) ABSL_LOCKS_EXCLUDED(poll_mu_, mu_);

  // A discovery now (a consumer names an HCA the snapshot lacks: hot-plugged since the last
  // poll). The new view; null when the last try was within Options::rediscover_interval or the
  // discovery failed (logged).
  ViewPtr Rediscover() ABSL_LOCKS_EXCLUDED(poll_mu_, mu_);

  // The device nodes of `hcas` (of the current snapshot) and rdma_cm, checked now: the scan that
  // saw them may be a poll old, and a device spec naming a missing node makes the runtime refuse
  // the container. When a node the last scan saw is gone, the rescan request runs (a poll soon).
  hca::NodesNow CheckNow(const std::vector<const topology::Hca*>& hcas) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // What a container holding `hcas` (checked by CheckNow, usable) gets: hca::BuildAllocation, and
  // with an allocation dir the file written there (unless a file of that content is there
  // already). `paired_gpu`: HCA PCI -> the container's GPU it pairs with (hca::PairGpus). The
  // caller logs the allocation's warnings with its own context.
  Grant GrantFor(std::vector<hca::HcaNow> hcas, bool with_rdma_cm,
                 const std::map<std::string, std::string>& paired_gpu = {}) const;

  // `listener` runs after every change of the view, on the thread that made it, outside the
  // node's locks. RemoveListener returns once no call of that listener is running.
  int AddListener(std::function<void()> listener) ABSL_LOCKS_EXCLUDED(listeners_mu_);
  void RemoveListener(int id) ABSL_LOCKS_EXCLUDED(listeners_mu_);
  // Run by CheckNow when the node changed since the last scan: the poll's owner polls soon.
  void SetRescanRequest(std::function<void()> request) ABSL_LOCKS_EXCLUDED(mu_);

  // One scrape of the node: its own instruments (discoveries, state changes), then the families
  // of metrics/node_metrics.h for the view now with `door`'s part (mode, withheld, holders; its
  // topology, hcas and early_warning are the node's), the port counters read now.
  void WriteMetrics(metrics::Exposition& out, metrics::NodeMetricsInput door) const;

  Env& env() const { return *sources_.env; }
  const std::shared_ptr<Env>& shared_env() const { return sources_.env; }
  const Options& options() const { return options_; }

 private:
  // sources_.discover(), timed.
  absl::StatusOr<topology::TopologyPtr> Discover();
  // Publishes `view` (version bumped) and runs the listeners.
  void Publish(std::shared_ptr<View> view) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);
  // The scan failed: every HCA unusable, nothing forgotten.
  bool ScanFailed(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(poll_mu_);

  const Options options_;
  const Sources sources_;
  std::shared_ptr<spdlog::logger> log_;
  hca::EarlyWarningMonitor early_warning_;
  mutable metrics::PortCounterCache port_counters_;
  // The node's instruments.
  metrics::Counter rediscoveries_;      // discoveries after the first (hotplug, Rediscover)
  metrics::Counter state_changes_;      // scans of the same HCAs in another state, patched in
  metrics::Histogram discovery_;        // every discovery's duration, the first included

  // Held by Poll and Rediscover: one of them changes the snapshot at a time.
  absl::Mutex poll_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool scan_failing_ ABSL_GUARDED_BY(poll_mu_) = false;        // logged once per streak
  bool discovery_pending_ ABSL_GUARDED_BY(poll_mu_) = false;   // the last one failed
  absl::Time last_rediscovery_ ABSL_GUARDED_BY(poll_mu_) = absl::InfinitePast();

  mutable absl::Mutex listeners_mu_;
  std::map<int, std::function<void()>> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  int next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 0;

  mutable absl::Mutex mu_;
  ViewPtr view_ ABSL_GUARDED_BY(mu_);
  std::function<void()> rescan_request_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdp::node
