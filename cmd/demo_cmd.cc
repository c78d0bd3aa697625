#include "cmd/demo_cmd.h"

#include <iostream>
#include <memory>
#include <string>

#include "cmd/discovery_flags.h"
#include "sim/demo.h"
#include "base/log.h"

namespace rdp::cmd {

void AddDemoCommand(CLI::App& app) {
  struct Flags {
    sim::DemoOptions options;
    std::string log_level = "info";
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "demo", "Run the plugin against a fixture node and a built-in kubelet simulator");
  sub->add_option("--topology-xml", f->options.topology_xml,
                  "hwloc XML of the node to simulate (default: the bundled dgx-h100-like node)")
      ->envname("RDP_TOPOLOGY_XML");
  sub->add_option("--work-dir", f->options.work_dir,
                  "Directory for the fake node and sockets (default: a temporary one, removed)");
  sub->add_flag("--metrics", f->options.metrics,
                "Also print a Prometheus scrape of the exclusive-mode plugin after its "
                "allocations");
  sub->add_option("--log-level", f->log_level, "The plugin's log level on stderr")
      ->envname("RDP_LOG_LEVEL")
      ->capture_default_str();
  sub->callback([f] {
    if (!SetLogLevel(f->log_level)) {
      std::cerr << "rdma-device-plugin demo: unknown --log-level '" << f->log_level << "'\n";
      Exit(kExitUsage);
    }
    if (int code = sim::RunDemo(f->options, std::cout); code != 0) Exit(code);
  });
}

}  // namespace rdp::cmd
