// rdma-device-plugin: flags -> wiring, nothing else. Each subcommand registers itself; a
// subcommand's callback ends with rdp::cmd::Exit(code) on failure.

#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cmd/check_cmd.h"
#include "cmd/dev_tools_cmd.h"
#include "cmd/discovery_flags.h"
#include "cmd/dra_cmd.h"
#include "cmd/dra_serve_cmd.h"
#include "cmd/nri_cmd.h"
#include "cmd/probe_cmd.h"
#include "cmd/serve_cmd.h"
#include "cmd/topology_cmd.h"
#include "serving/mutexes.h"

int main(int argc, char** argv) {
  rdp::serving::DisableMutexDeadlockDetection();  // before any thread (serving/mutexes.h)
  CLI::App app{
      "Kubernetes device plugin that gives pods RDMA NICs (rdma/hca), aligned with NUMA nodes, "
      "PCIe switches and GPUs.",
      "rdma-device-plugin"};
  app.set_version_flag("--version", std::string("rdma-device-plugin ") + RDP_VERSION);
  app.require_subcommand(0, 1);
  rdp::cmd::AddServeCommand(app);
  rdp::cmd::AddTopologyCommand(app);
  rdp::cmd::AddDevToolCommands(app);
  rdp::cmd::AddProbeCommand(app);
  rdp::cmd::AddCheckCommand(app);
  rdp::cmd::AddNriCommand(app);
  rdp::cmd::AddDraServeFlags(rdp::cmd::AddDraCommand(app));

  std::vector<std::string> args(argv + 1, argv + argc);
  // `serve` is the default subcommand: flags without a subcommand name go to it.
  std::set<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.insert(sub->get_name());
  const bool asks_top_level = !args.empty() && (args[0] == "--help" || args[0] == "-h" ||
                                                args[0] == "--version");
  if (names.count("serve") && !asks_top_level && (args.empty() || !names.count(args[0]))) {
    args.insert(args.begin(), "serve");
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments reversed
  try {
    app.parse(args);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();
  } catch (const CLI::Error& e) {
    std::cerr << "rdma-device-plugin: " << e.what() << "\n";
    return rdp::cmd::kExitUsage;
  }
  if (app.get_subcommands().empty()) {
    std::cerr << app.help();
    return rdp::cmd::kExitUsage;
  }
  return 0;
}
