#include "cmd/dra_cmd.h"

#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/log.h"
#include "cmd/discovery_flags.h"
#include "dra/devices.h"
#include "dra/kernel_pci.h"
#include "dra/slices.h"
#include "node/node.h"
#include "resources/config.h"

namespace rdp::cmd {
namespace {

struct SlicesFlags {
  DiscoveryFlags discovery;
  std::string node_name;
  std::string driver_name = dra::kDefaultDriverName;
  std::string mode = "exclusive";
  int shared_devices = static_cast<int>(dra::kDefaultSharedUnits);
};

struct SlicesSettings {
  dra::DeviceOptions devices;
  std::string node_name;
};

absl::StatusOr<SlicesSettings> Settings(const SlicesFlags& f) {
  SlicesSettings s;
  s.node_name = f.node_name.empty() ? HostNodeName() : f.node_name;
  if (absl::Status st = dra::ValidateNodeName(s.node_name); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--node-name", f.node_name.empty() ? " (default: the host name)" : "", ": ", st.message()));
  }
  if (absl::Status st = dra::ValidateDriverName(f.driver_name); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--driver-name: ", st.message()));
  }
  s.devices.driver_name = f.driver_name;
  absl::StatusOr<hca::Mode> mode = hca::ParseMode(f.mode);
  if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--mode: ", mode.status().message()));
  s.devices.mode = *mode;
  absl::StatusOr<std::int64_t> units = SharedUnitsFlag(f.shared_devices);
  if (!units.ok()) return units.status();
  s.devices.shared_units = *units;
  return s;
}

void PrintSlices(const SlicesFlags& f) {
  absl::StatusOr<SlicesSettings> s = Settings(f);
  if (!s.ok()) {
    Logger("cmd")->error("{}", std::string(s.status().message()));
    Exit(kExitUsage);
  }
  topology::TopologyPtr topo = f.discovery.DiscoverOrExit();
  // The standard attributes come from the kernel's view when there is a sysfs to read: not for
  // an XML given alone, which describes another machine than this one's /sys.
  if (!f.discovery.sysfs_root.empty() || f.discovery.topology_xml.empty()) {
    NodeRoots roots;
    roots.sysfs = f.discovery.sysfs_root.empty() ? "/" : f.discovery.sysfs_root;
    roots.dev = f.discovery.dev_root.empty() ? "/" : f.discovery.dev_root;
    s->devices.kernel = dra::ReadKernelPci(*NewNodeEnv(roots), *topo);
  }
  dra::PoolMeta meta;
  meta.driver = s->devices.driver_name;
  meta.node_name = s->node_name;
  meta.generation = 1;
  const nlohmann::json list = {
      {"apiVersion", "v1"},
      {"kind", "List"},
      {"items", dra::BuildResourceSlices(dra::BuildDevices(*node::View::Of(topo), s->devices), meta)},
  };
  // replace: a name read from sysfs that is not UTF-8 must not make dump() throw.
  std::cout << list.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

std::string HostNodeName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  return absl::AsciiStrToLower(host);
}

absl::StatusOr<std::int64_t> SharedUnitsFlag(int units) {
  if (units < 1 || units > resources::kMaxSharedDevices) {
    return absl::InvalidArgumentError(absl::StrCat("--shared-devices '", units, "': must be 1..",
                                                   resources::kMaxSharedDevices));
  }
  return units;
}

CLI::App* AddDraCommand(CLI::App& app) {
  CLI::App* dra = app.add_subcommand(
      "dra", "The DRA (Dynamic Resource Allocation, resource.k8s.io/v1) driver mode");
  dra->require_subcommand(0, 1);

  auto flags = std::make_shared<SlicesFlags>();
  CLI::App* slices = dra->add_subcommand(
      "slices", "Print the ResourceSlices this node would publish, as a JSON List (no API server)");
  flags->discovery.Register(slices);
  slices->add_option("--node-name", flags->node_name, "This node's name (default: the host name)")
      ->envname("NODE_NAME");
  slices->add_option("--driver-name", flags->driver_name,
                     "The DRA driver's name: spec.driver and the domain of its attributes")
      ->capture_default_str();
  slices->add_option("--mode", flags->mode,
                     "exclusive (one claim per HCA) or shared (any number of claims per HCA)")
      ->capture_default_str();
  slices->add_option("--shared-devices", flags->shared_devices,
                     "Shared mode: the claims one HCA serves at most (its pods capacity)")
      ->capture_default_str();
  slices->callback([flags] { PrintSlices(*flags); });
  return dra;
}

}  // namespace rdp::cmd
