#include "cmd/check_cmd.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/log.h"
#include "check/container_check.h"
#include "cmd/discovery_flags.h"

namespace rdp::cmd {
namespace {

std::optional<std::string> Env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// The process's environment, "NAME=VALUE" entries in their order.
std::vector<std::string> Environ() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

}  // namespace

void AddCheckCommand(CLI::App& app) {
  struct Flags {
    check::CheckOptions options;
    std::string log_level = "warn";
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "check",
      "Run inside a workload container: list the HCAs it can open and compare them with its "
      "allocation (RDMA_HCA_NAMES and RDMA_HCA_NAMES_*, or NCCL_IB_HCA); say whether "
      "GPUDirect RDMA can work here and why not, and the locked-memory limit. Exit 0 equal, 1 "
      "different, 2 bad flags");
  sub->add_option("--sysfs-root", flags->options.sysfs_root, "Root under which sys/ is read")
      ->envname("RDP_SYSFS_ROOT")
      ->capture_default_str();
  sub->add_option("--dev-root", flags->options.dev_root,
                  "Root under which dev/infiniband is opened")
      ->envname("RDP_DEV_ROOT")
      ->capture_default_str();
  sub->add_option("--proc-root", flags->options.proc_root,
                  "Root under which proc/ is read (GPUDirect RDMA's signals)")
      ->envname("RDP_PROC_ROOT")
      ->capture_default_str();
  sub->add_flag("--json", flags->options.json, "Write the report as JSON");
  sub->add_flag("--require-gpudirect", flags->options.require_gpudirect,
                "Exit 1 also when GPUDirect RDMA cannot work in this container");
  sub->add_option("--log-level", flags->log_level, "trace, debug, info, warn, error or off")
      ->envname("RDP_LOG_LEVEL")
      ->capture_default_str();
  sub->callback([flags] {
    if (!SetLogLevel(flags->log_level)) {
      std::cerr << "rdma-device-plugin check: --log-level: unknown level '" << flags->log_level
                << "'\n";
      Exit(kExitUsage);
    }
    if (struct rlimit limit; ::getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
      flags->options.memlock = limit.rlim_cur == RLIM_INFINITY
                                   ? ~std::uint64_t{0}
                                   : static_cast<std::uint64_t>(limit.rlim_cur);
    }
    const int code = check::RunCheck(flags->options, check::AllocatedHcaNames(Environ()),
                                     Env("NCCL_IB_HCA"),
                              std::cout, std::cerr);
    std::cout.flush();
    if (code != 0) Exit(code);
  });
}

}  // namespace rdp::cmd
