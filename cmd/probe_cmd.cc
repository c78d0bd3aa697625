#include "cmd/probe_cmd.h"

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cmd/discovery_flags.h"
#include "cmd/flag_values.h"
#include "dra/model.h"
#include "dra/probe.h"
#include "deviceplugin/config.h"
#include "deviceplugin/probe.h"
#include "resources/config.h"

namespace rdp::cmd {

void AddProbeCommand(CLI::App& app) {
  struct Flags {
    std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
    std::string socket_name = "rdma-hca.sock";
    std::string timeout = "1s";
    bool dra = false;
    bool ready = false;
    std::string driver_name = dra::kDefaultDriverName;
    std::string config_file;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub =
      app.add_subcommand("probe", "Exit 0 when the running plugin answers on its socket");
  CLI::Option* kubelet_dir =
      sub->add_option("--kubelet-dir", f->kubelet_dir,
                      "The kubelet's device-plugin directory (with --dra: the kubelet's root "
                      "directory, default /var/lib/kubelet)")
          ->envname("RDP_KUBELET_DIR")
          ->capture_default_str();
  sub->add_flag("--dra", f->dra,
                "Probe the DRA driver (`dra`): GetInfo on its registration socket, then an "
                "empty NodeUnprepareResources on its DRA socket");
  sub->add_flag("--ready", f->ready,
                "With --dra: also require that the kubelet has registered the driver (the "
                "readiness probe: a driver the kubelet refused or has not registered yet is not "
                "ready)");
  sub->add_option("--driver-name", f->driver_name, "With --dra: the driver's name")
      ->envname("RDP_DRIVER_NAME")
      ->capture_default_str();
  sub->add_option("--socket-name", f->socket_name, "The plugin's socket file name")
      ->envname("RDP_SOCKET_NAME")
      ->capture_default_str();
  sub->add_option("--config", f->config_file,
                  "serve's resources file: probe every resource's socket (named as serve names "
                  "them from it and --socket-name)")
      ->envname("RDP_CONFIG");
  sub->add_option("--timeout", f->timeout, "How long to wait for the answer")
      ->envname("RDP_PROBE_TIMEOUT")
      ->capture_default_str();
  sub->callback([f, kubelet_dir] {
    absl::StatusOr<absl::Duration> timeout = DurationFlag("--timeout", f->timeout);
    if (!timeout.ok()) {
      std::cerr << "rdma-device-plugin probe: " << timeout.status().message() << "\n";
      Exit(kExitUsage);
    }
    if (f->ready && !f->dra) {
      std::cerr << "rdma-device-plugin probe: --ready needs --dra\n";
      Exit(kExitUsage);
    }
    if (f->dra) {
      const std::string root = kubelet_dir->count() > 0 ? f->kubelet_dir : "/var/lib/kubelet";
      absl::Status status = dra::Probe(root, f->driver_name, *timeout, f->ready);
      if (!status.ok()) {
        std::cerr << "rdma-device-plugin probe: " << status.message() << "\n";
        Exit(1);
      }
      std::cout << "ok: " << dra::RegistrationSocket(root, f->driver_name) << " answers"
                << (f->ready ? ", registered with the kubelet" : "") << "\n";
      return;
    }
    deviceplugin::Config config;
    config.kubelet_dir = f->kubelet_dir;
    config.socket_name = f->socket_name;
    std::vector<resources::Resource> served;
    if (!f->config_file.empty()) {
      absl::StatusOr<resources::Config> file = resources::LoadConfig(f->config_file);
      if (!file.ok()) {
        std::cerr << "rdma-device-plugin probe: --config: " << file.status().message() << "\n";
        Exit(kExitUsage);
      }
      served = std::move(file->resources);
    }
    for (const std::string& socket : deviceplugin::SocketNames(config, served)) {
      const std::string path = (std::filesystem::path(f->kubelet_dir) / socket).string();
      absl::Status status = deviceplugin::Probe(path, *timeout);
      if (!status.ok()) {
        std::cerr << "rdma-device-plugin probe: " << status.message() << "\n";
        Exit(1);
      }
      std::cout << "ok: " << path << " answers\n";
    }
  });
}

}  // namespace rdp::cmd
