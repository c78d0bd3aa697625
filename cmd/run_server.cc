#include "cmd/run_server.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/cord.h"

#include "base/log.h"
#include "cmd/discovery_flags.h"
#include "metrics/http_server.h"
#include "metrics/metrics.h"
#include "serving/stop_signals.h"
#include "topology/gpudirect.h"

namespace rdp::cmd {

namespace {

constexpr char kRefusal[] = "type.googleapis.com/rdp.Refusal";

}  // namespace

absl::Status Refusal(const absl::Status& why) {
  absl::Status out = why;
  out.SetPayload(kRefusal, absl::Cord("refused"));
  return out;
}

bool IsRefusal(const absl::Status& status) { return status.GetPayload(kRefusal).has_value(); }

int RunServer(const ServerRun& run) {
  const auto log = Logger(run.logger);
  // Block the stop signals in every thread (gRPC's included) and take them from a signalfd.
  const int signals = serving::BlockStopSignals();
  if (signals < 0) {
    log->error("cannot start: signalfd: {}", std::strerror(errno));
    return 1;
  }
  // Scrapes run on the HTTP server's threads and read the door through snapshots. The port is
  // taken first: one in use ends the run before anything registered.
  std::unique_ptr<metrics::MetricsHttpServer> endpoint;
  if (!run.metrics.address.empty()) {
    const std::string subcommand = run.logger == "server" ? "serve" : run.logger;
    auto render = [&run, subcommand] {
      metrics::Exposition out;
      out.Family(metrics::Name("build_info"),
                 "The running build: its version and subcommand. Always 1.",
                 metrics::Exposition::Type::kInfo);
      out.Sample({{"version", RDP_VERSION}, {"subcommand", subcommand}}, 1);
      return out.Take() + run.render_metrics();
    };
    auto started = metrics::MetricsHttpServer::Start(run.metrics, render, run.checks);
    if (!started.ok()) {
      log->error("cannot start: {}", std::string(started.status().message()));
      ::close(signals);
      return kExitUsage;
    }
    endpoint = std::move(*started);
    log->info("metrics: serving on {}", endpoint->address());
  }
  if (absl::Status s = run.prepare ? run.prepare() : absl::OkStatus(); !s.ok()) {
    log->error("cannot start: {}", std::string(s.message()));
    endpoint.reset();
    run.stop();
    ::close(signals);
    return IsRefusal(s) ? kExitUsage : 1;
  }
  if (absl::Status s = run.start(); !s.ok()) {
    log->error("cannot start: {}", s.ToString());
    endpoint.reset();
    run.stop();
    ::close(signals);
    return 1;
  }
  if (run.node) log->info("{}", topology::ReadGpuDirect(*run.node).Summary());
  const absl::Status why = run.wait(signals);
  if (why.ok()) log->info("{} received: stopping", serving::ReadStopSignal(signals));
  ::close(signals);
  endpoint.reset();
  run.stop();
  log->info("{}", run.stopped);
  if (!why.ok()) {
    log->error("exiting: {}", std::string(why.message()));
    return 1;
  }
  return 0;
}

}  // namespace rdp::cmd
