#pragma once

// The early-warning health flags (hca/early_warning.h, docs/server.md "Early-warning health"),
// which both serving subcommands (serve, dra) take, each also an environment variable:
// --degraded-symbol-errors (RDP_DEGRADED_SYMBOL_ERRORS), --degraded-link-downed,
// --degraded-window, --flap-count, --flap-window, --flap-stable.

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "hca/early_warning.h"

namespace rdp::cmd {

struct EarlyWarningFlags {
  std::uint64_t symbol_errors = hca::EarlyWarningConfig().symbol_errors;
  std::uint64_t link_downed = hca::EarlyWarningConfig().link_downed;
  std::string window = absl::FormatDuration(hca::EarlyWarningConfig().window);
  int flap_count = hca::EarlyWarningConfig().max_flaps;
  std::string flap_window = absl::FormatDuration(hca::EarlyWarningConfig().flap_window);
  std::string flap_stable = absl::FormatDuration(hca::EarlyWarningConfig().stable_for);

  void Register(CLI::App* app);
  // The validated rule; InvalidArgument naming the flag.
  absl::StatusOr<hca::EarlyWarningConfig> Config() const;
};

}  // namespace rdp::cmd
