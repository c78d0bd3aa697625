#include "topology/hwloc_tree.h"

#include <hwloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fmt/format.h"

namespace rdp::topology {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology_t t) const { hwloc_topology_destroy(t); }
};
using TopologyHandle = std::unique_ptr<hwloc_topology, TopologyDeleter>;

std::string BusId(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", static_cast<unsigned>(pci.domain),
                     static_cast<unsigned>(pci.bus), static_cast<unsigned>(pci.dev),
                     static_cast<unsigned>(pci.func));
}

// hwloc keeps whatever an XML says in its bridge_type and osdev_type enum fields ("2-1" gives
// 2, which is no hwloc_obj_bridge_type_t; reading that as the enum is undefined, found by
// fuzz_hwloc_xml): read them as their integer.
template <typename E>
long long EnumValue(const E& field) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &field, sizeof v);
  return static_cast<long long>(v);
}

bool IsHostBridge(hwloc_obj_t o) {
  return o->type == HWLOC_OBJ_BRIDGE &&
         EnumValue(o->attr->bridge.upstream_type) == HWLOC_OBJ_BRIDGE_HOST;
}
bool HasBridgeChild(hwloc_obj_t o) {
  for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
    if (c->type == HWLOC_OBJ_BRIDGE) return true;
  }
  return false;
}

// The switch each bridge of a chain belongs to, computed top-down. hwloc has no notion of
// "switch"; every PCIe switch has this shape in its tree: an upstream port (a PCI-to-PCI bridge
// below a root port or below another switch's downstream port, with bridges below it) whose
// children are its downstream ports. A downstream port that holds an inner switch also has bridge
// children, so the role of a bridge depends on its parent's role, not on its own shape alone.
std::vector<Bridge> ClassifyChain(const std::vector<hwloc_obj_t>& chain) {
  std::vector<Bridge> out;
  bool parent_is_upstream = false;
  std::string parent_switch;
  for (std::size_t i = 0; i < chain.size(); ++i) {
    hwloc_obj_t b = chain[i];
    Bridge br{BusId(b->attr->bridge.upstream.pci), ""};
    bool is_upstream = false;
    if (parent_is_upstream) {
      br.switch_id = parent_switch;  // a downstream port
    } else if (i > 0 && HasBridgeChild(b)) {
      br.switch_id = br.pci;  // an upstream port (the first bridge is the root port)
      is_upstream = true;
    }
    parent_is_upstream = is_upstream;
    parent_switch = br.switch_id;
    out.push_back(std::move(br));
  }
  return out;
}

std::optional<int> NumaOf(hwloc_topology_t topo, hwloc_obj_t o) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
  if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1) return std::nullopt;
  return hwloc_bitmap_first(anc->nodeset);
}

PciPlacement PlacementOf(hwloc_topology_t topo, hwloc_obj_t dev) {
  PciPlacement place;
  place.pci = BusId(dev->attr->pcidev);
  place.numa = NumaOf(topo, dev);
  place.bridges_known = true;
  std::vector<hwloc_obj_t> up;
  for (hwloc_obj_t p = dev->parent; p && p->type == HWLOC_OBJ_BRIDGE; p = p->parent) {
    if (IsHostBridge(p)) {
      place.pcie_root = fmt::format("pci{:04x}:{:02x}",
                                    static_cast<unsigned>(p->attr->bridge.downstream.pci.domain),
                                    static_cast<unsigned>(p->attr->bridge.downstream.pci.secondary_bus));
      break;
    }
    up.push_back(p);
  }
  place.bridges = ClassifyChain(std::vector<hwloc_obj_t>(up.rbegin(), up.rend()));
  return place;
}

std::string PortStateName(int v) {
  switch (v) {
    case 1: return "DOWN";
    case 2: return "INIT";
    case 3: return "ARMED";
    case 4: return "ACTIVE";
    case 5: return "ACTIVE_DEFER";
    default: return "";
  }
}

Hca HcaFromOsdev(hwloc_topology_t topo, hwloc_obj_t os, hwloc_obj_t pcidev) {
  Hca hca;
  hca.name = os->name ? os->name : "";
  hca.place = PlacementOf(topo, pcidev);
  for (unsigned i = 0; i < os->infos_count; ++i) {
    int port = 0, consumed = 0;
    const char* name = os->infos[i].name;
    if (std::sscanf(name, "Port%dState%n", &port, &consumed) == 1 &&
        name[consumed] == '\0' && port > 0) {
      Port p;
      p.number = port;
      p.state = PortStateName(std::atoi(os->infos[i].value));
      hca.ports.push_back(p);
    }
  }
  std::sort(hca.ports.begin(), hca.ports.end(),
            [](const Port& a, const Port& b) { return a.number < b.number; });
  for (hwloc_obj_t c = pcidev->io_first_child; c; c = c->next_sibling) {
    if (c->type == HWLOC_OBJ_OS_DEVICE && c->name &&
        EnumValue(c->attr->osdev.type) == HWLOC_OBJ_OSDEV_NETWORK) {
      hca.netdevs.push_back(c->name);
    }
  }
  std::sort(hca.netdevs.begin(), hca.netdevs.end());
  return hca;
}

// HWLOC_FSROOT is read from the environment while hwloc loads; serialise loads that set it.
std::mutex& EnvMutex() {
  static std::mutex mu;
  return mu;
}

// hwloc 2.9.0 dereferences NULL inside hwloc_topology_load on some malformed XML (found by
// fuzz_hwloc_xml; test/fuzz/regressions/hwloc_xml/hwloc-crashes-on-it.xml), and a load has no
// deadline; and when it refuses a file it may leak what it had read (an XML ending inside an
// object). So an XML is loaded once in a child process first: a crash, a hang or a refusal
// there becomes an error naming the file, and only a file that loaded there is loaded here.
// Child exit codes: 0 loaded, 3 set_xml refused the file, 4 the load failed.
constexpr absl::Duration kXmlProbeTimeout = absl::Seconds(20);

absl::Status ProbeXmlInChild(const std::string& xml) {
  const pid_t pid = ::fork();
  if (pid < 0) return absl::OkStatus();  // cannot probe: load in this process as before
  if (pid == 0) {
    // Die by the signal itself, not through a sanitizer's or fuzzer's handler.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
      struct sigaction sa = {};
      sa.sa_handler = SIG_DFL;
      ::sigaction(sig, &sa, nullptr);
    }
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) != 0) ::_exit(3);
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
    if (hwloc_topology_set_xml(t, xml.c_str()) != 0) ::_exit(3);
    ::_exit(hwloc_topology_load(t) == 0 ? 0 : 4);  // no destroy, no atexit: the process ends
  }
  int status = 0;
  const auto reap = [pid, &status] {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  };
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {  // no way to wait with a deadline (kernel < 5.3): load in this process as before
    ::kill(pid, SIGKILL);
    reap();
    return absl::OkStatus();
  }
  struct pollfd p = {pidfd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kXmlProbeTimeout)));
  } while (ready < 0 && errno == EINTR);
  ::close(pidfd);
  const bool done = ready > 0;
  if (!done) ::kill(pid, SIGKILL);
  reap();
  if (!done) {
    return absl::InvalidArgumentError(fmt::format(
        "topology XML {}: hwloc did not finish loading it within {}", xml,
        absl::FormatDuration(kXmlProbeTimeout)));
  }
  if (WIFSIGNALED(status)) {
    return absl::InvalidArgumentError(
        fmt::format("topology XML {}: hwloc crashed loading it (signal {}, {}); the file is "
                    "malformed",
                    xml, WTERMSIG(status), strsignal(WTERMSIG(status))));
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0) return absl::OkStatus();
  if (code == 3) {
    return absl::InvalidArgumentError("topology XML " + xml + ": hwloc cannot use it");
  }
  return absl::InvalidArgumentError("topology XML " + xml +
                                    ": hwloc failed to load it (malformed or unsupported, e.g. "
                                    "an hwloc 3.x export)");
}

}  // namespace

absl::StatusOr<HwlocTree> LoadHwlocTree(const std::string& xml, const std::string& fsroot) {
  namespace fs = std::filesystem;
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return absl::InternalError("hwloc_topology_init failed");
  TopologyHandle topo(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);

  int rc = 0;
  int err = 0;
  if (!xml.empty()) {
    std::error_code ec;
    if (!fs::is_regular_file(xml, ec) || !std::ifstream(xml)) {
      return absl::NotFoundError("topology XML " + xml + ": no such readable file");
    }
    if (absl::Status probe = ProbeXmlInChild(xml); !probe.ok()) return probe;
    if (hwloc_topology_set_xml(raw, xml.c_str()) != 0) {
      return absl::InvalidArgumentError("topology XML " + xml + ": hwloc cannot use it: " +
                                        std::strerror(errno));
    }
    rc = hwloc_topology_load(raw);
    err = errno;
  } else {
    std::lock_guard<std::mutex> lock(EnvMutex());
    const bool gathered = !fsroot.empty() && fsroot != "/";
    if (gathered) {
      std::error_code ec;
      if (!fs::is_directory(fs::path(fsroot) / "sys", ec)) {
        return absl::NotFoundError("sysfs root " + fsroot + ": no sys/ directory in it");
      }
      setenv("HWLOC_FSROOT", fsroot.c_str(), 1);
    }
    rc = hwloc_topology_load(raw);
    err = errno;
    if (gathered) unsetenv("HWLOC_FSROOT");
  }
  if (rc != 0) {
    const std::string what = xml.empty() ? "hwloc discovery" : "topology XML " + xml;
    return absl::InvalidArgumentError(what + ": hwloc failed to load it (malformed or " +
                                      "unsupported, e.g. an hwloc 3.x export): " +
                                      std::strerror(err));
  }

  HwlocTree tree;
  for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_NUMANODE, n));) {
    tree.numa_nodes.push_back(static_cast<int>(n->os_index));
  }
  for (hwloc_obj_t d = nullptr; (d = hwloc_get_next_pcidev(raw, d));) {
    HwlocPciDevice dev;
    dev.place = PlacementOf(raw, d);
    dev.class_id = d->attr->pcidev.class_id;
    dev.vendor = d->attr->pcidev.vendor_id;
    dev.device = d->attr->pcidev.device_id;
    tree.pci.push_back(std::move(dev));
  }
  for (hwloc_obj_t os = nullptr; (os = hwloc_get_next_osdev(raw, os));) {
    if (EnumValue(os->attr->osdev.type) != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    hwloc_obj_t parent = os->parent;
    if (!parent || parent->type != HWLOC_OBJ_PCI_DEVICE) continue;  // not a PCI function
    tree.openfabrics.push_back(HcaFromOsdev(raw, os, parent));
  }
  return tree;
}

}  // namespace rdp::topology
