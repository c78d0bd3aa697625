// HCAs from /sys/class/infiniband and friends, read through an Env (base/env.h): paths here are
// the node's own, and tests run on trees they lay out themselves.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/env.h"
#include "base/log.h"
#include "topology/discovery.h"
#include "topology/internal/sysfs_util.h"

namespace rdp::topology {
namespace {

constexpr char kSysDevices[] = "/sys/devices";
constexpr char kClass[] = "/sys/class";
constexpr char kDevInfiniband[] = "/dev/infiniband";

std::string AfterColon(const std::string& s) {
  // "4: ACTIVE" -> "ACTIVE"; a value without a number prefix is kept as is.
  auto pos = s.find(": ");
  return pos == std::string::npos ? s : s.substr(pos + 2);
}

std::string Join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

// ibdev name -> device names of a class such as infiniband_verbs ("uverbs0").
std::map<std::string, std::vector<std::pair<int, std::string>>> ReadClassByIbdev(
    Env& env, const std::string& class_dir) {
  std::map<std::string, std::vector<std::pair<int, std::string>>> out;
  for (const std::string& entry : env.ListDir(class_dir, /*dirs_only=*/true)) {
    auto ibdev = ReadAttribute(env, Join(Join(class_dir, entry), "ibdev"));
    if (!ibdev || ibdev->empty()) continue;
    int port = 0;
    if (auto p = ReadAttribute(env, Join(Join(class_dir, entry), "port"));
        !p || !absl::SimpleAtoi(*p, &port)) {
      port = 0;
    }
    out[*ibdev].emplace_back(port, entry);
  }
  for (auto& [name, v] : out) std::sort(v.begin(), v.end());
  return out;
}

// "0000:0000:0000:0000:0000:ffff:c000:020a" (how sysfs prints a GID) -> "192.0.2.10" when the
// GID is an IPv4-mapped IPv6 address (::ffff:a.b.c.d: a RoCE GID made from an IPv4 address);
// nullopt otherwise (an IPv6 address, the all-zero unused entry, anything malformed).
std::optional<std::string> Ipv4OfGid(const std::string& gid) {
  std::vector<std::string> groups = absl::StrSplit(gid, ':');
  if (groups.size() != 8) return std::nullopt;
  std::vector<std::uint32_t> words;
  for (const std::string& g : groups) {
    std::uint32_t w = 0;
    if (g.empty() || g.size() > 4 || !absl::SimpleHexAtoi(g, &w)) return std::nullopt;
    words.push_back(w);
  }
  for (int i = 0; i < 5; ++i) {
    if (words[i] != 0) return std::nullopt;
  }
  if (words[5] != 0xffff) return std::nullopt;
  return absl::StrCat(words[6] >> 8, ".", words[6] & 0xff, ".", words[7] >> 8, ".",
                      words[7] & 0xff);
}

// Port::roce_v2_ipv4_gid and what goes with it, from <port dir>/gids and gid_attrs. The kernel
// lists every entry of the table (most all-zero); types/<i> of an unused entry fails to read.
void ReadRoceGid(Env& env, const std::string& dir, Port& port) {
  std::vector<int> indices;
  for (const std::string& entry : env.ListDir(Join(dir, "gids"), /*dirs_only=*/false)) {
    int i = 0;
    if (absl::SimpleAtoi(entry, &i) && i >= 0) indices.push_back(i);
  }
  std::sort(indices.begin(), indices.end());
  for (const int i : indices) {
    const std::string index = std::to_string(i);
    const auto gid = ReadAttribute(env, Join(Join(dir, "gids"), index));
    if (!gid) continue;
    const auto ipv4 = Ipv4OfGid(*gid);
    if (!ipv4) continue;
    if (ReadAttribute(env, Join(dir, "gid_attrs/types/" + index)).value_or("") != "RoCE v2") {
      continue;
    }
    port.roce_v2_ipv4_gid = i;
    port.gid_ipv4 = *ipv4;
    port.gid_netdev = ReadAttribute(env, Join(dir, "gid_attrs/ndevs/" + index)).value_or("");
    return;
  }
}

std::vector<Port> ReadPorts(Env& env, const std::string& ports_dir, const std::string& hca) {
  std::vector<Port> ports;
  for (const std::string& entry : env.ListDir(ports_dir, /*dirs_only=*/true)) {
    Port port;
    if (!absl::SimpleAtoi(entry, &port.number) || port.number <= 0) continue;
    const std::string dir = Join(ports_dir, entry);
    auto state = ReadAttribute(env, Join(dir, "state"));
    if (!state) {
      Logger("topology")->warn("cannot read {}: port {} of {} counts as not ACTIVE",
                               env.HostPath(Join(dir, "state")), entry, hca);
    }
    port.state = state ? AfterColon(*state) : "";
    port.phys_state = AfterColon(ReadAttribute(env, Join(dir, "phys_state")).value_or(""));
    port.link_layer = ReadAttribute(env, Join(dir, "link_layer")).value_or("");
    port.rate = ReadAttribute(env, Join(dir, "rate")).value_or("");
    if (port.link_layer == "Ethernet") ReadRoceGid(env, dir, port);
    ports.push_back(std::move(port));
  }
  std::sort(ports.begin(), ports.end(),
            [](const Port& a, const Port& b) { return a.number < b.number; });
  return ports;
}

// The basename of what `link` points to ("/sys/bus/pci/drivers/mlx5_core" -> "mlx5_core"); ""
// when it does not resolve.
std::string LinkTargetName(Env& env, const std::string& link) {
  const std::optional<std::string> target = env.Resolve(link);
  return target ? target->substr(target->rfind('/') + 1) : "";
}

// "0x15B3" (how sysfs prints a PCI ID) -> "15b3"; "" unless it is 1 to 4 hex digits.
std::string PciId(const std::optional<std::string>& text) {
  if (!text) return "";
  std::string digits = *text;
  if (digits.rfind("0x", 0) == 0 || digits.rfind("0X", 0) == 0) digits = digits.substr(2);
  std::uint32_t v = 0;
  if (digits.empty() || digits.size() > 4 || !absl::SimpleHexAtoi(digits, &v)) return "";
  std::string out;
  AppendHex(out, v, 4);
  return out;
}

// The netlink type of a netdev (sysfs net/<if>/type, ARPHRD_*): 1 "ether", 32 "infiniband",
// another number as it is; "" when it cannot be read.
std::string LinkTypeName(const std::optional<std::string>& text) {
  int type = 0;
  if (!text || !absl::SimpleAtoi(*text, &type)) return "";
  if (type == 1) return "ether";
  if (type == 32) return "infiniband";
  return std::to_string(type);
}

// The identity of the HCA's PCI function (vendor, device, driver, physfn), of its netdev and of
// the RDMA device (fw_ver, node_guid). A file that cannot be read leaves its field "".
void ReadIdentity(Env& env, const std::string& device_dir, const std::string& ibdir, Hca& hca) {
  hca.vendor = PciId(ReadAttribute(env, Join(device_dir, "vendor")));
  hca.device = PciId(ReadAttribute(env, Join(device_dir, "device")));
  hca.driver = LinkTargetName(env, Join(device_dir, "driver"));
  if (const std::string pf = LinkTargetName(env, Join(device_dir, "physfn")); !pf.empty()) {
    hca.physfn = NormalizePci(pf).value_or("");
  }
  hca.firmware_version = ReadAttribute(env, Join(ibdir, "fw_ver")).value_or("");
  hca.node_guid = ReadAttribute(env, Join(ibdir, "node_guid")).value_or("");
  if (!hca.netdevs.empty()) {
    hca.netdev_link_type =
        LinkTypeName(ReadAttribute(env, Join(Join(Join(device_dir, "net"), hca.netdevs.front()),
                                             "type")));
  }
}

}  // namespace

std::string PcieRootFromDevicePath(const std::string& resolved) {
  const std::string prefix = std::string(kSysDevices) + "/";
  if (resolved.compare(0, prefix.size(), prefix) != 0) return "";
  const std::string first = resolved.substr(prefix.size(), resolved.find('/', prefix.size()) -
                                                               prefix.size());
  return first.rfind("pci", 0) == 0 ? first : "";
}

absl::StatusOr<std::vector<Hca>> ReadSysfsHcas(Env& env) {
  if (!env.IsDirectory("/sys")) {
    return absl::NotFoundError(env.HostPath("/sys") + " is not a readable directory");
  }
  auto verbs = ReadClassByIbdev(env, Join(kClass, "infiniband_verbs"));
  auto mads = ReadClassByIbdev(env, Join(kClass, "infiniband_mad"));
  auto log = Logger("topology");

  std::vector<Hca> hcas;
  const std::string infiniband = Join(kClass, "infiniband");
  for (const std::string& name : env.ListDir(infiniband, /*dirs_only=*/false)) {
    const std::string ibdir = Join(infiniband, name);
    std::optional<std::string> resolved = env.Resolve(Join(ibdir, "device"));
    if (!resolved) {
      log->warn("skipping RDMA device {}: cannot resolve {}", name,
                env.HostPath(Join(ibdir, "device")));
      continue;
    }
    auto pci = NormalizePci(resolved->substr(resolved->rfind('/') + 1));
    if (!pci) {
      log->warn("skipping RDMA device {}: {} is not a PCI function", name,
                env.HostPath(*resolved));
      continue;
    }
    Hca hca;
    hca.name = name;
    hca.place.pci = *pci;
    hca.place.pcie_root = PcieRootFromDevicePath(*resolved);
    int numa = -1;
    if (auto text = ReadAttribute(env, Join(*resolved, "numa_node"));
        text && absl::SimpleAtoi(*text, &numa) && numa >= 0) {
      hca.place.numa = numa;
    }
    hca.ports = ReadPorts(env, Join(ibdir, "ports"), name);
    hca.netdevs = env.ListDir(Join(*resolved, "net"), /*dirs_only=*/false);
    ReadIdentity(env, *resolved, ibdir, hca);
    if (auto it = verbs.find(name); it != verbs.end()) hca.uverbs = it->second.front().second;
    if (auto it = mads.find(name); it != mads.end()) {
      for (const auto& [port, entry] : it->second) {
        (entry.rfind("issm", 0) == 0 ? hca.issm : hca.umad).push_back(entry);
      }
    }
    if (!hca.uverbs.empty()) {
      const std::string node = Join(kDevInfiniband, hca.uverbs);
      hca.char_devices.emplace_back(node, env.Exists(node));
    }
    for (const auto* list : {&hca.umad, &hca.issm}) {
      for (const std::string& d : *list) {
        const std::string node = Join(kDevInfiniband, d);
        hca.char_devices.emplace_back(node, env.Exists(node));
      }
    }
    hcas.push_back(std::move(hca));
  }
  DropDuplicatePci(hcas, "HCA", [](const Hca& h) { return h.name; });
  return hcas;
}

absl::StatusOr<std::vector<Hca>> ReadSysfsHcas(const std::string& sysfs_root,
                                                const std::string& dev_root) {
  NodeRoots roots;
  roots.sysfs = sysfs_root.empty() ? "/" : sysfs_root;
  roots.dev = dev_root.empty() ? "/" : dev_root;
  std::shared_ptr<Env> env = NewNodeEnv(roots);
  return ReadSysfsHcas(*env);
}

}  // namespace rdp::topology
