#include "cmd/nri_cmd.h"

#include <memory>
#include <string>

#include "base/log.h"
#include "cmd/discovery_flags.h"
#include "cmd/run_server.h"
#include "metrics/http_server.h"
#include "metrics/metrics.h"
#include "nri/memlock.h"
#include "nri/plugin.h"

namespace rdp::cmd {
namespace {

struct NriFlags {
  nri::PluginConfig config;
  std::string memlock = "unlimited";
  std::string metrics_address;
  std::string log_level = "info";
};

absl::Status Resolve(NriFlags& f) {
  if (!SetLogLevel(f.log_level)) {
    return absl::InvalidArgumentError("--log-level: unknown level '" + f.log_level + "'");
  }
  auto memlock = nri::ParseMemlock(f.memlock);
  if (!memlock.ok()) return memlock.status();
  f.config.memlock = *memlock;
  if (absl::Status s = nri::ValidateConfig(f.config); !s.ok()) return s;
  if (!f.metrics_address.empty()) {
    if (auto parsed = metrics::ParseListenAddress(f.metrics_address); !parsed.ok()) {
      return parsed.status();
    }
  }
  return absl::OkStatus();
}

int RunNri(const NriFlags& f) {
  nri::NriMetrics metrics;
  nri::NriPlugin plugin(f.config, &metrics);
  ServerRun run;
  run.logger = "nri";
  run.start = [&plugin] { return plugin.Start(); };
  run.wait = [&plugin](int signals) { return plugin.Wait(signals); };
  run.stop = [&plugin] { plugin.Stop(); };
  run.stopped = "stopped; disconnected from " + f.config.socket_path;
  run.metrics.address = f.metrics_address;
  run.render_metrics = [&metrics] {
    metrics::Exposition out;
    metrics.Write(out);
    return out.Take();
  };
  return RunServer(run);
}

}  // namespace

void AddNriCommand(CLI::App& app) {
  auto f = std::make_shared<NriFlags>();
  CLI::App* sub = app.add_subcommand(
      "nri",
      "Run the NRI plugin: raise RLIMIT_MEMLOCK for containers that hold an HCA "
      "(/dev/infiniband/uverbs*), through the container runtime's NRI socket");
  sub->add_option("--nri-socket", f->config.socket_path, "The runtime's NRI socket")
      ->envname("RDP_NRI_SOCKET")
      ->capture_default_str();
  sub->add_option("--memlock", f->memlock,
                  "RLIMIT_MEMLOCK (soft; hard at least this) for containers with an HCA: "
                  "'unlimited', bytes, or with Ki, Mi, Gi, Ti")
      ->envname("RDP_MEMLOCK")
      ->capture_default_str();
  sub->add_option("--nri-plugin-name", f->config.registration.name,
                  "The name the plugin registers under")
      ->envname("RDP_NRI_PLUGIN_NAME")
      ->capture_default_str();
  sub->add_option("--nri-plugin-index", f->config.registration.index,
                  "Two digits: where the runtime calls the plugin among its NRI plugins")
      ->envname("RDP_NRI_PLUGIN_INDEX")
      ->capture_default_str();
  sub->add_option("--metrics-address", f->metrics_address,
                  "HOST:PORT to serve Prometheus metrics (/metrics) and /healthz on; empty: off")
      ->envname("RDP_METRICS_ADDRESS");
  sub->add_option("--log-level", f->log_level, "trace, debug, info, warn, error or off")
      ->envname("RDP_LOG_LEVEL")
      ->capture_default_str();
  sub->callback([f] {
    if (absl::Status s = Resolve(*f); !s.ok()) {
      Logger("nri")->error("{}", std::string(s.message()));
      Exit(kExitUsage);
    }
    if (int code = RunNri(*f); code != 0) Exit(code);
  });
}

}  // namespace rdp::cmd
