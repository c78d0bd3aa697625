#include "dra/kernel_pci.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rdp::dra {
namespace {

bool LowerHex(std::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

}  // namespace

bool IsStandardBdf(std::string_view pci) {
  return pci.size() == 12 && pci[4] == ':' && pci[7] == ':' && pci[10] == '.' &&
         LowerHex(pci.substr(0, 4)) && LowerHex(pci.substr(5, 2)) && LowerHex(pci.substr(8, 2)) &&
         LowerHex(pci.substr(11, 1));
}

std::optional<KernelPci> ReadKernelPci(Env& env, std::string_view pci) {
  if (!IsStandardBdf(pci)) return std::nullopt;
  const std::string link = "/sys/bus/pci/devices/" + std::string(pci);
  const std::optional<std::string> target = env.Resolve(link);
  // The helpers check the same two things of the link's target: under devices/pci, ending in
  // the address.
  constexpr std::string_view kDevices = "/sys/devices/";
  if (!target || target->compare(0, kDevices.size(), kDevices) != 0 ||
      target->compare(kDevices.size(), 3, "pci") != 0 || target->size() < pci.size() + 1 ||
      target->compare(target->size() - pci.size() - 1, std::string::npos,
                      "/" + std::string(pci)) != 0) {
    return std::nullopt;
  }
  KernelPci out;
  const std::size_t end = target->find('/', kDevices.size());
  out.pcie_root = target->substr(kDevices.size(), end - kDevices.size());
  int numa = -1;
  if (auto text = ReadAttribute(env, absl::StrCat(link, "/numa_node"));
      text && absl::SimpleAtoi(*text, &numa) && numa >= 0) {
    out.numa = numa;
  }
  return out;
}

std::map<std::string, KernelPci> ReadKernelPci(Env& env, const topology::Topology& topo) {
  std::map<std::string, KernelPci> out;
  for (const topology::Hca& hca : topo.hcas()) {
    if (auto view = ReadKernelPci(env, hca.place.pci)) out.emplace(hca.place.pci, *view);
  }
  return out;
}

}  // namespace rdp::dra
