#!/usr/bin/env python3
"""Writes the synthetic GPU + HCA nodes of the allocation-quality replay as hwloc 2 XML.

Usage: test/data/gen_quality_nodes.py [OUT_DIR]   (default: the directory of this script)

The nodes (docs/allocator.md, "Allocation quality"), each an illustrative machine, not a dump:
- two-level-switches.xml: 2 NUMA nodes, 2 host bridges each; behind each host bridge's root
  port a top-level switch over 2 leaf switches of 2 GPUs + 1 HCA (16 GPUs, 8 HCAs). An HCA is
  PIX to the 2 GPUs of its leaf switch and PXB to the 2 of the other leaf.
- four-numa.xml: 4 NUMA nodes, one host bridge each with 2 root ports, each root port holding a
  switch of 2 GPUs + 1 HCA (16 GPUs, 8 HCAs). Across root ports of one host bridge is PHB.
- fewer-hcas-than-gpus.xml: 2 NUMA nodes, one host bridge each with 3 root ports: a switch of
  2 GPUs + 1 HCA, a switch of 2 GPUs, and an HCA alone (8 GPUs, 4 HCAs). Half the GPUs have no
  HCA at PIX/PXB.

Every PCIe link is point to point, as in real hardware: a root port or a switch's downstream
port holds exactly one device or switch. Bus numbers are given depth first from each host
bridge's bus, so every bridge's [secondary-subordinate] range covers what is below it. HCAs are
named mlx5_<n> in PCI address order, with one ACTIVE InfiniBand port and an ib netdev.
"""
import os
import sys

LINK = "63.015385"  # PCIe Gen5 x16 in GB/s, as hwloc reports it
CORES_PER_NUMA = 2


def gpu():
    return ("gpu",)


def hca():
    return ("hca",)


def switch(*children):
    return ("switch", children)


# Each node: a list of host bridges as (NUMA node, [what each root port holds]).
NODES = {
    "two-level-switches": {
        "product": "SYNTHETIC-TWO-LEVEL-SWITCHES",
        "bridges": [(numa, [switch(switch(gpu(), gpu(), hca()), switch(gpu(), gpu(), hca()))])
                    for numa in (0, 0, 1, 1)],
    },
    "four-numa": {
        "product": "SYNTHETIC-FOUR-NUMA",
        "bridges": [(numa, [switch(gpu(), gpu(), hca()), switch(gpu(), gpu(), hca())])
                    for numa in range(4)],
    },
    "fewer-hcas-than-gpus": {
        "product": "SYNTHETIC-FEWER-HCAS-THAN-GPUS",
        "bridges": [(numa, [switch(gpu(), gpu(), hca()), switch(gpu(), gpu()), hca()])
                    for numa in range(2)],
    },
}


class Writer:
    def __init__(self):
        self.lines = []
        self.gp_index = 0
        self.hcas = 0

    def next_index(self):
        self.gp_index += 1
        return self.gp_index

    def line(self, depth, text):
        self.lines.append("  " * depth + text)

    def begin(self):
        """The XML declaration and the opening <topology>."""
        self.line(0, '<?xml version="1.0" encoding="UTF-8"?>')
        self.line(0, '<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
        self.line(0, '<topology version="2.0">')

    def end(self):
        """Closes the Machine and the topology; the document."""
        self.line(1, "</object>")
        self.line(0, "</topology>")
        return "\n".join(self.lines) + "\n"

    def subtree_buses(self, item):
        """Buses a device or switch needs below the port that holds it (its own bus included)."""
        if item[0] != "switch":
            return 1
        # The upstream port's bus, the bus of its downstream ports, then each port's subtree.
        return 2 + sum(self.subtree_buses(c) for c in item[1])

    def bridge(self, depth, busid, secondary, subordinate, pci_type, vendor, device, level):
        self.line(depth, f'<object type="Bridge" gp_index="{self.next_index()}" bridge_type="1-1" '
                         f'depth="{level}" bridge_pci="0000:[{secondary:02x}-{subordinate:02x}]" '
                         f'pci_busid="{busid}" pci_type="{pci_type}" pci_link_speed="{LINK}">')
        self.line(depth + 1, f'<info name="PCIVendor" value="{vendor}"/>')
        self.line(depth + 1, f'<info name="PCIDevice" value="{device}"/>')

    def item(self, depth, item, bus, level):
        """Writes what sits on `bus` (device 00.0), below a port at bridge depth `level` - 1."""
        busid = f"0000:{bus:02x}:00.0"
        if item[0] == "gpu":
            self.pcidev(depth, busid, "0302 [10de:2330] [10de:16c1] a1", "NVIDIA Corporation",
                        "GH100 [H100 SXM5 80GB]")
            self.line(depth, "</object>")
        elif item[0] == "hca":
            n = self.hcas
            self.hcas += 1
            self.pcidev(depth, busid, "0207 [15b3:1021] [15b3:0041] 00", "Mellanox Technologies",
                        "MT2910 Family [ConnectX-7]")
            hca_osdevs(self, depth + 1, f"ibp{bus}s0", n, f"a088:c203:{0x1000 + bus:04x}:{n:04x}")
            self.line(depth, "</object>")
        else:
            # A switch: upstream port on `bus`, downstream ports on the next bus, one per child.
            ports_bus = bus + 1
            last = bus + self.subtree_buses(item) - 1
            self.bridge(depth, busid, ports_bus, last, "0604 [1000:c030] [1000:a064] b0",
                        "Broadcom / LSI", "PEX890xx PCIe Gen 5 Switch (illustrative)", level)
            child_bus = ports_bus + 1
            for port, child in enumerate(item[1]):
                size = self.subtree_buses(child)
                self.bridge(depth + 1, f"0000:{ports_bus:02x}:{port:02x}.0", child_bus,
                            child_bus + size - 1, "0604 [1000:c030] [1000:a064] b0",
                            "Broadcom / LSI", "PEX890xx PCIe Gen 5 Switch (illustrative)",
                            level + 1)
                self.item(depth + 2, child, child_bus, level + 2)
                self.line(depth + 1, "</object>")
                child_bus += size
            self.line(depth, "</object>")

    def pcidev(self, depth, busid, pci_type, vendor, device):
        self.line(depth, f'<object type="PCIDev" gp_index="{self.next_index()}" pci_busid="{busid}" '
                         f'pci_type="{pci_type}" pci_link_speed="{LINK}">')
        self.line(depth + 1, f'<info name="PCIVendor" value="{vendor}"/>')
        self.line(depth + 1, f'<info name="PCIDevice" value="{device}"/>')

    def host_bridge(self, depth, bus, ports):
        """A host bridge whose root bus is `bus`, with one root port per entry of `ports`."""
        total = 1 + sum(self.subtree_buses(p) for p in ports)
        self.line(depth, f'<object type="Bridge" gp_index="{self.next_index()}" bridge_type="0-1" '
                         f'depth="0" bridge_pci="0000:[{bus:02x}-{bus + total - 1:02x}]">')
        child_bus = bus + 1
        for i, p in enumerate(ports):
            size = self.subtree_buses(p)
            self.bridge(depth + 1, f"0000:{bus:02x}:{i + 1:02x}.0", child_bus, child_bus + size - 1,
                        "0604 [8086:352a] [0000:0000] 04", "Intel Corporation",
                        "Root Port (illustrative)", 1)
            self.item(depth + 2, p, child_bus, 2)
            self.line(depth + 1, "</object>")
            child_bus += size
        self.line(depth, "</object>")
        return total


def hca_osdevs(w, depth, netdev, n, guid):
    """The OS devices of the n-th HCA (an InfiniBand port up): its netdev and its OpenFabrics
    device mlx5_<n>, whose port 1 is ACTIVE. w: a writer with line() and next_index()."""
    gid_bytes = guid.replace(":", "")
    address = "00:00:10:29:fe:80:00:00:00:00:00:00:" + ":".join(
        gid_bytes[i:i + 2] for i in range(0, 16, 2))
    w.line(depth, f'<object type="OSDev" gp_index="{w.next_index()}" name="{netdev}" osdev_type="2">')
    w.line(depth + 1, f'<info name="Address" value="{address}"/>')
    w.line(depth + 1, '<info name="Port" value="1"/>')
    w.line(depth, "</object>")
    w.line(depth, f'<object type="OSDev" gp_index="{w.next_index()}" name="mlx5_{n}" osdev_type="3">')
    w.line(depth + 1, f'<info name="NodeGUID" value="{guid}"/>')
    w.line(depth + 1, f'<info name="SysImageGUID" value="{guid}"/>')
    w.line(depth + 1, '<info name="Port1State" value="4"/>')
    w.line(depth + 1, f'<info name="Port1LID" value="0x{n + 1:x}"/>')
    w.line(depth + 1, '<info name="Port1LMC" value="0"/>')
    w.line(depth + 1, f'<info name="Port1GID0" value="fe80:0000:0000:0000:{guid}"/>')
    w.line(depth, "</object>")


def mask(bits):
    """An hwloc bitmap: 32-bit words, most significant first, comma-separated."""
    value = 0
    for b in bits:
        value |= 1 << b
    words = []
    while True:
        words.append(value & 0xffffffff)
        value >>= 32
        if value == 0:
            break
    return ",".join(f"0x{w:08x}" for w in reversed(words))


def node_xml(spec):
    w = Writer()
    numas = sorted({numa for numa, _ in spec["bridges"]})
    cpus = range(len(numas) * CORES_PER_NUMA)
    w.begin()
    all_cpus, all_numa = mask(cpus), mask(numas)
    w.line(1, f'<object type="Machine" os_index="0" cpuset="{all_cpus}" complete_cpuset="{all_cpus}" '
              f'allowed_cpuset="{all_cpus}" nodeset="{all_numa}" complete_nodeset="{all_numa}" '
              f'allowed_nodeset="{all_numa}" gp_index="{w.next_index()}">')
    w.line(2, '<info name="Backend" value="Linux"/>')
    w.line(2, f'<info name="DMIProductName" value="{spec["product"]}"/>')
    bus = 0x10
    for numa in numas:
        node_cpus = range(numa * CORES_PER_NUMA, (numa + 1) * CORES_PER_NUMA)
        cm, nm = mask(node_cpus), mask([numa])
        w.line(2, f'<object type="Package" os_index="{numa}" cpuset="{cm}" complete_cpuset="{cm}" '
                  f'nodeset="{nm}" complete_nodeset="{nm}" gp_index="{w.next_index()}">')
        w.line(3, f'<object type="NUMANode" os_index="{numa}" cpuset="{cm}" complete_cpuset="{cm}" '
                  f'nodeset="{nm}" complete_nodeset="{nm}" gp_index="{w.next_index()}" '
                  f'local_memory="274877906944"/>')
        for c in node_cpus:
            m = mask([c])
            w.line(3, f'<object type="Core" os_index="{c}" cpuset="{m}" complete_cpuset="{m}" '
                      f'nodeset="{nm}" complete_nodeset="{nm}" gp_index="{w.next_index()}">')
            w.line(4, f'<object type="PU" os_index="{c}" cpuset="{m}" complete_cpuset="{m}" '
                      f'nodeset="{nm}" complete_nodeset="{nm}" gp_index="{w.next_index()}"/>')
            w.line(3, "</object>")
        for bridge_numa, ports in spec["bridges"]:
            if bridge_numa != numa:
                continue
            used = w.host_bridge(3, bus, ports)
            bus = (bus + used + 0x0f) // 0x10 * 0x10  # the next host bridge on a round bus
        w.line(2, "</object>")
    return w.end()


def write_nodes(nodes, to_xml):
    """Writes each node's XML (to_xml(spec)) as <name>.xml in argv[1] or this script's folder."""
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, spec in nodes.items():
        path = os.path.join(out_dir, name + ".xml")
        with open(path, "w") as f:
            f.write(to_xml(spec))
        print(path)


if __name__ == "__main__":
    write_nodes(NODES, node_xml)
