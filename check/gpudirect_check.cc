#include "check/gpudirect_check.h"

#include <algorithm>
#include <cctype>
#include <ostream>

#include "fmt/format.h"

namespace rdp::check {
namespace {

constexpr std::uint64_t kUnlimited = ~std::uint64_t{0};

std::string Bytes(std::uint64_t n) {
  if (n == kUnlimited) return "unlimited";
  if (n >= (std::uint64_t{1} << 30) && n % (std::uint64_t{1} << 30) == 0) {
    return fmt::format("{}Gi", n >> 30);
  }
  if (n >= (1u << 20) && n % (1u << 20) == 0) return fmt::format("{}Mi", n >> 20);
  if (n >= (1u << 10) && n % (1u << 10) == 0) return fmt::format("{}Ki", n >> 10);
  return std::to_string(n);
}

}  // namespace

std::vector<std::string> VisibleGpus(Env& env) {
  std::vector<std::string> gpus;
  for (const std::string& name : env.ListDir("/dev", /*dirs_only=*/false)) {
    if (name.size() > 6 && name.compare(0, 6, "nvidia") == 0 &&
        std::all_of(name.begin() + 6, name.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      gpus.push_back(name);
    }
  }
  std::sort(gpus.begin(), gpus.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return gpus;
}

GpuDirectReport AssessGpuDirect(const topology::GpuDirectState& node,
                                const std::vector<std::string>& gpus,
                                const std::vector<std::string>& openable_hcas,
                                std::optional<std::uint64_t> memlock) {
  GpuDirectReport r;
  r.node = node;
  r.gpus = gpus;
  r.memlock = memlock;
  if (openable_hcas.empty()) r.reasons.push_back("this container can open no HCA");
  if (gpus.empty()) r.reasons.push_back("this container sees no NVIDIA GPU (/dev/nvidiaN)");
  if (!node.Available()) {
    r.reasons.push_back(fmt::format(
        "the node has no mechanism for it: nvidia-peermem: {}; dma-buf: {} (load nvidia-peermem, "
        "e.g. the GPU operator's driver.rdma.enabled, or use the open NVIDIA kernel modules on "
        "kernel 5.12 or later)",
        node.peermem.detail, node.dmabuf.detail));
  }
  r.possible = r.reasons.empty();
  if (memlock && *memlock < kLowMemlock) {
    r.memlock_note = fmt::format(
        "RLIMIT_MEMLOCK is {}: registering more memory than that with an HCA fails, and NCCL "
        "falls back to sockets. The chart's NRI container raises it for containers holding an "
        "HCA (docs/nri.md): is NRI enabled in the container runtime?",
        Bytes(*memlock));
  }
  return r;
}

nlohmann::json ToJson(const GpuDirectReport& r) {
  auto mechanism = [](const topology::GpuDirectMechanism& m) {
    return nlohmann::json{{"available", m.available}, {"detail", m.detail}};
  };
  nlohmann::json j = {
      {"possible", r.possible},
      {"reasons", r.reasons},
      {"gpus", r.gpus},
      {"mechanisms",
       {{topology::kPeermemMechanism, mechanism(r.node.peermem)},
        {topology::kDmaBufMechanism, mechanism(r.node.dmabuf)}}},
      {"memlock", r.memlock ? nlohmann::json(Bytes(*r.memlock)) : nlohmann::json(nullptr)},
      {"memlock_note", r.memlock_note}};
  return j;
}

void PrintText(const GpuDirectReport& r, std::ostream& out) {
  if (r.possible) {
    out << fmt::format("GPUDirect RDMA: possible ({} GPU(s): {}; {})\n", r.gpus.size(),
                       fmt::join(r.gpus, ","), r.node.Summary());
  } else {
    out << "GPUDirect RDMA: not possible here: " << fmt::format("{}", fmt::join(r.reasons, "; "))
        << "\n";
  }
  if (r.memlock) {
    out << "locked memory: RLIMIT_MEMLOCK " << Bytes(*r.memlock) << "\n";
  }
  if (!r.memlock_note.empty()) out << "note: " << r.memlock_note << "\n";
}

}  // namespace rdp::check
