#include "nri/memlock.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rdp::nri {
namespace {

struct Unit {
  const char* suffix;
  int shift;
};
constexpr Unit kUnits[] = {{"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}};

absl::Status Bad(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--memlock '", std::string(text), "': ", std::string(why),
                   " (give 'unlimited', bytes, or a number with Ki, Mi, Gi or Ti)"));
}

}  // namespace

absl::StatusOr<std::uint64_t> ParseMemlock(std::string_view text) {
  if (text == "unlimited" || text == "infinity") return kUnlimited;
  std::string_view digits = text;
  int shift = 0;
  for (const Unit& u : kUnits) {
    const std::string_view suffix(u.suffix);
    if (digits.size() > suffix.size() && digits.substr(digits.size() - suffix.size()) == suffix) {
      digits.remove_suffix(suffix.size());
      shift = u.shift;
      break;
    }
  }
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(),
                                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    return Bad(text, "not a size");
  }
  std::uint64_t n = 0;
  if (!absl::SimpleAtoi(std::string(digits), &n)) return Bad(text, "too large");
  if (n == 0) return Bad(text, "zero would forbid registering any memory");
  if (shift > 0 && n > (kUnlimited >> shift)) return Bad(text, "too large");
  return n << shift;
}

std::string FormatMemlock(std::uint64_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  for (const Unit& u : kUnits) {
    const std::uint64_t unit = std::uint64_t{1} << u.shift;
    if (bytes >= unit && bytes % unit == 0) return absl::StrCat(bytes >> u.shift, u.suffix);
  }
  return absl::StrCat(bytes);
}

bool IsVerbsDevice(std::string_view path) {
  constexpr std::string_view kPrefix = "/dev/infiniband/uverbs";
  if (path.size() <= kPrefix.size() || path.substr(0, kPrefix.size()) != kPrefix) return false;
  const std::string_view n = path.substr(kPrefix.size());
  return std::all_of(n.begin(), n.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

MemlockDecision DecideMemlock(const ContainerView& container, std::uint64_t limit) {
  MemlockDecision d;
  for (const std::string& path : container.device_paths) {
    if (IsVerbsDevice(path)) d.verbs_devices.push_back(path);
  }
  if (d.verbs_devices.empty()) return d;
  if (container.memlock && container.memlock->soft >= limit && container.memlock->hard >= limit) {
    return d;
  }
  const std::uint64_t hard = container.memlock ? std::max(container.memlock->hard, limit) : limit;
  d.set = Rlimit{limit, hard};
  return d;
}

}  // namespace rdp::nri
