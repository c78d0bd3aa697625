// HCAs from /sys/class/infiniband and friends. Everything is read relative to a root so tests
// run on trees they lay out themselves.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "topology/discovery.h"
#include "topology/log.h"
#include "topology/sysfs_util.h"

namespace rdp::topology {
namespace fs = std::filesystem;

namespace {

// SetSysfsReadHookForTesting's hook; the flag keeps the unhooked path free of the lock.
std::atomic<bool> g_read_hook_set{false};
std::mutex g_read_hook_mu;
std::function<void(const fs::path&)>& ReadHook() {  // guarded by g_read_hook_mu
  static auto* hook = new std::function<void(const fs::path&)>();
  return *hook;
}

void BeforeRead(const fs::path& path) {
  if (!g_read_hook_set.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(g_read_hook_mu);
  if (ReadHook()) ReadHook()(path);
}

}  // namespace

void SetSysfsReadHookForTesting(std::function<void(const fs::path&)> hook) {
  std::lock_guard<std::mutex> lock(g_read_hook_mu);
  g_read_hook_set.store(static_cast<bool>(hook), std::memory_order_release);
  ReadHook() = std::move(hook);
}

std::optional<std::string> ReadHead(const fs::path& file, std::size_t max_bytes) {
  // Non-blocking and regular files only: a FIFO (or a device) where an attribute should be would
  // block the open or the read forever, and with it the health poll (found by fuzz_sysfs).
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return std::nullopt;
  struct stat st;
  std::optional<std::string> out;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    std::string data(max_bytes, '\0');
    std::size_t got = 0;
    while (got < max_bytes) {
      const ssize_t n = ::read(fd, data.data() + got, max_bytes - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n < 0) got = std::string::npos;
        break;
      }
      got += static_cast<std::size_t>(n);
    }
    if (got != std::string::npos) {
      data.resize(got);
      out = std::move(data);
    }
  }
  ::close(fd);
  return out;
}

std::optional<std::string> ReadFirstLine(const fs::path& file) {
  BeforeRead(file);
  // Bounded read: sysfs attributes are short; a huge file is garbage, not data.
  std::optional<std::string> line = ReadHead(file, 4096);
  if (!line) return std::nullopt;
  if (auto nl = line->find('\n'); nl != std::string::npos) line->resize(nl);
  while (!line->empty() && (line->back() == '\r' || line->back() == ' ')) line->pop_back();
  return line;
}

std::vector<std::string> ListDir(const fs::path& dir, bool dirs_only) {
  BeforeRead(dir);
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return names;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (dirs_only) {
      std::error_code ec2;
      if (!fs::is_directory(it->path(), ec2)) continue;  // follows symlinks; dangling -> skip
    }
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string PcieRootFromDevicePath(const fs::path& resolved, const fs::path& sys_devices) {
  // <sys_devices>/pci0000:15/0000:15:01.0/...: the first component below <sys_devices>. Parsed
  // relative to it, so that a root that itself lies under a folder named "devices" (or "sys")
  // does not shift the answer.
  const fs::path rel = resolved.lexically_relative(sys_devices);
  if (rel.empty() || rel.begin() == rel.end()) return "";
  const std::string first = rel.begin()->string();
  if (first == ".." || first == ".") return "";
  return first.rfind("pci", 0) == 0 ? first : "";
}

namespace {

std::string AfterColon(const std::string& s) {
  // "4: ACTIVE" -> "ACTIVE"; a value without a number prefix is kept as is.
  auto pos = s.find(": ");
  return pos == std::string::npos ? s : s.substr(pos + 2);
}

// ibdev name -> device names of a class such as infiniband_verbs ("uverbs0").
std::map<std::string, std::vector<std::pair<int, std::string>>> ReadClassByIbdev(
    const fs::path& class_dir) {
  std::map<std::string, std::vector<std::pair<int, std::string>>> out;
  for (const std::string& entry : ListDir(class_dir, /*dirs_only=*/true)) {
    auto ibdev = ReadFirstLine(class_dir / entry / "ibdev");
    if (!ibdev || ibdev->empty()) continue;
    int port = 0;
    if (auto p = ReadFirstLine(class_dir / entry / "port"); !p || !absl::SimpleAtoi(*p, &port)) {
      port = 0;
    }
    out[*ibdev].emplace_back(port, entry);
  }
  for (auto& [name, v] : out) std::sort(v.begin(), v.end());
  return out;
}

std::vector<Port> ReadPorts(const fs::path& ports_dir, const std::string& hca) {
  std::vector<Port> ports;
  for (const std::string& entry : ListDir(ports_dir, /*dirs_only=*/true)) {
    Port port;
    if (!absl::SimpleAtoi(entry, &port.number) || port.number <= 0) continue;
    auto state = ReadFirstLine(ports_dir / entry / "state");
    if (!state) {
      Logger("topology")->warn("cannot read {}: port {} of {} counts as not ACTIVE",
                               (ports_dir / entry / "state").string(), entry, hca);
    }
    port.state = state ? AfterColon(*state) : "";
    port.phys_state = AfterColon(ReadFirstLine(ports_dir / entry / "phys_state").value_or(""));
    port.link_layer = ReadFirstLine(ports_dir / entry / "link_layer").value_or("");
    port.rate = ReadFirstLine(ports_dir / entry / "rate").value_or("");
    ports.push_back(std::move(port));
  }
  std::sort(ports.begin(), ports.end(),
            [](const Port& a, const Port& b) { return a.number < b.number; });
  return ports;
}

bool Exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

}  // namespace

absl::StatusOr<std::vector<Hca>> ReadSysfsHcas(const std::string& sysfs_root,
                                                const std::string& dev_root) {
  const fs::path sys = fs::path(sysfs_root.empty() ? "/" : sysfs_root) / "sys";
  std::error_code ec;
  if (!fs::is_directory(sys, ec)) {
    return absl::NotFoundError("sysfs root " + sysfs_root + ": " + sys.string() +
                               " is not a readable directory");
  }
  const fs::path klass = sys / "class";
  // The kernel's device tree, resolved once: resolved device links are parsed relative to it.
  fs::path sys_devices = fs::weakly_canonical(sys / "devices", ec);
  if (ec) sys_devices = sys / "devices";
  const fs::path dev = fs::path(dev_root.empty() ? "/" : dev_root) / "dev" / "infiniband";
  auto verbs = ReadClassByIbdev(klass / "infiniband_verbs");
  auto mads = ReadClassByIbdev(klass / "infiniband_mad");
  auto log = Logger("topology");

  std::vector<Hca> hcas;
  for (const std::string& name : ListDir(klass / "infiniband", /*dirs_only=*/false)) {
    const fs::path ibdir = klass / "infiniband" / name;
    fs::path resolved = fs::canonical(ibdir / "device", ec);
    if (ec) {
      log->warn("skipping RDMA device {}: cannot resolve {}: {}", name,
                (ibdir / "device").string(), ec.message());
      continue;
    }
    auto pci = NormalizePci(resolved.filename().string());
    if (!pci) {
      log->warn("skipping RDMA device {}: {} is not a PCI function", name, resolved.string());
      continue;
    }
    Hca hca;
    hca.name = name;
    hca.place.pci = *pci;
    hca.place.pcie_root = PcieRootFromDevicePath(resolved, sys_devices);
    int numa = -1;
    if (auto text = ReadFirstLine(resolved / "numa_node"); text && absl::SimpleAtoi(*text, &numa) &&
                                                           numa >= 0) {
      hca.place.numa = numa;
    }
    hca.ports = ReadPorts(ibdir / "ports", name);
    hca.netdevs = ListDir(resolved / "net", /*dirs_only=*/false);
    if (auto it = verbs.find(name); it != verbs.end()) hca.uverbs = it->second.front().second;
    if (auto it = mads.find(name); it != mads.end()) {
      for (const auto& [port, entry] : it->second) {
        (entry.rfind("issm", 0) == 0 ? hca.issm : hca.umad).push_back(entry);
      }
    }
    if (!hca.uverbs.empty()) {
      hca.char_devices.emplace_back((dev / hca.uverbs).string(), Exists(dev / hca.uverbs));
    }
    for (const auto* list : {&hca.umad, &hca.issm}) {
      for (const std::string& d : *list) {
        hca.char_devices.emplace_back((dev / d).string(), Exists(dev / d));
      }
    }
    hcas.push_back(std::move(hca));
  }
  DropDuplicatePci(hcas, "HCA", [](const Hca& h) { return h.name; });
  return hcas;
}

}  // namespace rdp::topology
