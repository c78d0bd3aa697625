#!/usr/bin/env python3
"""Writes the Grace-class and sparse-NUMA nodes as hwloc 2 XML.

Usage: test/data/gen_grace_nodes.py [OUT_DIR]   (default: the directory of this script)

Each an illustrative machine shaped like a real one (the IDs of parts are real, bus numbers,
GUIDs and sizes illustrative), not a dump:
- gb200-tray.xml: a GB200 compute tray. Two Grace sockets, CPU NUMA nodes 0 and 1 (72 cores
  each, no SMT). On each socket two B200 GPUs and two ConnectX-7, every device alone under the
  root port of its own root complex, every root complex its own PCI domain (0000, 0002, 0008,
  0009 on socket 0; 0010, 0012, 0018, 0019 on socket 1): every device is at bus:dev.fn
  01:00.0 of its domain, and there is no PCIe switch. Each GPU's memory is a CPU-less NUMA node
  (2 and 3 on socket 0, 4 and 5 on socket 1), as hwloc shows it on Grace: a NUMANode of subtype
  GPUMemory under the socket's Package, beside the CPU NUMA node, with the GPU's PCIBusID.
- gh200.xml: a GH200 node. One Grace (CPU NUMA node 0), one H100 GPU on domain 0009 whose memory
  is CPU-less NUMA node 1 (GPUMemory, under the Package), and the 8 CPU-less, empty NUMA nodes
  2-9 that the driver reserves for MIG partitions: no CPUs and no locality the kernel knows, so
  hwloc attaches them to the Machine. Two ConnectX-7 on root complexes of their own (0000, 0002).
- power9-numa-0-8.xml: a POWER9 node (AC922-like) whose NUMA IDs are not contiguous: the two
  sockets are chips 0 and 8, NUMA nodes 0 and 8 (SMT4). Per socket one ConnectX-5 and two V100
  GPUs, each on its own root complex (domains 0003-0005 and 0033-0035); the GPUs' memory NUMA
  nodes are hidden, as hwloc does by default on POWER.

The kernel's view of these nodes (what `rdma-device-plugin fixture` lays out for them): numa_node
of every device is its socket's CPU NUMA node; /sys/devices/system/node/node<N>/cpulist is empty
for the CPU-less nodes.
"""
import gen_quality_nodes
from gen_quality_nodes import hca_osdevs, mask, write_nodes  # the same OS devices of an HCA

GEN5_X16 = "63.015385"  # GB/s, as hwloc reports a PCIe link
GEN4_X16 = "31.507692"

GPUS = {
    "b200": ("0302 [10de:2941] [10de:2046] a1", "GB200 [B200 186GB HBM3e] (illustrative)"),
    "h100": ("0302 [10de:2342] [10de:16eb] a1", "GH100 [GH200 96GB HBM3]"),
    "v100": ("0302 [10de:1db1] [10de:1212] a1", "GV100GL [Tesla V100 SXM2 16GB]"),
}
NICS = {
    "cx7": ("0207 [15b3:1021] [15b3:0041] 00", "MT2910 Family [ConnectX-7]"),
    "cx5": ("0207 [15b3:1019] [15b3:0008] 00", "MT28800 Family [ConnectX-5 Ex]"),
}
ROOT_PORTS = {
    "grace": ("0604 [10de:22b2] [0000:0000] 01", "NVIDIA Corporation", "Grace PCIe Root Port (illustrative)"),
    "power9": ("0604 [1014:04c1] [0000:0000] 00", "IBM", "POWER9 PCIe Host Bridge (PHB4) (illustrative)"),
}
GIB = 1 << 30


def gpu(kind, domain, memory_node=None, memory_gib=0):
    return {"what": "gpu", "kind": kind, "domain": domain, "memory_node": memory_node,
            "memory_gib": memory_gib}


def nic(kind, domain):
    return {"what": "nic", "kind": kind, "domain": domain}


NODES = {
    "gb200-tray": {
        "product": "SYNTHETIC-GB200-COMPUTE-TRAY", "arch": "aarch64", "root_port": "grace",
        "link": GEN5_X16, "cores": 72, "smt": 1, "cpu_gib": 480,
        "sockets": [
            (0, 0, [nic("cx7", 0x0000), nic("cx7", 0x0002), gpu("b200", 0x0008, 2, 186),
                    gpu("b200", 0x0009, 3, 186)]),
            (1, 1, [nic("cx7", 0x0010), nic("cx7", 0x0012), gpu("b200", 0x0018, 4, 186),
                    gpu("b200", 0x0019, 5, 186)]),
        ],
        "machine_nodes": [],
    },
    "gh200": {
        "product": "SYNTHETIC-GH200", "arch": "aarch64", "root_port": "grace", "link": GEN5_X16,
        "cores": 72, "smt": 1, "cpu_gib": 480,
        "sockets": [
            (0, 0, [nic("cx7", 0x0000), nic("cx7", 0x0002), gpu("h100", 0x0009, 1, 96)]),
        ],
        "machine_nodes": list(range(2, 10)),
    },
    "power9-numa-0-8": {
        "product": "SYNTHETIC-POWER9-AC922-LIKE", "arch": "ppc64le", "root_port": "power9",
        "link": GEN4_X16, "cores": 16, "smt": 4, "cpu_gib": 256,
        "sockets": [
            (0, 0, [nic("cx5", 0x0003), gpu("v100", 0x0004), gpu("v100", 0x0005)]),
            (8, 8, [nic("cx5", 0x0033), gpu("v100", 0x0034), gpu("v100", 0x0035)]),
        ],
        "machine_nodes": [],
    },
}


def netdev(domain, bus):
    """The kernel's predictable name of an InfiniBand port: P<domain> only outside domain 0."""
    return f"ib{f'P{domain}' if domain else ''}p{bus}s0"


class Writer(gen_quality_nodes.Writer):
    def __init__(self, spec):
        super().__init__()
        self.spec = spec

    def sets(self, cpus, nodes):
        c, n = mask(cpus), mask(nodes)
        return f'cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}"'

    def numa_node(self, depth, os_index, cpus, memory, gpu_pci=None):
        subtype = ' subtype="GPUMemory"' if gpu_pci else ""
        text = (f'<object type="NUMANode" os_index="{os_index}" {self.sets(cpus, [os_index])} '
                f'gp_index="{self.next_index()}"{subtype} local_memory="{memory}"')
        if gpu_pci is None:
            self.line(depth, text + "/>")
            return
        self.line(depth, text + ">")
        self.line(depth + 1, f'<info name="PCIBusID" value="{gpu_pci}"/>')
        self.line(depth, "</object>")

    def pcidev(self, depth, busid, pci_type, vendor, device):
        self.line(depth, f'<object type="PCIDev" gp_index="{self.next_index()}" pci_busid="{busid}" '
                         f'pci_type="{pci_type}" pci_link_speed="{self.spec["link"]}">')
        self.line(depth + 1, f'<info name="PCIVendor" value="{vendor}"/>')
        self.line(depth + 1, f'<info name="PCIDevice" value="{device}"/>')

    def hca(self, depth, domain, busid, kind):
        n = self.hcas
        self.hcas += 1
        pci_type, device = NICS[kind]
        self.pcidev(depth, busid, pci_type, "Mellanox Technologies", device)
        hca_osdevs(self, depth + 1, netdev(domain, 1), n, f"b83f:d203:{domain:04x}:{n:04x}")
        self.line(depth, "</object>")

    def root_complex(self, depth, device):
        """A host bridge of its own domain, bus 00, with one root port 00:00.0 over bus 01, where
        the device sits alone at 01:00.0."""
        domain = device["domain"]
        self.line(depth, f'<object type="Bridge" gp_index="{self.next_index()}" bridge_type="0-1" '
                         f'depth="0" bridge_pci="{domain:04x}:[00-01]">')
        pci_type, vendor, name = ROOT_PORTS[self.spec["root_port"]]
        self.line(depth + 1, f'<object type="Bridge" gp_index="{self.next_index()}" bridge_type="1-1" '
                             f'depth="1" bridge_pci="{domain:04x}:[01-01]" '
                             f'pci_busid="{domain:04x}:00:00.0" pci_type="{pci_type}" '
                             f'pci_link_speed="{self.spec["link"]}">')
        self.line(depth + 2, f'<info name="PCIVendor" value="{vendor}"/>')
        self.line(depth + 2, f'<info name="PCIDevice" value="{name}"/>')
        busid = f"{domain:04x}:01:00.0"
        if device["what"] == "gpu":
            pci_type, model = GPUS[device["kind"]]
            self.pcidev(depth + 2, busid, pci_type, "NVIDIA Corporation", model)
            self.line(depth + 2, "</object>")
        else:
            self.hca(depth + 2, domain, busid, device["kind"])
        self.line(depth + 1, "</object>")
        self.line(depth, "</object>")


def node_xml(spec):
    w = Writer(spec)
    per_socket = spec["cores"] * spec["smt"]
    sockets = spec["sockets"]
    all_cpus = range(len(sockets) * per_socket)
    socket_nodes = []
    for _, numa, devices in sockets:
        socket_nodes.append([numa] + [d["memory_node"] for d in devices
                                      if d["what"] == "gpu" and d["memory_node"] is not None])
    all_nodes = sorted(n for nodes in socket_nodes for n in nodes) + spec["machine_nodes"]
    w.begin()
    c, n = mask(all_cpus), mask(all_nodes)
    w.line(1, f'<object type="Machine" os_index="0" cpuset="{c}" complete_cpuset="{c}" '
              f'allowed_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}" allowed_nodeset="{n}" '
              f'gp_index="{w.next_index()}">')
    w.line(2, '<info name="Backend" value="Linux"/>')
    w.line(2, '<info name="OSName" value="Linux"/>')
    w.line(2, f'<info name="Architecture" value="{spec["arch"]}"/>')
    w.line(2, f'<info name="DMIProductName" value="{spec["product"]}"/>')
    # Memory children first, as hwloc exports them: the nodes no CPU is local to.
    for node in spec["machine_nodes"]:
        w.numa_node(2, node, all_cpus, 0)
    for s, (package, numa, devices) in enumerate(sockets):
        cpus = range(s * per_socket, (s + 1) * per_socket)
        # As hwloc propagates nodesets: what is attached here, above (the Machine's) and below.
        local = sorted(socket_nodes[s] + spec["machine_nodes"])
        w.line(2, f'<object type="Package" os_index="{package}" {w.sets(cpus, local)} '
                  f'gp_index="{w.next_index()}">')
        w.numa_node(3, numa, cpus, spec["cpu_gib"] * GIB)
        for d in devices:
            if d["what"] == "gpu" and d["memory_node"] is not None:
                w.numa_node(3, d["memory_node"], cpus, d["memory_gib"] * GIB,
                            f'{d["domain"]:04x}:01:00.0')
        for core in range(spec["cores"]):
            first = s * per_socket + core * spec["smt"]
            threads = range(first, first + spec["smt"])
            w.line(3, f'<object type="Core" os_index="{core}" {w.sets(threads, local)} '
                      f'gp_index="{w.next_index()}">')
            for pu in threads:
                w.line(4, f'<object type="PU" os_index="{pu}" {w.sets([pu], local)} '
                          f'gp_index="{w.next_index()}"/>')
            w.line(3, "</object>")
        for d in devices:
            w.root_complex(3, d)
        w.line(2, "</object>")
    return w.end()


if __name__ == "__main__":
    write_nodes(NODES, node_xml)
