#pragma once

// How a serving subcommand (serve, dra) runs once its flags are resolved: the one place where the
// stop signals, the metrics endpoint and the order of start, wait and stop are written.

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "metrics/http_server.h"
#include "base/env.h"

namespace rdp::cmd {

// The deadline of one probe's check (the `probe` subcommand's default --timeout, in-process for
// /livez and /readyz): under the chart's probe timeouts.
inline constexpr absl::Duration kProbeTimeout = absl::Seconds(1);

// A front door as the serving subcommands drive it.
struct ServerRun {
  std::string logger;  // the module whose logger says what happens ("server", "dra")
  // Null, or run before `start` once the metrics endpoint listens: learns what is to be served
  // (discovers the node) and checks the configuration against it. Its error ends the run before
  // anything is served (after `stop`): kExitUsage when it is a Refusal, 1 otherwise.
  std::function<absl::Status()> prepare;
  // Serves and registers; an error ends the run with exit 1 (after `stop`).
  std::function<absl::Status()> start;
  // Blocks until the signalfd `signal_fd` is readable (OK) or the server cannot go on (its error).
  std::function<absl::Status(int signal_fd)> wait;
  // Stops serving and cleans up; called once, after `start` returned (whatever it returned).
  std::function<void()> stop;
  // The line logged once stopped ("stopped; removed ...").
  std::string stopped;
  // The metrics endpoint (address empty: none) and what a scrape returns beside build_info,
  // called on the endpoint's threads, from before `start` (it must answer then too) until after
  // `stop`: it must never wait on what a kubelet RPC holds.
  metrics::HttpOptions metrics;
  std::function<std::string()> render_metrics;
  // The node's trees (not owned; null: none): once started, the GPUDirect RDMA line is logged
  // from them (topology::ReadGpuDirect).
  Env* node = nullptr;
  // What /healthz, /livez and /readyz say (metrics::MetricsHttpServer::Checks), on the
  // endpoint's threads as render_metrics. The chart's probes GET /livez and /readyz: each is the
  // `probe` subcommand's check run in this process, so that no probe starts a process.
  metrics::MetricsHttpServer::Checks checks;
};

// A configuration this node refuses (two exclusive resources selecting one HCA): `why`, marked
// so that RunServer exits kExitUsage for it. IsRefusal tells it from any other error.
absl::Status Refusal(const absl::Status& why);
bool IsRefusal(const absl::Status& status);

// Blocks SIGTERM and SIGINT (before any thread starts), listens for metrics, starts `run`, waits,
// stops. Returns the exit code: 0 after a stop signal; 1 when it could not start or a background
// thread could not go on (so that the kubelet restarts the pod rather than it serving stale
// state); kExitUsage when the metrics endpoint cannot listen on its address or `prepare` refused
// the configuration, before anything started (a plugin that registered and then exited would be
// restarted into a loop of registrations).
int RunServer(const ServerRun& run);

}  // namespace rdp::cmd
