#include "sim/sysfs_fixture.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "fmt/format.h"

namespace rdp::sim {
namespace fs = std::filesystem;
namespace {

// Device numbers as the kernel gives them: ib_uverbs and ib_umad share major 231 (uverbsN is
// minor 192+N, umadN N, issmN 64+N); rdma_cm is a misc device (major 10, minor dynamic).
constexpr int kIbMajor = 231;
constexpr int kUverbsMinorBase = 192;
constexpr int kIssmMinorBase = 64;
constexpr int kMiscMajor = 10;
constexpr int kRdmaCmMinor = 58;

absl::Status Write(const fs::path& file, const std::string& content) {
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  if (ec) return absl::InternalError("mkdir " + file.parent_path().string() + ": " + ec.message());
  std::ofstream out(file, std::ios::trunc);
  out << content << "\n";
  out.close();
  if (!out) return absl::InternalError("cannot write " + file.string());
  return absl::OkStatus();
}

absl::Status Mkdir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  return ec ? absl::InternalError("mkdir " + dir.string() + ": " + ec.message())
            : absl::OkStatus();
}

// A relative symlink link -> target, as sysfs has them.
absl::Status Symlink(const fs::path& target, const fs::path& link) {
  std::error_code ec;
  fs::create_directories(link.parent_path(), ec);
  fs::remove(link, ec);
  const fs::path relative = fs::relative(target, link.parent_path(), ec);
  if (!ec) fs::create_symlink(relative, link, ec);
  return ec ? absl::InternalError("symlink " + link.string() + ": " + ec.message())
            : absl::OkStatus();
}

// A name that stays one entry of the directory it is put in: not empty, no '/', not "." or
// "..". Anything else could lay the node out beside (or above) its root.
absl::Status OneEntry(const std::string& what, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(what + " '" + name + "' is not a file name");
  }
  return absl::OkStatus();
}

int PortStateNumber(const std::string& s) {
  if (s == "DOWN") return 1;
  if (s == "INIT") return 2;
  if (s == "ARMED") return 3;
  if (s == "ACTIVE") return 4;
  if (s == "ACTIVE_DEFER") return 5;
  return 0;
}

int PhysStateNumber(const std::string& s) {
  if (s == "Sleep") return 1;
  if (s == "Polling") return 2;
  if (s == "Disabled") return 3;
  if (s == "LinkUp") return 5;
  return 0;
}

// A device's root for the layout: its own, or "pci<domain>:<bus>" of its address.
std::string LaidOutRoot(const topology::PciPlacement& place) {
  return place.pcie_root.empty() ? "pci" + place.pci.substr(0, 7) : place.pcie_root;
}

#define RDP_RETURN_IF_ERROR(expr)      \
  do {                                 \
    absl::Status _st = (expr);         \
    if (!_st.ok()) return _st;         \
  } while (0)

}  // namespace

std::map<std::string, std::uint64_t> FixtureCounters(int k, int port) {
  const std::uint64_t n = static_cast<std::uint64_t>(k) + 1;
  return {{"port_rcv_data", 1000000 * n + port}, {"port_xmit_data", 2000000 * n + port},
          {"port_rcv_packets", 10000 * n},       {"port_xmit_packets", 20000 * n},
          {"symbol_error", 0},                   {"link_downed", n - 1},
          {"port_rcv_errors", 0}};
}

SysfsFixture::SysfsFixture(std::string root) : root_(std::move(root)) {
  std::error_code ec;
  fs::create_directories(root_, ec);
}

SysfsFixture::Laid* SysfsFixture::Find(const std::string& name) {
  for (Laid& l : laid_) {
    if (l.hca.name == name) return &l;
  }
  return nullptr;
}

absl::Status SysfsFixture::AddHca(const FixtureHca& given) {
  FixtureHca hca = given;
  Laid* pf = nullptr;
  if (!hca.physfn.empty()) {
    for (Laid& l : laid_) {
      if (l.hca.pci == hca.physfn) pf = &l;
    }
    if (pf == nullptr) {
      return absl::NotFoundError("VF " + hca.pci + ": no PF " + hca.physfn + " laid out");
    }
    hca.pcie_root = pf->hca.pcie_root;
    hca.bridges = pf->hca.bridges;
    hca.numa = pf->hca.numa;
  }
  RDP_RETURN_IF_ERROR(OneEntry("HCA name", hca.name));
  RDP_RETURN_IF_ERROR(OneEntry("PCIe root", hca.pcie_root));
  RDP_RETURN_IF_ERROR(OneEntry("PCI address", hca.pci));
  for (const std::string& b : hca.bridges) RDP_RETURN_IF_ERROR(OneEntry("bridge", b));
  for (const std::string& n : hca.netdevs) RDP_RETURN_IF_ERROR(OneEntry("netdev", n));
  if (Find(hca.name)) return absl::AlreadyExistsError("HCA " + hca.name + " already laid out");
  const fs::path sys = fs::path(root_) / "sys";
  fs::path dev_dir = sys / "devices" / hca.pcie_root;
  for (const std::string& b : hca.bridges) dev_dir /= b;
  dev_dir /= hca.pci;

  Laid laid{hca, dev_dir.string(), -1, {}};
  RDP_RETURN_IF_ERROR(Write(dev_dir / "numa_node", std::to_string(hca.numa)));
  RDP_RETURN_IF_ERROR(Write(dev_dir / "vendor", "0x" + hca.vendor));
  RDP_RETURN_IF_ERROR(Write(dev_dir / "device", "0x" + hca.device));
  RDP_RETURN_IF_ERROR(Write(dev_dir / "class", "0x020700"));
  RDP_RETURN_IF_ERROR(Symlink(dev_dir, sys / "bus" / "pci" / "devices" / hca.pci));
  if (!hca.driver.empty()) {
    RDP_RETURN_IF_ERROR(OneEntry("driver", hca.driver));
    const fs::path driver = sys / "bus" / "pci" / "drivers" / hca.driver;
    RDP_RETURN_IF_ERROR(Mkdir(driver));
    RDP_RETURN_IF_ERROR(Symlink(driver, dev_dir / "driver"));
    RDP_RETURN_IF_ERROR(Symlink(dev_dir, driver / hca.pci));
  }
  if (pf != nullptr) {
    const fs::path virtfn = fs::path(pf->device_dir) / fmt::format("virtfn{}", pf->virtfns++);
    RDP_RETURN_IF_ERROR(Symlink(pf->device_dir, dev_dir / "physfn"));
    RDP_RETURN_IF_ERROR(Symlink(dev_dir, virtfn));
    laid.virtfn_link = virtfn.string();
  }
  const bool infiniband = !hca.ports.empty() && hca.ports.front().link_layer == "InfiniBand";
  // Each netdev with a hardware address made from the function's address and the netdev's
  // index, so that it is stable and differs between netdevs: "0000:1a:00.0", 0 ->
  // "02:00:00:1a:00:00" (a locally administered address).
  for (std::size_t i = 0; i < hca.netdevs.size(); ++i) {
    RDP_RETURN_IF_ERROR(Mkdir(dev_dir / "net" / hca.netdevs[i]));
    RDP_RETURN_IF_ERROR(Write(dev_dir / "net" / hca.netdevs[i] / "address", NetdevAddress(hca.pci, i)));
    // ARPHRD_INFINIBAND or ARPHRD_ETHER, as the kernel prints net/<if>/type.
    RDP_RETURN_IF_ERROR(Write(dev_dir / "net" / hca.netdevs[i] / "type", infiniband ? "32" : "1"));
  }
  RDP_RETURN_IF_ERROR(LayOutRdma(laid));
  laid_.push_back(std::move(laid));
  return absl::OkStatus();
}

absl::Status SysfsFixture::LayOutRdma(Laid& laid) {
  const FixtureHca& hca = laid.hca;
  const fs::path sys = fs::path(root_) / "sys";
  const fs::path dev_dir = laid.device_dir;
  laid.uverbs = next_uverbs_++;
  laid.mads.clear();
  const fs::path ib = dev_dir / "infiniband" / hca.name;
  RDP_RETURN_IF_ERROR(Symlink(dev_dir, ib / "device"));
  RDP_RETURN_IF_ERROR(Write(ib / "fw_ver", hca.firmware_version));
  RDP_RETURN_IF_ERROR(
      Write(ib / "node_guid", hca.node_guid.empty() ? FixtureNodeGuid(hca.pci) : hca.node_guid));
  for (const FixturePort& p : hca.ports) {
    const fs::path pd = ib / "ports" / std::to_string(p.number);
    RDP_RETURN_IF_ERROR(Write(pd / "state", fmt::format("{}: {}", PortStateNumber(p.state), p.state)));
    RDP_RETURN_IF_ERROR(
        Write(pd / "phys_state", fmt::format("{}: {}", PhysStateNumber(p.phys_state), p.phys_state)));
    RDP_RETURN_IF_ERROR(Write(pd / "link_layer", p.link_layer));
    RDP_RETURN_IF_ERROR(Write(pd / "rate", p.rate));
    int table = 0;
    for (const FixtureGid& g : p.gids) table = std::max(table, g.index + 1);
    for (int i = 0; i < table; ++i) {
      const FixtureGid* used = nullptr;
      for (const FixtureGid& g : p.gids) {
        if (g.index == i) used = &g;
      }
      const std::string index = std::to_string(i);
      RDP_RETURN_IF_ERROR(Write(pd / "gids" / index,
                                used ? used->gid : "0000:0000:0000:0000:0000:0000:0000:0000"));
      if (used == nullptr) continue;
      RDP_RETURN_IF_ERROR(Write(pd / "gid_attrs" / "types" / index, used->type));
      RDP_RETURN_IF_ERROR(Write(pd / "gid_attrs" / "ndevs" / index, used->netdev));
    }
    const auto counters = p.counters.empty() ? FixtureCounters(laid.uverbs, p.number) : p.counters;
    for (const auto& [file, value] : counters) {
      RDP_RETURN_IF_ERROR(OneEntry("counter", file));
      RDP_RETURN_IF_ERROR(Write(pd / "counters" / file, std::to_string(value)));
    }
  }
  RDP_RETURN_IF_ERROR(Symlink(ib, sys / "class" / "infiniband" / hca.name));

  const fs::path devib = fs::path(root_) / "dev" / "infiniband";
  const std::string uverbs = fmt::format("uverbs{}", laid.uverbs);
  const fs::path vd = dev_dir / "infiniband_verbs" / uverbs;
  RDP_RETURN_IF_ERROR(Write(vd / "ibdev", hca.name));
  RDP_RETURN_IF_ERROR(
      Write(vd / "dev", fmt::format("{}:{}", kIbMajor, kUverbsMinorBase + laid.uverbs)));
  RDP_RETURN_IF_ERROR(Symlink(dev_dir, vd / "device"));
  RDP_RETURN_IF_ERROR(Symlink(vd, sys / "class" / "infiniband_verbs" / uverbs));
  RDP_RETURN_IF_ERROR(Write(sys / "class" / "infiniband_verbs" / "abi_version", "6"));
  RDP_RETURN_IF_ERROR(Write(devib / uverbs, ""));
  if (hca.umad) {
    for (const FixturePort& p : hca.ports) {
      const int n = next_mad_++;
      laid.mads.push_back(n);
      for (const char* kind : {"umad", "issm"}) {
        const std::string name = fmt::format("{}{}", kind, n);
        const fs::path md = dev_dir / "infiniband_mad" / name;
        RDP_RETURN_IF_ERROR(Write(md / "ibdev", hca.name));
        RDP_RETURN_IF_ERROR(Write(md / "port", std::to_string(p.number)));
        RDP_RETURN_IF_ERROR(Write(
            md / "dev", fmt::format("{}:{}", kIbMajor, (kind[0] == 'i' ? kIssmMinorBase : 0) + n)));
        RDP_RETURN_IF_ERROR(Symlink(md, sys / "class" / "infiniband_mad" / name));
        RDP_RETURN_IF_ERROR(Write(devib / name, ""));
      }
    }
    RDP_RETURN_IF_ERROR(Write(sys / "class" / "infiniband_mad" / "abi_version", "5"));
  }
  laid.bound = true;
  return absl::OkStatus();
}

void SysfsFixture::RemoveRdma(Laid& laid) {
  const fs::path sys = fs::path(root_) / "sys";
  const fs::path devib = fs::path(root_) / "dev" / "infiniband";
  std::error_code ec;
  // Class links first, as the kernel's device_del does, then the device's directories.
  fs::remove(sys / "class" / "infiniband" / laid.hca.name, ec);
  fs::remove(sys / "class" / "infiniband_verbs" / fmt::format("uverbs{}", laid.uverbs), ec);
  fs::remove(devib / fmt::format("uverbs{}", laid.uverbs), ec);
  for (int n : laid.mads) {
    for (const char* kind : {"umad", "issm"}) {
      fs::remove(sys / "class" / "infiniband_mad" / fmt::format("{}{}", kind, n), ec);
      fs::remove(devib / fmt::format("{}{}", kind, n), ec);
    }
  }
  for (const char* dir : {"infiniband", "infiniband_verbs", "infiniband_mad"}) {
    fs::remove_all(fs::path(laid.device_dir) / dir, ec);
  }
  laid.bound = false;
}

absl::Status SysfsFixture::UnbindRdma(const std::string& name) {
  Laid* l = Find(name);
  if (!l || !l->bound) return absl::NotFoundError("no bound HCA " + name);
  RemoveRdma(*l);
  return absl::OkStatus();
}

absl::Status SysfsFixture::BindRdma(const std::string& pci, const std::string& name) {
  RDP_RETURN_IF_ERROR(OneEntry("HCA name", name));
  for (Laid& l : laid_) {
    if (l.hca.pci != pci) continue;
    if (l.bound) return absl::AlreadyExistsError("HCA " + pci + " is bound as " + l.hca.name);
    if (Find(name)) return absl::AlreadyExistsError("HCA " + name + " already laid out");
    l.hca.name = name;
    return LayOutRdma(l);
  }
  return absl::NotFoundError("no PCI function " + pci);
}

absl::Status SysfsFixture::AddRdmaCm() {
  const fs::path sys = fs::path(root_) / "sys";
  const fs::path misc = sys / "devices" / "virtual" / "misc" / "rdma_cm";
  RDP_RETURN_IF_ERROR(Write(misc / "dev", fmt::format("{}:{}", kMiscMajor, kRdmaCmMinor)));
  RDP_RETURN_IF_ERROR(Symlink(misc, sys / "class" / "misc" / "rdma_cm"));
  return Write(fs::path(root_) / "dev" / "infiniband" / "rdma_cm", "");
}

absl::Status SysfsFixture::SetPortState(const std::string& name, int port,
                                        const std::string& state) {
  Laid* l = Find(name);
  if (!l) return absl::NotFoundError("no HCA " + name);
  const fs::path file = fs::path(l->device_dir) / "infiniband" / name / "ports" /
                        std::to_string(port) / "state";
  std::error_code ec;
  if (!fs::exists(file, ec)) return absl::NotFoundError("no port " + file.string());
  // Write to a temporary and rename, so a concurrent reader never sees a half-written file.
  const fs::path tmp = file.string() + ".tmp";
  RDP_RETURN_IF_ERROR(Write(tmp, fmt::format("{}: {}", PortStateNumber(state), state)));
  fs::rename(tmp, file, ec);
  return ec ? absl::InternalError("rename " + tmp.string() + ": " + ec.message())
            : absl::OkStatus();
}

absl::Status SysfsFixture::SetCounter(const std::string& name, int port,
                                      const std::string& counter, std::uint64_t value) {
  Laid* l = Find(name);
  if (!l) return absl::NotFoundError("no HCA " + name);
  RDP_RETURN_IF_ERROR(OneEntry("counter", counter));
  const fs::path dir = fs::path(l->device_dir) / "infiniband" / name / "ports" /
                       std::to_string(port);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return absl::NotFoundError("no port " + dir.string());
  const fs::path file = dir / "counters" / counter;
  const fs::path tmp = file.string() + ".tmp";
  RDP_RETURN_IF_ERROR(Write(tmp, std::to_string(value)));
  fs::rename(tmp, file, ec);
  return ec ? absl::InternalError("rename " + tmp.string() + ": " + ec.message())
            : absl::OkStatus();
}

absl::Status SysfsFixture::RemoveUverbs(const std::string& name) {
  Laid* l = Find(name);
  if (!l) return absl::NotFoundError("no HCA " + name);
  std::error_code ec;
  fs::remove(fs::path(root_) / "dev" / "infiniband" / fmt::format("uverbs{}", l->uverbs), ec);
  return ec ? absl::InternalError(ec.message()) : absl::OkStatus();
}

absl::Status SysfsFixture::RemoveHca(const std::string& name) {
  Laid* l = Find(name);
  if (!l) return absl::NotFoundError("no HCA " + name);
  std::error_code ec;
  if (l->bound) RemoveRdma(*l);
  fs::remove(fs::path(root_) / "sys" / "bus" / "pci" / "devices" / l->hca.pci, ec);
  if (!l->hca.driver.empty()) {
    fs::remove(fs::path(root_) / "sys" / "bus" / "pci" / "drivers" / l->hca.driver / l->hca.pci,
               ec);
  }
  if (!l->virtfn_link.empty()) fs::remove(l->virtfn_link, ec);
  fs::remove_all(l->device_dir, ec);
  if (ec) return absl::InternalError("remove " + l->device_dir + ": " + ec.message());
  laid_.erase(laid_.begin() + (l - laid_.data()));
  return absl::OkStatus();
}

absl::Status SysfsFixture::AddGpuDirect(const FixtureGpuDirect& g) {
  const fs::path root(root_);
  if (g.peermem == "sysfs") {
    RDP_RETURN_IF_ERROR(Write(root / "sys/module/nvidia_peermem/version", "550.54.15"));
  } else if (!g.peermem.empty() && g.peermem != "proc-modules") {
    return absl::InvalidArgumentError("peermem '" + g.peermem + "': sysfs, proc-modules or empty");
  }
  std::string modules = "nvidia_uvm 1679360 0 - Live 0xffffffffc1a00000 (POE)\n";
  if (g.peermem == "proc-modules") {
    modules += "nvidia_peermem 16384 0 - Live 0xffffffffc0a85000 (POE)\n";
  }
  modules += "mlx5_ib 479232 0 - Live 0xffffffffc0b00000";
  RDP_RETURN_IF_ERROR(Write(root / "proc/modules", modules));
  if (g.registered) {
    RDP_RETURN_IF_ERROR(Write(root / "sys/kernel/mm/memory_peers/nv_mem/version", "1.3-0"));
  } else if (g.memory_peers_dir) {
    RDP_RETURN_IF_ERROR(Mkdir(root / "sys/kernel/mm/memory_peers"));
  }
  if (!g.nvidia_version.empty()) {
    RDP_RETURN_IF_ERROR(Write(root / "proc/driver/nvidia/version",
                              g.nvidia_version + "\nGCC version:  gcc version 12.2.0"));
  }
  return Write(root / "proc/sys/kernel/osrelease", g.kernel_release);
}

std::string Ipv4Gid(const std::string& ipv4) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (std::sscanf(ipv4.c_str(), "%u.%u.%u.%u", &a, &b, &c, &d) != 4) return "";
  return fmt::format("0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}", a, b, c, d);
}

std::string NetdevAddress(const std::string& pci, std::size_t index) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  if (std::sscanf(pci.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) return "";
  return fmt::format("02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", domain & 0xff, bus & 0xff,
                     device & 0xff, function & 0xff, index & 0xff);
}

std::string FixtureNodeGuid(const std::string& pci) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  if (std::sscanf(pci.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) return "";
  return fmt::format("b8ce:f6{:02x}:{:04x}:{:04x}", domain & 0xff, bus & 0xffff,
                     ((device & 0xff) << 8) | (function & 0xff));
}

absl::Status SysfsFixture::AddGpu(const topology::Gpu& gpu) {
  RDP_RETURN_IF_ERROR(OneEntry("PCI address", gpu.place.pci));
  const fs::path sys = fs::path(root_) / "sys";
  fs::path dev_dir = sys / "devices" / LaidOutRoot(gpu.place);
  RDP_RETURN_IF_ERROR(OneEntry("PCIe root", LaidOutRoot(gpu.place)));
  for (const topology::Bridge& b : gpu.place.bridges) {
    RDP_RETURN_IF_ERROR(OneEntry("bridge", b.pci));
    dev_dir /= b.pci;
  }
  dev_dir /= gpu.place.pci;
  RDP_RETURN_IF_ERROR(Write(dev_dir / "numa_node", std::to_string(gpu.place.numa.value_or(-1))));
  RDP_RETURN_IF_ERROR(Write(dev_dir / "vendor", "0x" + gpu.vendor));
  RDP_RETURN_IF_ERROR(Write(dev_dir / "device", "0x" + gpu.device));
  if (!gpu.pci_class.empty()) {
    RDP_RETURN_IF_ERROR(Write(dev_dir / "class", "0x" + gpu.pci_class + "00"));
  }
  return Symlink(dev_dir, sys / "bus" / "pci" / "devices" / gpu.place.pci);
}

absl::Status SysfsFixture::AddNumaNodes(const std::vector<topology::NumaNode>& nodes) {
  const fs::path dir = fs::path(root_) / "sys" / "devices" / "system" / "node";
  for (const topology::NumaNode& n : nodes) {
    if (n.has_cpus && n.cpus.empty()) continue;  // its CPUs are not known
    RDP_RETURN_IF_ERROR(
        Write(dir / fmt::format("node{}", n.id) / "cpulist", n.has_cpus ? n.cpus : ""));
  }
  return absl::OkStatus();
}

absl::Status SysfsFixture::AddTopology(const topology::Topology& topology) {
  for (const topology::Gpu& g : topology.gpus()) RDP_RETURN_IF_ERROR(AddGpu(g));
  RDP_RETURN_IF_ERROR(AddNumaNodes(topology.all_numa_nodes()));
  std::vector<const topology::Hca*> pfs_first;
  for (const topology::Hca& h : topology.hcas()) {
    if (!h.IsVirtualFunction()) pfs_first.push_back(&h);
  }
  for (const topology::Hca& h : topology.hcas()) {
    if (h.IsVirtualFunction()) pfs_first.push_back(&h);
  }
  for (const topology::Hca* hca : pfs_first) {
    const topology::Hca& h = *hca;
    FixtureHca f;
    f.name = h.name;
    f.pci = h.place.pci;
    f.numa = h.place.numa.value_or(-1);
    f.pcie_root = LaidOutRoot(h.place);
    for (const topology::Bridge& b : h.place.bridges) f.bridges.push_back(b.pci);
    f.netdevs = h.netdevs;
    const auto known = [](std::string& field, const std::string& value) {
      if (!value.empty()) field = value;
    };
    known(f.vendor, h.vendor);
    known(f.device, h.device);
    known(f.driver, h.driver);
    known(f.firmware_version, h.firmware_version);
    known(f.node_guid, h.node_guid);
    f.physfn = h.physfn;
    f.ports.clear();
    for (const topology::Port& p : h.ports) {
      FixturePort fp;
      fp.number = p.number;
      fp.state = p.state.empty() ? "ACTIVE" : p.state;
      fp.phys_state = fp.state == "ACTIVE" ? "LinkUp" : "Polling";
      // A netdev named like an Ethernet interface means RoCE.
      bool ethernet = !h.netdevs.empty() && h.netdevs.front().rfind("ib", 0) != 0;
      fp.link_layer = !p.link_layer.empty() ? p.link_layer : (ethernet ? "Ethernet" : "InfiniBand");
      fp.rate = p.rate.empty() ? "400 Gb/sec (4X NDR)" : p.rate;
      f.ports.push_back(fp);
    }
    if (f.ports.empty()) f.ports.push_back(FixturePort{});
    f.umad = f.ports.front().link_layer == "InfiniBand";
    RDP_RETURN_IF_ERROR(AddHca(f));
  }
  return AddRdmaCm();
}

}  // namespace rdp::sim
