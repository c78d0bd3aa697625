// rdma-device-plugin-sim: the development tools that are not product and not in the image:
// `demo` (sim/demo.h) and `fixture` (sim/fixture_node.h). It is built beside rdma-device-plugin,
// whose `demo` and `fixture` subcommands run it with their arguments.

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>

#include "CLI/CLI.hpp"
#include "base/log.h"
#include "sim/demo.h"
#include "sim/fixture_node.h"

namespace rdp::sim {
namespace {

constexpr int kExitUsage = 2;  // bad flags, as rdma-device-plugin's subcommands exit

// The path of `name` in the directory of this program (the build's cmd/ directory).
std::string Beside(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? name : (self.parent_path() / name).string();
}

// Ends a subcommand's callback with an exit code (CLI11's idiom; main turns it into the code).
[[noreturn]] void Exit(int code) { throw CLI::RuntimeError(code); }

// "dgx-h100-like (default), dgx-roles"
std::string NodeNames() {
  std::string out;
  for (const std::string& name : NamedNodes()) {
    out += (out.empty() ? name + " (default)" : ", " + name);
  }
  return out;
}

void SetLogLevelOrExit(const std::string& command, const std::string& level) {
  if (!SetLogLevel(level)) {
    std::cerr << "rdma-device-plugin-sim " << command << ": unknown --log-level '" << level
              << "' (trace, debug, info, warn, error, off)\n";
    Exit(kExitUsage);
  }
}

void AddDemoCommand(CLI::App& app) {
  auto options = std::make_shared<DemoOptions>();
  options->plugin_binary = Beside("rdma-device-plugin");
  CLI::App* sub = app.add_subcommand(
      "demo",
      "Run rdma-device-plugin against a fixture node, this process playing the kubelet");
  CLI::Option* xml =
      sub->add_option("--topology-xml", options->topology_xml,
                      "hwloc XML of the node to simulate (default: the bundled dgx-h100-like node)")
          ->envname("RDP_TOPOLOGY_XML");
  sub->add_option("--node", options->node, "A bundled node by name: " + NodeNames())
      ->excludes(xml);
  sub->add_option("--work-dir", options->work_dir,
                  "Directory for the fake node and sockets (default: a temporary one, removed)");
  sub->add_flag("--metrics", options->metrics,
                "Also print a Prometheus scrape of the exclusive-mode plugin after its "
                "allocations");
  sub->add_option("--log-level", options->log_level, "The plugin's log level on stderr")
      ->envname("RDP_LOG_LEVEL")
      ->capture_default_str();
  sub->add_option("--plugin-binary", options->plugin_binary, "The rdma-device-plugin to run")
      ->capture_default_str();
  sub->callback([options] {
    SetLogLevelOrExit("demo", options->log_level);
    // The log on stderr is the plugin's; this process's own discovery of the node it lays out
    // would repeat its lines.
    SetLogLevel("warn");
    if (int code = RunDemo(*options, std::cout); code != 0) Exit(code);
  });
}

void AddFixtureCommand(CLI::App& app) {
  struct Flags {
    std::string topology_xml;
    std::string node;
    std::string out;
    std::string log_level = "info";
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "fixture",
      "Lay out fake sysfs and /dev trees for a node export or a bundled node: pass DIR as "
      "--sysfs-root and --dev-root");
  CLI::Option* xml =
      sub->add_option("--topology-xml", flags->topology_xml, "hwloc XML export of the node")
          ->envname("RDP_TOPOLOGY_XML");
  CLI::Option* node = sub->add_option(
      "--node", flags->node,
      "A bundled node by name instead (" + NodeNames() +
          "): its XML is written to DIR/<name>.xml and printed after DIR; pass it as "
          "--topology-xml");
  xml->excludes(node);
  sub->add_option("--out", flags->out, "Directory to write sys/ and dev/ under")->required();
  sub->add_option("--log-level", flags->log_level, "trace, debug, info, warn, error or off")
      ->envname("RDP_LOG_LEVEL")
      ->capture_default_str();
  sub->callback([flags] {
    SetLogLevelOrExit("fixture", flags->log_level);
    if (flags->topology_xml.empty() == flags->node.empty()) {
      std::cerr << "rdma-device-plugin-sim fixture: give --topology-xml or --node\n";
      Exit(kExitUsage);
    }
    if (!flags->node.empty()) {
      auto node = LayOutNamedNodeAt(flags->node, flags->out + "/" + flags->node + ".xml",
                                    flags->out);
      if (!node.ok()) {
        std::cerr << "rdma-device-plugin-sim fixture: cannot lay out node " << flags->node
                  << " under " << flags->out << ": " << node.status().message() << "\n";
        Exit(node.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : 1);
      }
      std::cout << node->root << "\n" << node->xml << "\n";
      return;
    }
    if (auto node = LayOutXml(flags->topology_xml, flags->out); !node.ok()) {
      std::cerr << "rdma-device-plugin-sim fixture: cannot lay out " << flags->topology_xml
                << " under " << flags->out << ": " << node.status().message() << "\n";
      Exit(1);
    }
    std::cout << flags->out << "\n";
  });
}

}  // namespace
}  // namespace rdp::sim

int main(int argc, char** argv) {
  CLI::App app{"Development tools of rdma-device-plugin, not shipped in its image: the demo and "
               "node fixtures.",
               "rdma-device-plugin-sim"};
  app.require_subcommand(1);
  rdp::sim::AddDemoCommand(app);
  rdp::sim::AddFixtureCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();
  } catch (const CLI::Error& e) {
    std::cerr << "rdma-device-plugin-sim: " << e.what() << "\n";
    return rdp::sim::kExitUsage;
  }
  return 0;
}
