#include "topology/internal/hwloc_tree.h"

#include <fcntl.h>
#include <hwloc.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <tuple>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fmt/format.h"
#include "topology/internal/numa.h"
#include "topology/internal/sysfs_util.h"

extern char** environ;

namespace rdp::topology {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology_t t) const { hwloc_topology_destroy(t); }
};
using TopologyHandle = std::unique_ptr<hwloc_topology, TopologyDeleter>;

// "dddd:bb:dd.f", as NormalizePci spells it (hand-formatted: every PCI object and bridge of the
// tree is named this way on each discovery).
std::string BusId(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  std::string out;
  out.reserve(12);
  AppendHex(out, pci.domain, 4);
  out.push_back(':');
  AppendHex(out, pci.bus, 2);
  out.push_back(':');
  AppendHex(out, pci.dev, 2);
  out.push_back('.');
  AppendHex(out, pci.func, 1);
  return out;
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
  out.reserve(chain.size());
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

struct BitmapDeleter {
  void operator()(hwloc_bitmap_t b) const { hwloc_bitmap_free(b); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

// The ids of a nodeset, ascending.
std::vector<int> Ids(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr || hwloc_bitmap_weight(set) < 0) return out;  // infinite: nothing to name
  for (int id = hwloc_bitmap_first(set); id >= 0; id = hwloc_bitmap_next(set, id)) {
    out.push_back(id);
  }
  return out;
}

std::vector<int> LocalityOf(hwloc_topology_t topo, hwloc_obj_t o) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
  return anc ? Ids(anc->nodeset) : std::vector<int>{};
}

bool StrictlyBelow(hwloc_obj_t obj, hwloc_obj_t ancestor) {
  for (hwloc_obj_t p = obj ? obj->parent : nullptr; p; p = p->parent) {
    if (p == ancestor) return true;
  }
  return false;
}

// HwlocTree::numa_nodes (see there for the rules).
std::vector<NumaNode> NumaNodesOf(hwloc_topology_t topo) {
  std::vector<hwloc_obj_t> objs;
  for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n));) {
    objs.push_back(n);
  }
  std::vector<char> memory_only(objs.size(), 0);
  for (std::size_t i = 0; i < objs.size(); ++i) {
    const hwloc_obj_t n = objs[i];
    const hwloc_const_bitmap_t complete = n->complete_cpuset ? n->complete_cpuset : n->cpuset;
    memory_only[i] = complete == nullptr || hwloc_bitmap_iszero(complete) ||
                     (n->subtype != nullptr && IsMemoryOnlyKind(n->subtype));
  }
  std::vector<NumaNode> out;
  out.reserve(objs.size());
  Bitmap below(hwloc_bitmap_alloc());
  for (std::size_t i = 0; i < objs.size(); ++i) {
    const hwloc_obj_t n = objs[i];
    NumaNode node;
    node.id = static_cast<int>(n->os_index);
    bool cpuless = memory_only[i] != 0;
    if (!cpuless && n->cpuset != nullptr && !hwloc_bitmap_iszero(n->cpuset)) {
      hwloc_bitmap_zero(below.get());
      for (std::size_t j = 0; j < objs.size(); ++j) {
        if (memory_only[j] || objs[j]->cpuset == nullptr ||
            !StrictlyBelow(objs[j], n->parent) || objs[j]->parent == n->parent) {
          continue;
        }
        hwloc_bitmap_or(below.get(), below.get(), objs[j]->cpuset);
      }
      cpuless = hwloc_bitmap_isincluded(n->cpuset, below.get());
    }
    node.has_cpus = !cpuless;
    if (node.has_cpus) {
      char* list = nullptr;
      if (hwloc_bitmap_list_asprintf(&list, n->cpuset) >= 0 && list != nullptr) node.cpus = list;
      std::free(list);
    } else if (n->subtype != nullptr) {
      node.memory_kind = n->subtype;
    }
    out.push_back(std::move(node));
  }
  return out;
}

PciPlacement PlacementOf(hwloc_topology_t topo, hwloc_obj_t dev, const std::vector<int>& cpuless,
                         std::vector<int>* locality) {
  PciPlacement place;
  place.pci = BusId(dev->attr->pcidev);
  *locality = LocalityOf(topo, dev);
  place.numa = DeviceNuma(std::nullopt, *locality, cpuless);
  place.bridges_known = true;
  thread_local std::vector<hwloc_obj_t> up;  // reused: one per PCI function of every discovery
  up.clear();
  for (hwloc_obj_t p = dev->parent; p && p->type == HWLOC_OBJ_BRIDGE; p = p->parent) {
    if (IsHostBridge(p)) {
      place.pcie_root = "pci";
      AppendHex(place.pcie_root, p->attr->bridge.downstream.pci.domain, 4);
      place.pcie_root.push_back(':');
      AppendHex(place.pcie_root, p->attr->bridge.downstream.pci.secondary_bus, 2);
      break;
    }
    up.push_back(p);
  }
  std::reverse(up.begin(), up.end());  // root port first
  place.bridges = ClassifyChain(up);
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

// N of an info named "Port<N>State" (N decimal, 1 to 9999), else 0. By hand: an OpenFabrics
// device has a dozen infos, read on every discovery.
int PortOfStateInfo(const char* name) {
  if (name == nullptr || std::strncmp(name, "Port", 4) != 0) return 0;
  int port = 0, digits = 0;
  const char* p = name + 4;
  for (; *p >= '0' && *p <= '9' && digits < 5; ++p, ++digits) port = port * 10 + (*p - '0');
  if (digits == 0 || digits == 5 || std::strcmp(p, "State") != 0) return 0;
  return port;
}

Hca HcaFromOsdev(hwloc_obj_t os, hwloc_obj_t pcidev, const PciPlacement& place) {
  Hca hca;
  hca.name = os->name ? os->name : "";
  hca.place = place;
  AppendHex(hca.vendor, pcidev->attr->pcidev.vendor_id, 4);
  AppendHex(hca.device, pcidev->attr->pcidev.device_id, 4);
  for (unsigned i = 0; i < os->infos_count; ++i) {
    if (os->infos[i].name && os->infos[i].value &&
        std::strcmp(os->infos[i].name, "NodeGUID") == 0) {
      hca.node_guid = os->infos[i].value;
    }
    const int port = PortOfStateInfo(os->infos[i].name);
    if (port > 0) {
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

constexpr char kProbeFlag[] = "--rdp-hwloc-xml-probe";

// What a probe child exits with.
enum ProbeExit { kProbeLoaded = 0, kProbeRefused = 3, kProbeFailed = 4, kProbeOrphan = 5 };

// The probe child: `<exe> --rdp-hwloc-xml-probe <parent pid> <xml>`, run from a fresh exec of the
// program (never a fork of a multi-threaded one). It dies with its parent, and by the signal
// itself on a crash (not through a sanitizer's or fuzzer's handler), and never returns.
[[noreturn]] void RunProbe(const std::string& parent, const std::string& xml) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (std::to_string(::getppid()) != parent) ::_exit(kProbeOrphan);  // the parent already died
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    struct sigaction sa = {};
    sa.sa_handler = SIG_DFL;
    ::sigaction(sig, &sa, nullptr);
  }
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) ::_exit(kProbeRefused);
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_set_xml(t, xml.c_str()) != 0) ::_exit(kProbeRefused);
  // No destroy, no atexit handlers: the process ends here.
  ::_exit(hwloc_topology_load(t) == 0 ? kProbeLoaded : kProbeFailed);
}

// This program's arguments, from /proc (static initialization runs before main() has them).
std::vector<std::string> OwnArguments() {
  std::vector<std::string> args;
  const int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return args;
  std::string data;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) data.append(buf, static_cast<std::size_t>(n));
    if (data.size() > (1u << 20)) break;
  }
  ::close(fd);
  for (std::size_t pos = 0; pos < data.size();) {
    const std::size_t end = data.find('\0', pos);
    args.push_back(data.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return args;
}

// Runs before main() in every program that links this file (the plugin, the tests, the fuzzers,
// the benchmarks), while the process is still single-threaded: the only safe moment to write the
// environment that hwloc reads at every load. A probe child goes no further than RunProbe.
const bool kHwlocEnvironmentPinned = [] {
  const std::vector<std::string> args = OwnArguments();
  if (args.size() == 4 && args[1] == kProbeFlag) RunProbe(args[2], args[3]);
  // The same parser and PCI discovery whether or not Debian's libhwloc-plugins is installed: no
  // dynamic plugins (hwloc_xml_libxml, hwloc_pci, ...), and hwloc's own XML parser.
  ::setenv("HWLOC_PLUGINS_PATH", "", 1);
  ::setenv("HWLOC_LIBXML_IMPORT", "0", 1);
  // The flags alone choose what hwloc reads: nothing inherited from the environment replaces the
  // live machine or the XML (UseHwlocRoot sets HWLOC_FSROOT for a gathered tree).
  for (const char* name : {"HWLOC_XMLFILE", "HWLOC_SYNTHETIC", "HWLOC_COMPONENTS", "HWLOC_FSROOT",
                           "HWLOC_FORCE_XMLFILE", "HWLOC_FORCE_FSROOT"}) {
    ::unsetenv(name);
  }
  return true;
}();

// hwloc 2.9.0 dereferences NULL inside hwloc_topology_load on some malformed XML (found by
// fuzz_hwloc_xml; test/fuzz/regressions/hwloc_xml/hwloc-crashes-on-it.xml), and a load has no
// deadline; and when it refuses a file it may leak what it had read (an XML ending inside an
// object). So an XML is loaded first in a child process: this program executed again with
// kProbeFlag (a fork of a multi-threaded process must not run hwloc). A crash, a hang or a
// refusal there becomes an error naming the file, and only a file that loaded there is loaded
// here. A file probed once is not probed again while unchanged (ProbeXmlOnce).
constexpr absl::Duration kXmlProbeTimeout = absl::Seconds(20);

absl::Status ProbeXmlInChild(const std::string& xml) {
  const std::string parent = std::to_string(::getpid());
  std::vector<std::string> args = {"rdp-hwloc-xml-probe", kProbeFlag, parent, xml};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return absl::OkStatus();  // cannot probe: load in this process as before
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
  switch (code) {
    case kProbeLoaded:
      return absl::OkStatus();
    case kProbeRefused:
      return absl::InvalidArgumentError("topology XML " + xml + ": hwloc cannot use it");
    case kProbeFailed:
      return absl::InvalidArgumentError("topology XML " + xml +
                                        ": hwloc failed to load it (malformed or unsupported, "
                                        "e.g. an hwloc 3.x export)");
    default:  // not our probe (a program that exits before static init ends): load here
      return absl::OkStatus();
  }
}

bool IsGatheredRoot(const std::string& fsroot) { return !fsroot.empty() && fsroot != "/"; }

}  // namespace

absl::Status UseHwlocRoot(const std::string& fsroot) {
  if (!IsGatheredRoot(fsroot)) {
    ::unsetenv("HWLOC_FSROOT");
    return absl::OkStatus();
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(std::filesystem::path(fsroot) / "sys", ec)) {
    return absl::NotFoundError("sysfs root " + fsroot + ": no sys/ directory in it");
  }
  ::setenv("HWLOC_FSROOT", fsroot.c_str(), 1);
  return absl::OkStatus();
}

// ProbeXmlInChild, once per version of a file in this process: a file that loaded in a child
// loads here again without a new child for as long as it is the same file, unchanged (device,
// inode, size, modification time: `st`, its stat now). Only successes are remembered.
absl::Status ProbeXmlOnce(const std::string& xml, const struct stat& st) {
  using Version = std::tuple<dev_t, ino_t, off_t, time_t, long, std::string>;
  const Version version{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                        xml};
  static absl::Mutex mu(absl::kConstInit);
  static auto* probed = new std::set<Version>();
  {
    absl::MutexLock lock(&mu);
    if (probed->count(version) != 0) return absl::OkStatus();
  }
  if (absl::Status s = ProbeXmlInChild(xml); !s.ok()) return s;
  absl::MutexLock lock(&mu);
  probed->insert(version);
  return absl::OkStatus();
}

absl::StatusOr<HwlocTree> LoadHwlocTree(const std::string& xml, const std::string& fsroot) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return absl::InternalError("hwloc_topology_init failed");
  TopologyHandle topo(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);

  int rc = 0;
  int err = 0;
  if (!xml.empty()) {
    // A regular file: one stat, which also names the file's version (a file we may not read
    // fails in the probe or in hwloc_topology_set_xml below, with the reason).
    struct stat st;
    if (::stat(xml.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::NotFoundError("topology XML " + xml + ": no such regular file");
    }
    if (absl::Status probe = ProbeXmlOnce(xml, st); !probe.ok()) return probe;
    if (hwloc_topology_set_xml(raw, xml.c_str()) != 0) {
      return absl::InvalidArgumentError("topology XML " + xml + ": hwloc cannot use it: " +
                                        std::strerror(errno));
    }
    rc = hwloc_topology_load(raw);
    err = errno;
  } else {
    // hwloc takes the root from HWLOC_FSROOT, which UseHwlocRoot set before threads started;
    // this only reads it.
    const char* env = std::getenv("HWLOC_FSROOT");
    const std::string pinned = env ? env : "";
    if (IsGatheredRoot(fsroot) != IsGatheredRoot(pinned) ||
        (IsGatheredRoot(fsroot) && pinned != fsroot)) {
      return absl::FailedPreconditionError(fmt::format(
          "hwloc would read the node under '{}', not under the sysfs root '{}': "
          "topology::UseHwlocRoot sets its root once, before threads start",
          IsGatheredRoot(pinned) ? pinned : "/", IsGatheredRoot(fsroot) ? fsroot : "/"));
    }
    rc = hwloc_topology_load(raw);
    err = errno;
  }
  if (rc != 0) {
    const std::string what = xml.empty() ? "hwloc discovery" : "topology XML " + xml;
    return absl::InvalidArgumentError(what + ": hwloc failed to load it (malformed or " +
                                      "unsupported, e.g. an hwloc 3.x export): " +
                                      std::strerror(err));
  }

  HwlocTree tree;
  tree.pci.reserve(static_cast<std::size_t>(
      std::max(0, hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PCI_DEVICE))));
  tree.numa_nodes = NumaNodesOf(raw);
  const std::vector<int> cpuless = CpulessIds(tree.numa_nodes);
  // Each PCI function's placement is computed once; an OS device's parent finds its own through
  // userdata (the topology is ours and dies with this call).
  for (hwloc_obj_t d = nullptr; (d = hwloc_get_next_pcidev(raw, d));) {
    HwlocPciDevice dev;
    dev.place = PlacementOf(raw, d, cpuless, &dev.locality);
    dev.class_id = d->attr->pcidev.class_id;
    dev.vendor = d->attr->pcidev.vendor_id;
    dev.device = d->attr->pcidev.device_id;
    tree.pci.push_back(std::move(dev));
    d->userdata = reinterpret_cast<void*>(tree.pci.size());  // index + 1
  }
  for (hwloc_obj_t os = nullptr; (os = hwloc_get_next_osdev(raw, os));) {
    if (EnumValue(os->attr->osdev.type) != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    hwloc_obj_t parent = os->parent;
    if (!parent || parent->type != HWLOC_OBJ_PCI_DEVICE) continue;  // not a PCI function
    const auto index = reinterpret_cast<std::size_t>(parent->userdata);
    std::vector<int> locality;
    const PciPlacement place = index > 0 ? tree.pci[index - 1].place
                                         : PlacementOf(raw, parent, cpuless, &locality);
    tree.openfabrics.push_back(HcaFromOsdev(os, parent, place));
    tree.openfabrics_locality.push_back(index > 0 ? tree.pci[index - 1].locality : locality);
  }
  return tree;
}

}  // namespace rdp::topology
