#include "dra/consumers.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace rdp::dra {
namespace {

// What one container holds of ours: the pairs, the union of their devices, and whether every
// claim it uses is known (in `claims` and read).
struct Holding {
  std::set<RequestKey> pairs;
  std::set<std::string> devices;
  bool known = true;
};

Holding HoldingOf(const std::string& ns, const PodClaims::Container& container,
                  const ClaimTable& claims) {
  Holding out;
  for (const ClaimUse& use : container.uses) {
    const auto it = claims.find(absl::StrCat(ns, "/", use.claim));
    if (it == claims.end() || !it->second) {
      out.known = false;
      continue;
    }
    const ClaimDevices& claim = *it->second;
    for (const auto& [request, names] : claim.requests) {
      if (!use.request.empty() && use.request != request) continue;
      out.pairs.insert({claim.uid, request});
      out.devices.insert(names.begin(), names.end());
    }
  }
  return out;
}

}  // namespace

Commons CommonDevices(const std::vector<PodClaims>& pods, const ClaimTable& claims) {
  // For each pair: the device sets of the containers holding it (nullopt: not fully known).
  std::map<RequestKey, std::vector<std::optional<std::set<std::string>>>> holders;
  for (const PodClaims& pod : pods) {
    for (const PodClaims::Container& container : pod.containers) {
      const Holding h = HoldingOf(pod.pod.ns, container, claims);
      for (const RequestKey& key : h.pairs) {
        holders[key].push_back(h.known ? std::optional(h.devices) : std::nullopt);
      }
    }
  }
  Commons out;
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

std::map<RequestKey, std::set<std::string>> PodSetVariables(const std::vector<PodClaims>& pods,
                                                            const ClaimTable& claims) {
  std::map<RequestKey, std::set<std::string>> out;
  for (const PodClaims& pod : pods) {
    for (const PodClaims::Container& container : pod.containers) {
      for (const RequestKey& key : HoldingOf(pod.pod.ns, container, claims).pairs) {
        out[key].insert(container.env.begin(), container.env.end());
      }
    }
  }
  return out;
}

}  // namespace rdp::dra
