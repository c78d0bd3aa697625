// Fuzzes the sysfs reader (topology::ReadSysfsHcas) and the NVIDIA /proc reader
// (deviceplugin::ReadNvidiaGpuIds) on trees generated from the input: a plausible node laid out the
// kernel's way by SysfsFixture, then mutations of any entry in it: removed, replaced by a file
// with odd or huge contents, a symlink loop, a link to its parent, a dangling link, a FIFO or an
// empty directory. The readers must neither crash, hang nor return nonsense.

#include <sys/stat.h>
#include <unistd.h>

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "deviceplugin/nvidia_gpus.h"
#include "test/fuzz/fuzz_util.h"
#include "topology/discovery.h"
#include "sim/sysfs_fixture.h"

namespace fs = std::filesystem;

namespace rdp::fuzz {
namespace {

const char* const kPortStates[] = {"ACTIVE", "DOWN", "INIT", "ARMED", "ACTIVE_DEFER", "", "4"};

std::string Pci(FuzzedDataProvider& fdp) {
  return absl::StrFormat("%04x:%02x:%02x.%x", fdp.ConsumeBool() ? 0 : fdp.ConsumeIntegral<int>() & 0xffff,
                         fdp.ConsumeIntegral<std::uint8_t>(),
                         fdp.ConsumeIntegralInRange(0, 0x1f), fdp.ConsumeIntegralInRange(0, 7));
}

void LayOutNode(FuzzedDataProvider& fdp, const std::string& root) {
  sim::SysfsFixture fixture(root);
  const int hcas = fdp.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < hcas; ++i) {
    sim::FixtureHca h;
    h.name = fdp.ConsumeBool() ? absl::StrFormat("mlx5_%d", i) : fdp.ConsumeRandomLengthString(12);
    h.pci = Pci(fdp);
    h.numa = fdp.ConsumeIntegralInRange(-2, 3);
    h.pcie_root = absl::StrFormat("pci0000:%02x", fdp.ConsumeIntegral<std::uint8_t>());
    for (int b = fdp.ConsumeIntegralInRange(0, 2); b > 0; --b) h.bridges.push_back(Pci(fdp));
    h.ports.clear();
    for (int p = fdp.ConsumeIntegralInRange(0, 2); p > 0; --p) {
      sim::FixturePort port;
      port.number = fdp.ConsumeIntegralInRange(-1, 3);
      port.state = fdp.PickValueInArray(kPortStates);
      h.ports.push_back(port);
    }
    h.umad = fdp.ConsumeBool();
    if (fdp.ConsumeBool()) h.netdevs.push_back(fdp.ConsumeRandomLengthString(8));
    (void)fixture.AddHca(h);  // a name or address the fixture refuses is just one HCA fewer
  }
  if (fdp.ConsumeBool()) (void)fixture.AddRdmaCm();
  // /proc/driver/nvidia/gpus/<pci>/information
  for (int g = fdp.ConsumeIntegralInRange(0, 2); g > 0; --g) {
    const fs::path dir = fs::path(root) / "proc/driver/nvidia/gpus" /
                         (fdp.ConsumeBool() ? Pci(fdp) : fdp.ConsumeRandomLengthString(14));
    std::error_code ec;
    if (dir.filename().empty() || !fs::create_directories(dir, ec)) continue;
    std::ofstream(dir / "information")
        << "Model: H100\n"
        << (fdp.ConsumeBool() ? "GPU UUID: " : "") << fdp.ConsumeRandomLengthString(64) << "\n";
  }
}

// Every entry under root, not following symlinks, sorted.
std::vector<fs::path> Entries(const std::string& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Mutate(FuzzedDataProvider& fdp, const std::string& root) {
  const std::vector<fs::path> entries = Entries(root);
  if (entries.empty()) return;
  const fs::path target = entries[fdp.ConsumeIntegralInRange<size_t>(0, entries.size() - 1)];
  const fs::path other = entries[fdp.ConsumeIntegralInRange<size_t>(0, entries.size() - 1)];
  const int op = fdp.ConsumeIntegralInRange(0, 9);
  std::error_code ec;
  if (op == 9) {  // rewrite in place when it is a regular file
    if (fs::is_regular_file(fs::symlink_status(target, ec))) {
      std::ofstream(target, std::ios::trunc) << fdp.ConsumeRandomLengthString(64);
    }
    return;
  }
  fs::remove_all(target, ec);
  switch (op) {
    case 0:  // removed
      break;
    case 1:  // odd contents
      std::ofstream(target) << fdp.ConsumeRandomLengthString(64);
      break;
    case 2: {  // huge: up to 8 MiB without a newline (sparse: zeros)
      std::ofstream(target).close();
      (void)::truncate(target.c_str(), fdp.ConsumeIntegralInRange<off_t>(4096, 8 << 20));
      break;
    }
    case 3:  // loop on itself
      fs::create_symlink(target.filename(), target, ec);
      break;
    case 4:  // cycle through the parent
      fs::create_symlink("..", target, ec);
      break;
    case 5:  // another entry, relative or absolute
      fs::create_symlink(fdp.ConsumeBool() ? fs::relative(other, target.parent_path(), ec) : other,
                         target, ec);
      break;
    case 6:  // dangling
      fs::create_symlink("nowhere/" + fdp.ConsumeRandomLengthString(8), target, ec);
      break;
    case 7:  // a FIFO: opening it for reading blocks unless the reader refuses non-files
      ::mkfifo(target.c_str(), 0600);
      break;
    case 8:
      fs::create_directory(target, ec);
      break;
  }
}

void CheckHcas(const std::vector<topology::Hca>& hcas) {
  std::set<std::string> names;
  std::set<std::string> pcis;
  for (const topology::Hca& h : hcas) {
    FUZZ_CHECK(!h.name.empty(), "HCA without a name");
    FUZZ_CHECK(names.insert(h.name).second, h.name);
    FUZZ_CHECK(topology::NormalizePci(h.place.pci) == h.place.pci, h.place.pci);
    FUZZ_CHECK(!h.place.numa || *h.place.numa >= 0, h.name);
    int last = 0;
    for (const topology::Port& p : h.ports) {
      FUZZ_CHECK(p.number > last, h.name + " ports out of order");
      last = p.number;
    }
    for (const auto& [path, present] : h.char_devices) {
      FUZZ_CHECK(!path.empty(), h.name);
    }
    FUZZ_CHECK(pcis.insert(h.place.pci).second, "two HCAs at " + h.place.pci);
  }
}

}  // namespace
}  // namespace rdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  using namespace rdp;
  fuzz::Scratch* const scratch = &fuzz::ProcessScratch();
  scratch->Clear();
  FuzzedDataProvider fdp(data, size);
  const std::string root = scratch->path() + "/node";
  fuzz::LayOutNode(fdp, root);
  for (int m = fdp.ConsumeIntegralInRange(0, 8); m > 0; --m) fuzz::Mutate(fdp, root);

  absl::StatusOr<std::vector<topology::Hca>> hcas = topology::ReadSysfsHcas(root, root);
  std::error_code ec;
  if (fs::is_directory(root + "/sys", ec)) {
    FUZZ_CHECK(hcas.ok(), hcas.status().ToString());
    fuzz::CheckHcas(*hcas);
  } else {
    FUZZ_CHECK(absl::IsNotFound(hcas.status()), hcas.status().ToString());
  }
  for (const auto& [uuid, pci] : deviceplugin::ReadNvidiaGpuIds(root)) {
    FUZZ_CHECK(topology::NormalizePci(pci) == pci, pci);
  }
  return 0;
}
