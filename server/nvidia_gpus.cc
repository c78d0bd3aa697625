#include "server/nvidia_gpus.h"

#include <filesystem>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "topology/sysfs_util.h"
#include "topology/topology.h"

namespace rdp::server {

std::map<std::string, std::string> ReadNvidiaGpuIds(const std::string& proc_root) {
  std::map<std::string, std::string> out;
  const std::filesystem::path dir =
      std::filesystem::path(proc_root.empty() ? "/" : proc_root) / "proc/driver/nvidia/gpus";
  for (const std::string& name : topology::ListDir(dir, /*dirs_only=*/true)) {
    auto pci = topology::NormalizePci(name);
    if (!pci) continue;
    const auto info = topology::ReadHead(dir / name / "information", 64 * 1024);
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

}  // namespace rdp::server
