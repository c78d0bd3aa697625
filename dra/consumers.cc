#include "dra/consumers.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace rdp::dra {

std::map<RequestKey, std::optional<std::vector<std::string>>> CommonDevices(
    const std::vector<PodClaims>& pods, const ClaimTable& claims) {
  // For each pair: the device sets of the containers holding it (nullopt: not fully known).
  std::map<RequestKey, std::vector<std::optional<std::set<std::string>>>> holders;
  for (const PodClaims& pod : pods) {
    for (const PodClaims::Container& container : pod.containers) {
      std::set<RequestKey> held;
      std::set<std::string> devices;
      bool known = true;
      for (const ClaimUse& use : container.uses) {
        const auto it = claims.find(absl::StrCat(pod.pod.ns, "/", use.claim));
        if (it == claims.end() || !it->second) {
          known = false;
          continue;
        }
        const ClaimDevices& claim = *it->second;
        for (const auto& [request, names] : claim.requests) {
          if (!use.request.empty() && use.request != request) continue;
          held.insert({claim.uid, request});
          devices.insert(names.begin(), names.end());
        }
      }
      for (const RequestKey& key : held) {
        holders[key].push_back(known ? std::optional(devices) : std::nullopt);
      }
    }
  }
  std::map<RequestKey, std::optional<std::vector<std::string>>> out;
  for (const auto& held_by : holders) {
    // Not a structured binding: clang 14 (the sanitizer builds) cannot capture one in C++17.
    const auto& sets = held_by.second;
    const bool agree =
        std::all_of(sets.begin(), sets.end(), [&sets](const auto& s) { return s && *s == *sets[0]; });
    out[held_by.first] = agree ? std::optional(std::vector<std::string>(sets[0]->begin(), sets[0]->end()))
                     : std::nullopt;
  }
  return out;
}

}  // namespace rdp::dra
