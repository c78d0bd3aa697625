#include "deviceplugin/nvidia_gpus.h"

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "topology/topology.h"

namespace rdp::deviceplugin {

std::map<std::string, std::string> ReadNvidiaGpuIds(Env& env) {
  constexpr char kGpus[] = "/proc/driver/nvidia/gpus";
  std::map<std::string, std::string> out;
  for (const std::string& name : env.ListDir(kGpus, /*dirs_only=*/true)) {
    auto pci = topology::NormalizePci(name);
    if (!pci) continue;
    const auto info = env.ReadFile(std::string(kGpus) + "/" + name + "/information", 64 * 1024);
    if (!info) continue;
    for (absl::string_view line : absl::StrSplit(*info, '\n')) {
      if (absl::ConsumePrefix(&line, "GPU UUID:")) {
        out[std::string(absl::StripAsciiWhitespace(line))] = *pci;
        break;
      }
    }
  }
  return out;
}

std::map<std::string, std::string> ReadNvidiaGpuIds(const std::string& proc_root) {
  NodeRoots roots;
  roots.proc = proc_root.empty() ? "/" : proc_root;
  return ReadNvidiaGpuIds(*NewNodeEnv(roots));
}

}  // namespace rdp::deviceplugin
