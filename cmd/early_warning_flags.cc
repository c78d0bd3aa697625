#include "cmd/early_warning_flags.h"

#include "absl/time/time.h"
#include "cmd/flag_values.h"

namespace rdp::cmd {

void EarlyWarningFlags::Register(CLI::App* app) {
  app->add_option("--degraded-symbol-errors", symbol_errors,
                  "An HCA port whose symbol_error counter grows by more than this within "
                  "--degraded-window makes the HCA degraded: still served, new pods get others")
      ->envname("RDP_DEGRADED_SYMBOL_ERRORS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--degraded-link-downed", link_downed,
                  "The same for a port's link_downed counter")
      ->envname("RDP_DEGRADED_LINK_DOWNED")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--degraded-window", window, "The window of the degraded rule")
      ->envname("RDP_DEGRADED_WINDOW")
      ->capture_default_str();
  app->add_option("--flap-count", flap_count,
                  "An HCA whose ports flapped more than this many times within --flap-window is "
                  "unhealthy until stable for --flap-stable")
      ->envname("RDP_FLAP_COUNT")
      ->capture_default_str();
  app->add_option("--flap-window", flap_window, "The window of the flap rule")
      ->envname("RDP_FLAP_WINDOW")
      ->capture_default_str();
  app->add_option("--flap-stable", flap_stable,
                  "How long a flapping HCA must go without a flap to be healthy again")
      ->envname("RDP_FLAP_STABLE")
      ->capture_default_str();
}

absl::StatusOr<hca::EarlyWarningConfig> EarlyWarningFlags::Config() const {
  hca::EarlyWarningConfig c;
  c.symbol_errors = symbol_errors;
  c.link_downed = link_downed;
  c.max_flaps = flap_count;
  for (const auto& [flag, text, out] :
       {std::make_tuple("--degraded-window", &window, &c.window),
        std::make_tuple("--flap-window", &flap_window, &c.flap_window),
        std::make_tuple("--flap-stable", &flap_stable, &c.stable_for)}) {
    absl::StatusOr<absl::Duration> d = DurationFlag(flag, *text, /*positive=*/false);
    if (!d.ok()) return d.status();
    *out = *d;
  }
  if (absl::Status s = hca::ValidateEarlyWarning(c); !s.ok()) return s;
  return c;
}

}  // namespace rdp::cmd
