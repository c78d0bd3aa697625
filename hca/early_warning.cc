#include "hca/early_warning.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace rdp::hca {
namespace {

std::string Describe(const std::string& name, const std::string& pci) {
  return absl::StrCat(name, " (PCI=", pci, ")");
}

}  // namespace

absl::Status ValidateEarlyWarning(const EarlyWarningConfig& c) {
  for (const auto& [flag, d] : {std::make_pair("--degraded-window", c.window),
                                std::make_pair("--flap-window", c.flap_window),
                                std::make_pair("--flap-stable", c.stable_for)}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " '", absl::FormatDuration(d), "': not a positive duration"));
    }
  }
  if (c.max_flaps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--flap-count ", c.max_flaps, ": negative"));
  }
  return absl::OkStatus();
}

HcaObservation Observe(const topology::Hca& hca, std::map<int, PortErrors> errors) {
  HcaObservation o;
  o.pci = hca.place.pci;
  o.name = hca.name;
  for (const topology::Port& p : hca.ports) o.active[p.number] = p.Active();
  o.errors = std::move(errors);
  return o;
}

std::uint64_t EarlyWarning::Add(std::deque<Sample>& samples, absl::Time now,
                                std::uint64_t value) const {
  if (!samples.empty() && value < samples.back().value) samples.clear();  // reset
  const std::uint64_t grew = samples.empty() ? 0 : value - samples.back().value;
  samples.push_back({now, value});
  while (samples.front().at < now - config_.window) samples.pop_front();
  return grew;
}

EarlyWarningStatus EarlyWarning::Assess(HcaHistory& h, absl::Time now) const {
  EarlyWarningStatus s;
  // Degraded: the first port and counter over its threshold, in port order.
  for (const auto& [number, port] : h.ports) {
    for (const auto& [counter, samples, limit] :
         {std::make_tuple("symbol_error", &port.symbol_error, config_.symbol_errors),
          std::make_tuple("link_downed", &port.link_downed, config_.link_downed)}) {
      // Between the first sample within the window and the last (a counter no longer read
      // keeps its old samples: only those within the window count).
      auto first = std::find_if(samples->begin(), samples->end(), [&](const Sample& x) {
        return x.at >= now - config_.window;
      });
      if (first == samples->end()) continue;
      const std::uint64_t grew = samples->back().value - first->value;
      if (grew > limit && !s.degraded) {
        s.degraded = true;
        s.degraded_counter = counter;
        s.degraded_reason =
            absl::StrCat("port ", number, "'s ", counter, " grew by ", grew, " within ",
                         absl::FormatDuration(config_.window), " (more than ", limit, ")");
      }
    }
  }
  // Held: once more than max_flaps flaps fall within the flap window, until stable_for passes
  // without one; then the history starts again.
  while (!h.flaps.empty() && h.flaps.front() < now - config_.flap_window) h.flaps.pop_front();
  if (h.status.held) {
    const absl::Time last = h.flaps.empty() ? absl::InfinitePast() : h.flaps.back();
    if (now - last < config_.stable_for) {
      s.held = true;
      s.held_reason = h.status.held_reason;
    } else {
      h.flaps.clear();
    }
  } else if (static_cast<int>(h.flaps.size()) > config_.max_flaps) {
    s.held = true;
    s.held_reason = absl::StrCat("its ports flapped ", h.flaps.size(), " times within ",
                                 absl::FormatDuration(config_.flap_window), " (more than ",
                                 config_.max_flaps, ")");
  }
  return s;
}

std::vector<std::string> EarlyWarning::Update(absl::Time now,
                                              const std::vector<HcaObservation>& hcas) {
  std::vector<std::string> lines;
  std::map<std::string, HcaHistory> next;
  for (const HcaObservation& o : hcas) {
    HcaHistory h;
    if (auto it = hcas_.find(o.pci); it != hcas_.end()) h = std::move(it->second);
    h.name = o.name;
    int flaps = 0;
    std::map<int, PortHistory> ports;
    for (const auto& [number, active] : o.active) {
      PortHistory& port = ports[number];
      if (auto it = h.ports.find(number); it != h.ports.end()) port = std::move(it->second);
      std::uint64_t downed_now = 0;
      if (auto e = o.errors.find(number); e != o.errors.end()) {
        if (e->second.symbol_error) Add(port.symbol_error, now, *e->second.symbol_error);
        if (e->second.link_downed) downed_now = Add(port.link_downed, now, *e->second.link_downed);
      }
      const bool went_down = port.active.value_or(false) && !active;
      // A link that went down and came back between two polls shows only in link_downed; one
      // seen going down is the same event as the count it adds.
      flaps += static_cast<int>(std::max<std::uint64_t>(went_down ? 1 : 0, downed_now));
      port.active = active;
    }
    h.ports = std::move(ports);
    for (int i = 0; i < flaps; ++i) h.flaps.push_back(now);
    const EarlyWarningStatus before = h.status;
    h.status = Assess(h, now);
    const std::string who = Describe(o.name, o.pci);
    if (h.status.degraded && !before.degraded) {
      lines.push_back(absl::StrCat("HCA ", who, " is degraded: ", h.status.degraded_reason,
                                   "; new pods get other HCAs while there are any"));
    } else if (!h.status.degraded && before.degraded) {
      lines.push_back(absl::StrCat("HCA ", who, " is no longer degraded: its error counters grew "
                                   "no faster than the thresholds within ",
                                   absl::FormatDuration(config_.window)));
    }
    if (h.status.held && !before.held) {
      lines.push_back(absl::StrCat("HCA ", who, " is flapping: ", h.status.held_reason,
                                   "; unhealthy until stable for ",
                                   absl::FormatDuration(config_.stable_for)));
    } else if (!h.status.held && before.held) {
      lines.push_back(absl::StrCat("HCA ", who, " has been stable for ",
                                   absl::FormatDuration(config_.stable_for),
                                   ": no longer held unhealthy"));
    }
    next[o.pci] = std::move(h);
  }
  hcas_ = std::move(next);
  return lines;
}

EarlyWarningStatus EarlyWarning::Status(const std::string& pci) const {
  auto it = hcas_.find(pci);
  return it == hcas_.end() ? EarlyWarningStatus{} : it->second.status;
}

Verdict AssessWithHistory(const topology::Hca& hca, const FlaggedHcas& flagged) {
  Verdict v = Assess(hca);
  const auto it = flagged.find(hca.place.pci);
  if (v.usable && it != flagged.end() && it->second.held) {
    v.usable = false;
    v.reason = absl::StrCat("flapping: ", it->second.held_reason);
  }
  return v;
}

EarlyWarningMonitor::EarlyWarningMonitor(EarlyWarningConfig config, std::string logger)
    : config_(config), logger_(std::move(logger)), rule_(config) {}

bool EarlyWarningMonitor::Poll(const std::vector<topology::Hca>& scanned, Env& env,
                               absl::Time now) {
  std::vector<HcaObservation> observed;
  observed.reserve(scanned.size());
  // Outside the lock: on mlx5 each counter file is a firmware query.
  for (const topology::Hca& h : scanned) observed.push_back(Observe(h, topology::ReadPortErrors(env, h)));
  absl::MutexLock lock(&mu_);
  const std::vector<std::string> lines = rule_.Update(now, observed);
  for (const std::string& line : lines) Logger(logger_)->warn("{}", line);
  flagged_.clear();
  for (const HcaObservation& o : observed) {
    const EarlyWarningStatus s = rule_.Status(o.pci);
    if (s.degraded || s.held) flagged_[o.pci] = s;
  }
  return !lines.empty();
}

FlaggedHcas EarlyWarningMonitor::Flagged() const {
  absl::MutexLock lock(&mu_);
  return flagged_;
}

}  // namespace rdp::hca
