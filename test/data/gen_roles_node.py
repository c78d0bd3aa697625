#!/usr/bin/env python3
"""Writes the node with roles as hwloc 2 XML: test/data/dgx-roles.xml.

Usage: test/data/gen_roles_node.py [OUT_DIR]   (default: the directory of this script)

An illustrative DGX-like GPU node whose NICs have roles, not a dump (IDs of parts real, bus
numbers, GUIDs and addresses illustrative):
- compute: four single-port ConnectX-7 (15b3:1021) on the InfiniBand compute fabric, each on a
  PCIe switch with two H100 GPUs (one switch per host bridge, two host bridges per NUMA node);
  netdevs ibp<bus>s0;
- storage: two dual-port ConnectX-7 (15b3:1021) for storage and in-band traffic, Ethernet (RoCE),
  one per NUMA node, each alone on a root port; as ConnectX dual-port cards are, each is two PCI
  functions <bus>:00.0 and <bus>:00.1, each its own RDMA device with one port, netdevs
  ens<slot>f0np0 and ens<slot>f1np1.
RDMA devices are named mlx5_<n> in PCI address order, as the kernel names them at boot.

The SR-IOV VFs of the node (two of the first compute NIC, bound on the host) are not in the XML,
as hwloc exports of real nodes often leave them out: sim/fixture_node.cc lays them out beside
their PF, and discovery places a VF where its PF is.
"""
import gen_quality_nodes
from gen_quality_nodes import gpu, hca, hca_osdevs, node_xml, switch, write_nodes


def storage(slot):
    return ("storage", slot)


NODES = {
    "dgx-roles": {
        "product": "SYNTHETIC-DGX-ROLES",
        "bridges": [(0, [switch(gpu(), gpu(), hca())]), (0, [switch(gpu(), gpu(), hca())]),
                    (0, [storage(3)]),
                    (1, [switch(gpu(), gpu(), hca())]), (1, [switch(gpu(), gpu(), hca())]),
                    (1, [storage(7)])],
    },
}


def roce_osdevs(w, depth, netdev, mac, n, guid):
    """The OS devices of a RoCE function: its netdev and its OpenFabrics device mlx5_<n>, whose
    port 1 is ACTIVE (LID 0: an Ethernet port has none)."""
    w.line(depth, f'<object type="OSDev" gp_index="{w.next_index()}" name="{netdev}" osdev_type="2">')
    w.line(depth + 1, f'<info name="Address" value="{mac}"/>')
    w.line(depth + 1, '<info name="Port" value="1"/>')
    w.line(depth, "</object>")
    w.line(depth, f'<object type="OSDev" gp_index="{w.next_index()}" name="mlx5_{n}" osdev_type="3">')
    w.line(depth + 1, f'<info name="NodeGUID" value="{guid}"/>')
    w.line(depth + 1, f'<info name="SysImageGUID" value="{guid[:-4]}0000"/>')
    w.line(depth + 1, '<info name="Port1State" value="4"/>')
    w.line(depth + 1, '<info name="Port1LID" value="0x0"/>')
    w.line(depth + 1, '<info name="Port1LMC" value="0"/>')
    w.line(depth, "</object>")


class Writer(gen_quality_nodes.Writer):
    def item(self, depth, item, bus, level):
        if item[0] != "storage":
            return super().item(depth, item, bus, level)
        slot = item[1]
        for function in (0, 1):
            n = self.hcas
            self.hcas += 1
            self.pcidev(depth, f"0000:{bus:02x}:00.{function}", "0200 [15b3:1021] [15b3:0041] 00",
                        "Mellanox Technologies", "MT2910 Family [ConnectX-7]")
            roce_osdevs(self, depth + 1, f"ens{slot}f{function}np{function}",
                        f"b8:ce:f6:{bus:02x}:00:{function:02x}", n,
                        f"b8ce:f603:00{bus:02x}:{0x0a00 + function:04x}")
            self.line(depth, "</object>")
        return None


if __name__ == "__main__":
    gen_quality_nodes.Writer = Writer  # node_xml writes with the Writer of its module
    write_nodes(NODES, node_xml)
