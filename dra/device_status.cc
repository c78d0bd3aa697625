#include "dra/device_status.h"

#include "absl/strings/ascii.h"
#include "dra/devices.h"

namespace rdp::dra {
namespace {

// AllocatedDeviceStatus.networkData's limits (k8s.io/api resource/v1 types.go).
constexpr std::size_t kMaxInterfaceName = 256;
constexpr std::size_t kMaxHardwareAddress = 128;

}  // namespace

nlohmann::json AllocatedDeviceStatus(const std::string& driver, const std::string& pool,
                                     const topology::Hca& hca, Env& env) {
  nlohmann::json data = {{"hcaName", hca.name}};
  if (!hca.uverbs.empty()) data["uverbs"] = "/dev/infiniband/" + hca.uverbs;
  nlohmann::json out = {{"driver", driver}, {"pool", pool}, {"device", DeviceName(hca)},
                        {"data", std::move(data)}};
  if (!hca.netdevs.empty() && hca.netdevs.front().size() <= kMaxInterfaceName) {
    const std::string& netdev = hca.netdevs.front();
    nlohmann::json network = {{"interfaceName", netdev}};
    std::optional<std::string> address = env.ReadFile(
        "/sys/bus/pci/devices/" + hca.place.pci + "/net/" + netdev + "/address", 256);
    if (address) {
      std::string a(absl::StripAsciiWhitespace(*address));
      if (!a.empty() && a.size() <= kMaxHardwareAddress) network["hardwareAddress"] = a;
    }
    out["networkData"] = std::move(network);
  }
  return out;
}

}  // namespace rdp::dra
