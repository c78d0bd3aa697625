#!/usr/bin/env python3
"""helm --post-renderer for the real node (scripts/real-node.sh): the chart's DaemonSets as this
node needs them, nothing else changed.

- hostNetwork: true (and dnsPolicy ClusterFirstWithHostNet): the node has no pod network, only a
  loopback CNI configuration so that the runtime reports NetworkReady.
- The node's hwloc export ($RDP_NODE_XML) mounted read-only at /etc/rdp/node.xml, the path the
  chart's extraArgs example names (--topology-xml=/etc/rdp/node.xml): the PCIe tree and the GPUs
  the plugin aligns HCAs with.
Reads the rendered manifests on stdin, writes them on stdout."""
import os
import sys

import yaml

CONTAINER = "rdma-device-plugin"


def render(doc, node_xml):
    if not doc or doc.get("kind") != "DaemonSet":
        return doc
    spec = doc["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    spec.setdefault("volumes", []).append(
        {"name": "node-xml", "hostPath": {"path": node_xml, "type": "File"}})
    for c in spec["containers"]:
        if c["name"] == CONTAINER:
            c.setdefault("volumeMounts", []).append(
                {"name": "node-xml", "mountPath": "/etc/rdp/node.xml", "readOnly": True})
    return doc


def main():
    node_xml = os.environ.get("RDP_NODE_XML")
    if not node_xml:
        sys.exit("post-render.py: RDP_NODE_XML is not set")
    docs = [render(d, node_xml) for d in yaml.safe_load_all(sys.stdin)]
    yaml.safe_dump_all([d for d in docs if d], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
