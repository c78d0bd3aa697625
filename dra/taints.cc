#include "dra/taints.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "dra/devices.h"
#include "hca/hca.h"

namespace rdp::dra {
namespace {

// The unusable state of an HCA whose ports are the reason: INIT or ARMED on a port with none
// ACTIVE means the link is up and waits for the subnet manager, which a DOWN port does not.
TaintedState PortState(const topology::Hca& hca) {
  const bool training =
      std::any_of(hca.ports.begin(), hca.ports.end(), [](const topology::Port& p) {
        return p.state == "INIT" || p.state == "ARMED";
      });
  return training ? TaintedState::kPortInit : TaintedState::kPortDown;
}

// The unusable state named by a reason of node::View::Verdict (keyed on its wording, and
// hca::Assess's; devices_test pins every class).
TaintedState UnusableState(const std::string& reason, const topology::Hca& hca) {
  if (absl::StartsWith(reason, "no port state")) return TaintedState::kNoPortState;
  if (absl::StartsWith(reason, "flapping")) return TaintedState::kFlapping;
  if (absl::StartsWith(reason, "the health scan failed")) return TaintedState::kScanFailed;
  if (absl::StartsWith(reason, "its RDMA driver is not bound")) return TaintedState::kDriverAway;
  if (absl::StartsWith(reason, "port ")) return PortState(hca);
  if (absl::StrContains(reason, "no uverbs")) return TaintedState::kNoUverbsDevice;
  if (absl::StartsWith(reason, "device node")) return TaintedState::kDeviceNodeMissing;
  return TaintedState::kUnusable;
}

}  // namespace

DeviceTaint TaintOf(TaintedState state, std::string_view driver_name) {
  auto unhealthy = [&](const char* value) {
    return DeviceTaint{UnhealthyTaintKey(driver_name), value, kEffectNoSchedule};
  };
  auto degraded = [&](const char* value) {
    return DeviceTaint{DegradedTaintKey(driver_name), value, kEffectNone};
  };
  switch (state) {
    case TaintedState::kPortInit: return unhealthy("PortInit");
    case TaintedState::kPortDown: return unhealthy("PortNotActive");
    case TaintedState::kNoPortState: return unhealthy("NoPortState");
    case TaintedState::kNoUverbsDevice: return unhealthy("NoUverbsDevice");
    case TaintedState::kDeviceNodeMissing: return unhealthy("DeviceNodeMissing");
    case TaintedState::kDriverAway: return unhealthy("DriverNotBound");
    case TaintedState::kScanFailed: return unhealthy("ScanFailed");
    case TaintedState::kFlapping: return unhealthy("Flapping");
    case TaintedState::kUnusable: return unhealthy("Unusable");
    case TaintedState::kSymbolErrors: return degraded("SymbolErrors");
    case TaintedState::kLinkDowned: return degraded("LinkDowned");
  }
  return unhealthy("Unusable");  // not reached: every state is listed above
}

std::optional<TaintedState> TaintedStateOf(const node::View& node, const topology::Hca& hca) {
  const hca::Verdict verdict = node.Verdict(hca);
  if (!verdict.usable) return UnusableState(verdict.reason, hca);
  const auto flagged = node.flagged.find(hca.place.pci);
  if (flagged == node.flagged.end() || !flagged->second.degraded) return std::nullopt;
  return flagged->second.degraded_counter == "link_downed" ? TaintedState::kLinkDowned
                                                           : TaintedState::kSymbolErrors;
}

}  // namespace rdp::dra
