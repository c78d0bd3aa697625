#include "cmd/fixture_cmd.h"

#include <iostream>
#include <memory>

#include "cmd/discovery_flags.h"
#include "base/log.h"
#include "sim/sysfs_fixture.h"

namespace rdp::cmd {

void AddFixtureCommand(CLI::App& app) {
  struct Flags {
    DiscoveryFlags discovery;
    std::string out;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("fixture", "Lay out fake sysfs and /dev trees for a node export");
  sub->group("");  // hidden
  flags->discovery.Register(sub);
  sub->add_option("--out", flags->out, "Directory to write sys/ and dev/ under")->required();
  sub->callback([flags] {
    topology::TopologyPtr topo = flags->discovery.DiscoverOrExit();
    sim::SysfsFixture fixture(flags->out);
    if (absl::Status st = fixture.AddTopology(*topo); !st.ok()) {
      Logger("cmd")->error("cannot write fixture under {}: {}", flags->out, std::string(st.message()));
      Exit(1);
    }
    std::cout << flags->out << "\n";
  });
}

}  // namespace rdp::cmd
