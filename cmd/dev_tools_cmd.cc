#include "cmd/dev_tools_cmd.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "cmd/discovery_flags.h"

namespace rdp::cmd {
namespace {

constexpr char kSim[] = "rdma-device-plugin-sim";

// rdma-device-plugin-sim in the directory of this binary.
std::string SimBeside() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "" : (self.parent_path() / kSim).string();
}

// Replaces this process with `rdma-device-plugin-sim <name> <args...>`; returns only on failure.
[[noreturn]] void RunSim(const std::string& name, const std::vector<std::string>& args) {
  const std::string sim = SimBeside();
  if (sim.empty() || ::access(sim.c_str(), X_OK) != 0) {
    std::cerr << "rdma-device-plugin " << name << ": a development tool, not shipped in the image: "
              << "it runs " << kSim << " from the build tree (scripts/build.sh builds it beside "
              << "rdma-device-plugin), and there is none beside this binary"
              << (sim.empty() ? "" : " (" + sim + ")") << "\n";
    Exit(kExitUsage);
  }
  std::vector<std::string> argv_strings = {sim, name};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(sim.c_str(), argv.data());
  std::cerr << "rdma-device-plugin " << name << ": cannot run " << sim << ": "
            << std::strerror(errno) << "\n";
  Exit(1);
}

void AddDevToolCommand(CLI::App& app, const std::string& name, const std::string& description) {
  CLI::App* sub = app.add_subcommand(name, description);
  // Every argument, --help included, is the tool's.
  sub->prefix_command();
  sub->set_help_flag();
  sub->callback([sub, name] { RunSim(name, sub->remaining()); });
}

}  // namespace

void AddDevToolCommands(CLI::App& app) {
  AddDevToolCommand(app, "demo",
                    "Run the plugin against a fixture node and a kubelet simulator (a development "
                    "tool: runs rdma-device-plugin-sim demo, which the image does not ship)");
  AddDevToolCommand(app, "fixture", "Lay out fake sysfs and /dev trees for a node export");
  app.get_subcommand("fixture")->group("");  // hidden: a testing aid
}

}  // namespace rdp::cmd
