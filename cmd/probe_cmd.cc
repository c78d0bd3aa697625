#include "cmd/probe_cmd.h"

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "cmd/discovery_flags.h"
#include "server/probe.h"

namespace rdp::cmd {

void AddProbeCommand(CLI::App& app) {
  struct Flags {
    std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
    std::string socket_name = "rdma-hca.sock";
    std::string timeout = "1s";
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub =
      app.add_subcommand("probe", "Exit 0 when the running plugin answers on its socket");
  sub->add_option("--kubelet-dir", f->kubelet_dir, "The kubelet's device-plugin directory")
      ->envname("RDP_KUBELET_DIR")
      ->capture_default_str();
  sub->add_option("--socket-name", f->socket_name, "The plugin's socket file name")
      ->envname("RDP_SOCKET_NAME")
      ->capture_default_str();
  sub->add_option("--timeout", f->timeout, "How long to wait for the answer")
      ->envname("RDP_PROBE_TIMEOUT")
      ->capture_default_str();
  sub->callback([f] {
    absl::Duration timeout;
    if (!absl::ParseDuration(f->timeout, &timeout) || timeout <= absl::ZeroDuration()) {
      std::cerr << "rdma-device-plugin probe: --timeout '" << f->timeout
                << "': not a positive duration such as 1s\n";
      Exit(kExitUsage);
    }
    const std::string path = (std::filesystem::path(f->kubelet_dir) / f->socket_name).string();
    absl::Status status = server::Probe(path, timeout);
    if (!status.ok()) {
      std::cerr << "rdma-device-plugin probe: " << status.message() << "\n";
      Exit(1);
    }
    std::cout << "ok: " << path << " answers\n";
  });
}

}  // namespace rdp::cmd
