#pragma once

// The DRA driver on a node, as `rdma-device-plugin dra` runs it: the node core (node/node.h)
// adapted to DRA. It holds the plugin directory (one instance per directory), keeps the claims
// (Driver: CDI specs, checkpoint), serves the kubelet (DraServer: registration, DRAPlugin, the
// health stream), publishes the node's ResourceSlices through the API server (SliceSync, on its
// own thread: no kubelet RPC waits on the API server), keeps the claims' status.devices
// (ApiClaimStatusWriter), and runs the node's health poll every health_interval: a change of the
// node publishes the slices again and the health stream says it.
//
// Slices are published only while the kubelet has the driver registered, and withdrawn when it
// refuses it. A control plane that drops device taints (its gate is off) gets no device for an
// unusable HCA instead of an untainted one; one that refuses the taint effect None (older than
// 1.35) gets the HCAs those taints inform about untainted. A second instance asks this one to
// hand over (an upgrade with maxSurge, a relabel): this one stops serving, releases the
// directory, stops publishing and idles until stopped.

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "dra/cdi.h"
#include "dra/checkpoint.h"
#include "dra/claim_reader.h"
#include "dra/claim_status.h"
#include "dra/devices.h"
#include "dra/dra_server.h"
#include "dra/driver.h"
#include "dra/health.h"
#include "dra/metadata.h"
#include "dra/plugin_lock.h"
#include "dra/slice_publisher.h"
#include "dra/slice_sync.h"
#include "hca/hca.h"
#include "kube/client.h"
#include "node/node.h"

namespace rdp::dra {

struct PluginConfig {
  DriverConfig driver;     // driver and node name, allocation dir, the kubelet's state file
  DraServerConfig server;  // the kubelet's directory and the driver's name
  std::string cdi_root = kDefaultCdiRoot;
  hca::Mode mode = hca::Mode::kExclusive;
  // Shared mode: the claims one HCA serves at most (DeviceOptions::shared_units).
  std::int64_t shared_units = kDefaultSharedUnits;
  absl::Duration health_interval = absl::Seconds(5);
  absl::Duration resync = absl::Seconds(30);  // SliceSync's, while no watch is up
  // Read the pods claims are reserved for, this node's only (PodReads, dra/claim_reader.h).
  bool read_pods = true;
};

// What every DRA run on a node holds, made in this order: the plugin directory's lock (`serving`:
// ask an instance that holds it to hand over; else wait for it), the node's first discovery, the
// CDI store, the checkpoint and the started Driver (Driver::Start). An error names what failed;
// then nothing is held.
class NodeClaims {
 public:
  static absl::StatusOr<std::unique_ptr<NodeClaims>> Start(const PluginConfig& config,
                                                           node::Node& node, ClaimReader& reader,
                                                           ClaimStatusWriter* status,
                                                           bool serving);
  Driver& driver() { return *driver_; }
  const Driver& driver() const { return *driver_; }
  const CdiStore& cdi() const { return *cdi_; }
  // Lets another instance have the plugin directory; nothing of this one may write there after.
  void ReleaseLock() { lock_.reset(); }

 private:
  NodeClaims() = default;
  std::optional<PluginDirLock> lock_;  // declared first: released last
  std::unique_ptr<CdiStore> cdi_;
  std::unique_ptr<MetadataStore> metadata_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Driver> driver_;
};

// The options the node's devices are published with (all but taints, which follow what the
// control plane keeps): driver name, mode and shared units of `config`, the kernel's PCI
// placement, GPUDirect RDMA as read now.
DeviceOptions PublishedDeviceOptions(const PluginConfig& config, node::Node& node,
                                     const node::View& view);

// The PCI addresses of the HCAs the prepared claims hold: those a vanished HCA is kept for. A
// device allocated for admin access is not held (a monitor keeps no gone HCA listed).
std::set<std::string> HeldHcas(const PreparedClaims& claims, const node::View& view);

class Plugin {
 public:
  // `node` (not yet Init'ed) and `client` outlive the plugin.
  Plugin(PluginConfig config, node::Node& node, std::shared_ptr<kube::Client> client);
  ~Plugin();  // Stop()
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  // NodeClaims::Start (the lock, the first discovery, the driver); its error when it fails.
  absl::Status Init();
  // Starts publishing, the status writer and the health poll, then serves the kubelet.
  absl::Status Start();
  // Blocks until `signal_fd` is readable (OK) or serving cannot go on (its error). Asked to hand
  // over, it stops serving, releases the directory, stops publishing and waits for the signal.
  absl::Status Wait(int signal_fd);
  // Ends every API call in flight, stops serving, the poll and publishing. Idempotent.
  void Stop();

  // One scrape: the node's families and the driver's own (registration, publishes, the watch,
  // claim status writes, dropped fields, claims unprepared at start). Any thread.
  std::string Metrics() const;
  // /healthz: OK while the kubelet has the driver registered and the slices are published as
  // wanted; else why not.
  absl::Status Health() const;
  // The line logged once stopped.
  std::string StoppedLine() const;

 private:
  // The node's pool now: its HCAs as devices (health as taints), in slices.
  std::vector<nlohmann::json> DesiredSlices() const;
  void PollLoop();

  const PluginConfig config_;
  node::Node& node_;
  const std::shared_ptr<kube::Client> client_;
  ApiClaimReader reader_;
  // Claims' status.devices, written on a thread of its own: a prepare never waits on it.
  ApiClaimStatusWriter claim_status_;
  ApiSlicePublisher publisher_;
  // Cleared when the API server drops device taints: unusable HCAs are then left out.
  std::atomic<bool> taints_{true};
  // Cleared when the API server refuses the taint effect None: such taints are then left out.
  std::atomic<bool> taint_effect_none_{true};
  HealthFeed health_;
  std::unique_ptr<NodeClaims> claims_;
  std::unique_ptr<SliceSync> sync_;
  std::unique_ptr<DraServer> server_;
  int listener_ = -1;
  absl::Notification stop_poll_;
  std::thread poll_;
  std::atomic<bool> handed_over_{false};
  bool stopped_ = false;  // the caller's thread only
};

// `dra prepare-local`: prepares one claim given on the command line (`devices`: device names of
// this node's pool), used by one container of one pod, through the driver as
// NodePrepareResources would, without an API server. The answer as JSON ({"devices": [...],
// "cdiSpec": path}) or the claim's error ({"error": ...}); exit code 0 when prepared, 1 when
// not; a start failure is an error status.
absl::StatusOr<std::pair<int, nlohmann::json>> PrepareLocal(PluginConfig config, node::Node& node,
                                                             const ClaimRef& claim,
                                                             const std::vector<std::string>& devices);

}  // namespace rdp::dra
