#include "topology/port_counters.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rdp::topology {
namespace {

std::optional<std::uint64_t> ReadCounter(Env& env, const std::string& path) {
  const std::optional<std::string> text = ReadAttribute(env, path);
  std::uint64_t value = 0;
  if (!text || !absl::SimpleAtoi(*text, &value)) return std::nullopt;
  return value;
}

}  // namespace

std::map<int, PortErrors> ReadPortErrors(Env& env, const Hca& hca) {
  std::map<int, PortErrors> out;
  for (const Port& port : hca.ports) {
    const std::string dir =
        absl::StrCat("/sys/class/infiniband/", hca.name, "/ports/", port.number, "/counters/");
    out[port.number] = {ReadCounter(env, dir + "symbol_error"),
                        ReadCounter(env, dir + "link_downed")};
  }
  return out;
}

}  // namespace rdp::topology
