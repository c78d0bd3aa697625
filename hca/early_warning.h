#pragma once

// Early-warning health: links that degrade before they go down. hca::Assess says whether an HCA
// can be handed out now; this says what its recent history adds, from one observation per health
// poll (port states and error counters), with the time passed in (no clock here):
//
// - Degraded: a port's symbol_error counter grew by more than symbol_errors, or its link_downed
//   counter by more than link_downed, within the last `window`. An HCA with a degraded port is
//   degraded: still usable (pods holding it keep it), but new pods should get others (the device
//   plugin prefers others in GetPreferredAllocation; the DRA driver taints it, effect None). It
//   clears by itself once the growth within the window is no longer above the threshold. A
//   counter that goes backwards (a driver reload, a counter reset) starts its history again.
// - Flapping: a port flaps when it was ACTIVE at one observation and is not at the next, or when
//   its link_downed counter grew (the link went down and came back between two polls). An HCA
//   whose ports flapped more than max_flaps times within flap_window is held unhealthy (not
//   usable, whatever Assess says) until it has been stable (no flap) for stable_for.
//
// EarlyWarning is pure: no I/O; the caller reads the counters (topology::ReadPortErrors). Not
// thread-safe: one health poll drives it. EarlyWarningMonitor is the rule on a node as both
// doors' health polls run it: it reads the counters, logs, and answers readers on other threads.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/env.h"
#include "topology/port_counters.h"
#include "hca/hca.h"
#include "topology/topology.h"

namespace rdp::hca {

struct EarlyWarningConfig {
  std::uint64_t symbol_errors = 10;  // more than this growth within `window`: degraded
  std::uint64_t link_downed = 1;
  absl::Duration window = absl::Minutes(10);
  int max_flaps = 3;  // more than this many flaps within flap_window: held unhealthy
  absl::Duration flap_window = absl::Minutes(10);
  absl::Duration stable_for = absl::Minutes(10);
};

// InvalidArgument naming the flag (--degraded-window, --flap-count, ...) for a config that
// cannot work: a window that is not positive, a negative flap count.
absl::Status ValidateEarlyWarning(const EarlyWarningConfig& config);

// A port's error counters as read at one poll (topology::ReadPortErrors).
using PortErrors = topology::PortErrors;

// One HCA at one poll.
struct HcaObservation {
  std::string pci;
  std::string name;
  std::map<int, bool> active;       // port -> ACTIVE
  std::map<int, PortErrors> errors;  // port -> counters
};

// The observation of `hca` (its ports' states from the scan) with `errors` (by port).
HcaObservation Observe(const topology::Hca& hca, std::map<int, PortErrors> errors);

struct EarlyWarningStatus {
  bool degraded = false;
  std::string degraded_reason;  // "port 1's symbol_error grew by 25 within 10m (more than 10)"
  std::string degraded_counter;  // "symbol_error" or "link_downed": the first that crossed
  bool held = false;             // flapping: held unhealthy
  std::string held_reason;       // "its ports flapped 4 times within 10m (more than 3); ..."
  bool operator==(const EarlyWarningStatus& o) const {
    return degraded == o.degraded && degraded_reason == o.degraded_reason && held == o.held &&
           held_reason == o.held_reason;
  }
};

class EarlyWarning {
 public:
  explicit EarlyWarning(EarlyWarningConfig config) : config_(config) {}

  // One poll's observations at `now` (not before the previous one's). An HCA not observed is
  // forgotten. Returns one line per HCA whose degraded or held state changed, for the log.
  std::vector<std::string> Update(absl::Time now, const std::vector<HcaObservation>& hcas);

  // The HCA's state after the last Update; all false for an HCA not observed.
  EarlyWarningStatus Status(const std::string& pci) const;

  const EarlyWarningConfig& config() const { return config_; }

 private:
  struct Sample {
    absl::Time at;
    std::uint64_t value;
  };
  struct PortHistory {
    std::deque<Sample> symbol_error;
    std::deque<Sample> link_downed;
    std::optional<bool> active;  // at the last observation
  };
  struct HcaHistory {
    std::string name;
    std::map<int, PortHistory> ports;
    std::deque<absl::Time> flaps;
    EarlyWarningStatus status;
  };

  // Adds a sample and drops those older than the window; a counter that went backwards starts
  // its history again. Returns the growth since the previous sample.
  std::uint64_t Add(std::deque<Sample>& samples, absl::Time now, std::uint64_t value) const;
  EarlyWarningStatus Assess(HcaHistory& h, absl::Time now) const;

  const EarlyWarningConfig config_;
  std::map<std::string, HcaHistory> hcas_;  // by PCI address
};

// The HCAs the rule flags (degraded or held), by PCI address.
using FlaggedHcas = std::map<std::string, EarlyWarningStatus>;

// Assess(hca) with the rule's history: not usable while the rule holds the HCA (its ports
// flapped), with the reason "flapping: <held_reason>". A degraded HCA stays usable.
Verdict AssessWithHistory(const topology::Hca& hca, const FlaggedHcas& flagged);

// The rule on a node, for a door's health poll: Poll reads the scanned HCAs' error counters
// through `env` (topology::ReadPortErrors), updates the rule at `now` and logs each change
// (EarlyWarning::Update's lines) as a warning on the logger `logger`. Thread-safe: one health
// poll calls Poll; RPCs, publications and scrapes read.
class EarlyWarningMonitor {
 public:
  EarlyWarningMonitor(EarlyWarningConfig config, std::string logger);

  // One poll of `scanned` (the HCAs as the health scan saw them; those not in it are forgotten).
  // True when an HCA's degraded or held state changed.
  bool Poll(const std::vector<topology::Hca>& scanned, Env& env, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The HCAs that are degraded or held now, by PCI address; the others are clear.
  FlaggedHcas Flagged() const ABSL_LOCKS_EXCLUDED(mu_);

  const EarlyWarningConfig& config() const { return config_; }

 private:
  const EarlyWarningConfig config_;
  const std::string logger_;
  mutable absl::Mutex mu_;
  EarlyWarning rule_ ABSL_GUARDED_BY(mu_);
  FlaggedHcas flagged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdp::hca
