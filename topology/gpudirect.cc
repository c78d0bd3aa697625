#include "topology/gpudirect.h"

#include <sys/utsname.h>

#include <cctype>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rdp::topology {
namespace {

constexpr const char* kPeermemModules[] = {"nvidia_peermem", "nv_peer_mem"};
constexpr const char* kMemoryPeers[] = {"nv_mem", "nv_mem_nc"};
constexpr char kMemoryPeersDir[] = "/sys/kernel/mm/memory_peers";

// The module is in /proc/modules ("nvidia_peermem 16384 0 - Live 0x... (POE)").
bool ListedInProcModules(Env& env, const std::string& module) {
  const std::optional<std::string> modules = env.ReadFile("/proc/modules", 1 << 20);
  if (!modules) return false;
  for (absl::string_view line : absl::StrSplit(*modules, '\n')) {
    if (absl::StartsWith(line, absl::StrCat(module, " "))) return true;
  }
  return false;
}

GpuDirectMechanism Peermem(Env& env) {
  std::string loaded;
  for (const char* module : kPeermemModules) {
    if (env.IsDirectory(absl::StrCat("/sys/module/", module))) {
      loaded = absl::StrCat(module, " loaded, seen in /sys/module");
    } else if (ListedInProcModules(env, module)) {
      loaded = absl::StrCat(module, " loaded, seen in /proc/modules");
    }
    if (!loaded.empty()) break;
  }
  for (const char* peer : kMemoryPeers) {
    if (env.Exists(absl::StrCat(kMemoryPeersDir, "/", peer, "/version"))) {
      return {true, absl::StrCat(loaded.empty() ? "a peer-memory client" : loaded,
                                 ", registered as memory peer ", peer)};
    }
  }
  if (loaded.empty()) return {false, "not loaded"};
  if (env.IsDirectory(kMemoryPeersDir)) {
    return {false, absl::StrCat(loaded, " but not registered with the RDMA core: ",
                                kMemoryPeersDir, " has no nv_mem")};
  }
  return {true, loaded};
}

// "5.15.0-91-generic" -> {5, 15}; nullopt when it does not start with two numbers.
std::optional<std::pair<int, int>> KernelVersion(const std::string& release) {
  int major = 0, minor = 0;
  if (std::sscanf(release.c_str(), "%d.%d", &major, &minor) != 2) return std::nullopt;
  return std::make_pair(major, minor);
}

GpuDirectMechanism DmaBuf(const GpuDirectState& s) {
  if (s.nvidia_driver.empty()) return {false, "no NVIDIA driver is loaded: no /proc/driver/nvidia/version"};
  if (!s.open_kernel_module) {
    return {false, absl::StrCat("NVIDIA driver ", s.nvidia_driver,
                                " is the proprietary kernel module; dma-buf needs the open one")};
  }
  const auto version = KernelVersion(s.kernel_release);
  if (!version) return {false, "the kernel version is unknown: /proc/sys/kernel/osrelease"};
  if (*version < std::make_pair(5, 12)) {
    return {false, absl::StrCat("kernel ", s.kernel_release, " is older than 5.12")};
  }
  return {true, absl::StrCat("open NVIDIA kernel module ", s.nvidia_driver, ", kernel ",
                             s.kernel_release)};
}

}  // namespace

GpuDirectState ReadGpuDirect(Env& env) {
  GpuDirectState s;
  // "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build ..."
  // (the proprietary flavour: "NVIDIA UNIX x86_64 Kernel Module  535.104.05  ...").
  if (const auto version = ReadAttribute(env, "/proc/driver/nvidia/version")) {
    s.open_kernel_module = absl::StrContains(*version, "Open Kernel Module");
    for (absl::string_view word : absl::StrSplit(*version, ' ', absl::SkipEmpty())) {
      if (!word.empty() && std::isdigit(static_cast<unsigned char>(word[0])) &&
          absl::StrContains(word, ".")) {
        s.nvidia_driver = std::string(word);
        break;
      }
    }
    if (s.nvidia_driver.empty()) s.nvidia_driver = "(unknown version)";
  }
  if (const auto release = ReadAttribute(env, "/proc/sys/kernel/osrelease")) {
    s.kernel_release = *release;
  } else if (struct utsname u; ::uname(&u) == 0) {
    // Not under the proc root (the chart mounts only /proc/driver there): a container's kernel
    // is its node's.
    s.kernel_release = u.release;
  }
  s.peermem = Peermem(env);
  s.dmabuf = DmaBuf(s);
  return s;
}

std::string GpuDirectState::Summary() const {
  auto one = [](const char* name, const GpuDirectMechanism& m) {
    return absl::StrCat(name, m.available ? " yes (" : " no (", m.detail, ")");
  };
  return absl::StrCat("GPUDirect RDMA ", Available() ? "available" : "unavailable", ": ",
                      one(kPeermemMechanism, peermem), "; ", one(kDmaBufMechanism, dmabuf));
}

}  // namespace rdp::topology
