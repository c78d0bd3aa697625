#include "cmd/discovery_flags.h"

#include "base/log.h"

namespace rdp::cmd {

void DiscoveryFlags::Register(CLI::App* app) {
  app->add_option("--sysfs-root", sysfs_root,
                  "Root under which sys/ is read (default: the live /; with --topology-xml and "
                  "no --sysfs-root, HCAs come from the XML)")
      ->envname("RDP_SYSFS_ROOT");
  app->add_option("--dev-root", dev_root, "Root under which dev/infiniband is checked")
      ->envname("RDP_DEV_ROOT")
      ->capture_default_str();
  app->add_option("--topology-xml", topology_xml,
                  "hwloc XML export to take the PCI tree from instead of live discovery")
      ->envname("RDP_TOPOLOGY_XML");
  app->add_option("--gpu-classes", gpu_classes,
                  "PCI classes that are GPUs (0x0302 from any vendor, the rest only from "
                  "--gpu-vendors)")
      ->envname("RDP_GPU_CLASSES")
      ->capture_default_str();
  app->add_option("--gpu-vendors", gpu_vendors, "PCI vendor IDs of GPU makers")
      ->envname("RDP_GPU_VENDORS")
      ->capture_default_str();
  app->add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->envname("RDP_LOG_LEVEL")
      ->capture_default_str();
}

absl::StatusOr<topology::DiscoveryOptions> DiscoveryFlags::Options() const {
  if (!SetLogLevel(log_level)) {
    return absl::InvalidArgumentError("--log-level: unknown level '" + log_level +
                                      "' (trace, debug, info, warn, error, off)");
  }
  topology::DiscoveryOptions o;
  o.sysfs_root = sysfs_root;
  o.dev_root = dev_root.empty() ? "/" : dev_root;
  o.topology_xml = topology_xml;
  auto classes = topology::ParseHexList(gpu_classes);
  if (!classes.ok()) return absl::InvalidArgumentError("--gpu-classes: " + std::string(classes.status().message()));
  auto vendors = topology::ParseHexList(gpu_vendors);
  if (!vendors.ok()) return absl::InvalidArgumentError("--gpu-vendors: " + std::string(vendors.status().message()));
  o.gpu_classes = *classes;
  o.gpu_vendors = *vendors;
  // Subcommands parse flags before they start any thread: the moment to set hwloc's root.
  if (absl::Status s = topology::PrepareHwloc(o); !s.ok()) {
    return absl::InvalidArgumentError("--sysfs-root: " + std::string(s.message()));
  }
  return o;
}

topology::TopologyPtr DiscoveryFlags::DiscoverOrExit() const {
  auto options = Options();
  if (!options.ok()) {
    Logger("cmd")->error("{}", std::string(options.status().message()));
    Exit(kExitUsage);
  }
  auto topo = topology::Discover(*options);
  if (!topo.ok()) {
    Logger("cmd")->error("discovery failed: {}", std::string(topo.status().message()));
    Exit(1);
  }
  return *topo;
}

void Exit(int code) { throw CLI::RuntimeError(code); }

}  // namespace rdp::cmd
