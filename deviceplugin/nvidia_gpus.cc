#include "deviceplugin/nvidia_gpus.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "topology/topology.h"

namespace rdp::deviceplugin {
namespace {

constexpr char kGpus[] = "/proc/driver/nvidia/gpus";
constexpr std::size_t kMaxListBytes = 1 << 20;

bool AllDigits(absl::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isdigit(c); });
}

// The "(UUID: X)" of a line of `nvidia-smi -L`, "" when there is none.
absl::string_view UuidOf(absl::string_view line) {
  const std::size_t at = line.find("(UUID:");
  if (at == absl::string_view::npos) return {};
  line.remove_prefix(at + 6);
  const std::size_t end = line.find(')');
  if (end == absl::string_view::npos) return {};
  return absl::StripAsciiWhitespace(line.substr(0, end));
}

// Adds what `nvidia-smi -L` tells: "GPU <index>: <model> (UUID: GPU-...)" lines, each followed
// by its MIG devices' "  MIG <profile> Device <n>: (UUID: MIG-...)" lines. A GPU whose UUID the
// driver's files do not map (`ids` so far) is skipped, with its MIG devices. True when the list
// named at least one GPU the driver shows.
bool AddNvidiaSmiList(absl::string_view list, std::map<std::string, std::string>* ids) {
  const std::map<std::string, std::string> by_uuid = *ids;
  const std::string* parent = nullptr;  // the PCI address of the GPU whose lines follow
  bool any = false;
  for (absl::string_view line : absl::StrSplit(list, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    const absl::string_view uuid = UuidOf(line);
    if (absl::ConsumePrefix(&line, "GPU ")) {
      parent = nullptr;
      const std::size_t colon = line.find(':');
      if (colon == absl::string_view::npos || !AllDigits(line.substr(0, colon))) continue;
      auto it = by_uuid.find(std::string(uuid));
      if (it == by_uuid.end()) continue;
      parent = &it->second;
      (*ids)[std::string(line.substr(0, colon))] = *parent;
      any = true;
    } else if (absl::StartsWith(line, "MIG ") && parent != nullptr &&
               absl::StartsWith(uuid, "MIG-")) {
      (*ids)[std::string(uuid)] = *parent;
    }
  }
  return any;
}

}  // namespace

std::map<std::string, std::string> ReadNvidiaGpuIds(Env& env, const std::string& list_file) {
  std::map<std::string, std::string> out;
  std::vector<std::string> pcis;
  for (const std::string& name : env.ListDir(kGpus, /*dirs_only=*/true)) {
    auto pci = topology::NormalizePci(name);
    if (!pci) continue;
    pcis.push_back(*pci);
    const auto info = env.ReadFile(std::string(kGpus) + "/" + name + "/information", 64 * 1024);
    if (!info) continue;
    for (absl::string_view line : absl::StrSplit(*info, '\n')) {
      if (absl::ConsumePrefix(&line, "GPU UUID:")) {
        out[std::string(absl::StripAsciiWhitespace(line))] = *pci;
        break;
      }
    }
  }
  if (!list_file.empty()) {
    const auto list = env.ReadFile(list_file, kMaxListBytes);
    if (list && AddNvidiaSmiList(*list, &out)) return out;
  }
  // NVML numbers GPUs in PCI address order; normalised addresses sort as the bus does.
  std::sort(pcis.begin(), pcis.end());
  pcis.erase(std::unique(pcis.begin(), pcis.end()), pcis.end());
  for (std::size_t i = 0; i < pcis.size(); ++i) out[absl::StrCat(i)] = pcis[i];
  return out;
}

std::map<std::string, std::string> ReadNvidiaGpuIds(const std::string& proc_root,
                                                    const std::string& list_file) {
  NodeRoots roots;
  roots.proc = proc_root.empty() ? "/" : proc_root;
  return ReadNvidiaGpuIds(*NewNodeEnv(roots), list_file);
}

std::string CanonicalGpuId(absl::string_view id) {
  if (const std::size_t at = id.rfind("::");
      at != absl::string_view::npos && AllDigits(id.substr(at + 2))) {
    id = id.substr(0, at);
  }
  if (absl::ConsumePrefix(&id, "MIG-GPU-")) {  // MIG-GPU-<uuid>/<gi>/<ci>
    return absl::StrCat("GPU-", id.substr(0, id.find('/')));
  }
  if (const std::size_t colon = id.find(':');
      colon != absl::string_view::npos && AllDigits(id.substr(0, colon)) &&
      AllDigits(id.substr(colon + 1))) {
    return std::string(id.substr(0, colon));
  }
  return std::string(id);
}

}  // namespace rdp::deviceplugin
