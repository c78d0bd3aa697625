#include "cmd/topology_cmd.h"

#include <iostream>
#include <memory>

#include "cmd/discovery_flags.h"
#include "base/log.h"
#include "topology/report.h"

namespace rdp::cmd {

void AddTopologyCommand(CLI::App& app) {
  struct Flags {
    DiscoveryFlags discovery;
    bool json = false;
    bool dot = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "topology", "Show the node's HCAs, GPUs and the PCIe path class between each pair");
  flags->discovery.Register(sub);
  auto* json = sub->add_flag("--json", flags->json, "Write the snapshot as JSON");
  sub->add_flag("--dot", flags->dot, "Write the PCIe tree as Graphviz")->excludes(json);
  sub->callback([flags] {
    topology::TopologyPtr topo = flags->discovery.DiscoverOrExit();
    if (flags->json) {
      std::cout << topology::ToJson(*topo).dump(2) << "\n";
    } else if (flags->dot) {
      std::cout << topology::RenderDot(*topo);
    } else {
      std::cout << topology::RenderMatrix(*topo);
    }
  });
}

}  // namespace rdp::cmd
