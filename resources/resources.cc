#include "resources/resources.h"

#include <fnmatch.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace rdp::resources {
namespace {

bool AnyEqual(const std::vector<std::string>& values, const std::string& s) {
  return std::find(values.begin(), values.end(), s) != values.end();
}

bool AnyEqualIgnoringCase(const std::vector<std::string>& values, const std::string& s) {
  return std::any_of(values.begin(), values.end(),
                     [&](const std::string& v) { return absl::EqualsIgnoreCase(v, s); });
}

bool AnyGlob(const std::vector<std::string>& globs, const std::string& s) {
  return std::any_of(globs.begin(), globs.end(), [&](const std::string& g) {
    return ::fnmatch(g.c_str(), s.c_str(), 0) == 0;
  });
}

// "0000:1a:00.0" or, without a domain, "1a:00.0" for the function in any domain.
bool PciMatches(const std::string& want, const std::string& pci) {
  if (absl::EqualsIgnoreCase(want, pci)) return true;
  const std::size_t colon = pci.find(':');
  return colon != std::string::npos && absl::EqualsIgnoreCase(want, pci.substr(colon + 1));
}

}  // namespace

bool Selector::Matches(const topology::Hca& hca) const {
  switch (virtual_functions) {
    case VirtualFunctions::kExclude:
      if (hca.IsVirtualFunction()) return false;
      break;
    case VirtualFunctions::kOnly:
      if (!hca.IsVirtualFunction()) return false;
      break;
    case VirtualFunctions::kInclude:
      break;
  }
  if (!vendors.empty() && !AnyEqualIgnoringCase(vendors, hca.vendor)) return false;
  if (!device_ids.empty() && !AnyEqualIgnoringCase(device_ids, hca.device)) return false;
  if (!drivers.empty() && !AnyEqual(drivers, hca.driver)) return false;
  if (!link_layers.empty() &&
      std::none_of(hca.ports.begin(), hca.ports.end(), [&](const topology::Port& p) {
        return AnyEqualIgnoringCase(link_layers, p.link_layer);
      })) {
    return false;
  }
  if (!hca_names.empty() && !AnyGlob(hca_names, hca.name)) return false;
  if (!netdevs.empty() &&
      std::none_of(hca.netdevs.begin(), hca.netdevs.end(),
                   [&](const std::string& n) { return AnyGlob(netdevs, n); })) {
    return false;
  }
  if (!pci_addresses.empty() &&
      std::none_of(pci_addresses.begin(), pci_addresses.end(),
                   [&](const std::string& a) { return PciMatches(a, hca.place.pci); })) {
    return false;
  }
  if (!numa_nodes.empty() &&
      (!hca.place.numa ||
       std::find(numa_nodes.begin(), numa_nodes.end(), *hca.place.numa) == numa_nodes.end())) {
    return false;
  }
  if (!if_names.empty() && (hca.netdevs.empty() || !AnyEqual(if_names, hca.netdevs.front()))) {
    return false;
  }
  if (!link_types.empty() &&
      (hca.netdevs.empty() || !AnyEqual(link_types, hca.netdev_link_type))) {
    return false;
  }
  return true;
}

std::string Resource::SocketName() const {
  std::string s = name;
  for (char& c : s) {
    if (c == '/' || c == '.') c = '-';
  }
  return s + ".sock";
}

std::string Resource::VariableSuffix() const {
  std::string s = name;
  for (char& c : s) c = absl::ascii_isalnum(c) ? absl::ascii_toupper(c) : '_';
  return s;
}

std::vector<std::size_t> Select(const Selector& selector, const std::vector<topology::Hca>& hcas) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < hcas.size(); ++i) {
    if (selector.Matches(hcas[i])) out.push_back(i);
  }
  return out;
}

}  // namespace rdp::resources
