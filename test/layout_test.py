#!/usr/bin/env python3
"""The module graph, checked: which of our directories each module's sources may include.

One foundation, three front doors (docs/development.md, Layout): base -> topology -> allocator;
resources/ (the names HCAs are sold under and their selectors) on topology/; the foundation
the doors stand on, hca/ (the node's HCAs and what makes one usable) -> metrics/, and serving/;
kube/ (the Kubernetes API client) on base/ alone; the doors, deviceplugin/, dra/ (which uses
kube/) and nri/ (the NRI plugin), which never include each other; check/; cmd/ wires them into the
product binary. sim/ (test doubles and the development tools' binary with its own main: the demo,
node fixtures) and test/ are not product: no product library nor cmd/ includes them. In
the product, hwloc.h is included by topology/internal/ only (bench/ loads hwloc itself for its
floor), topology/internal/ by topology/ (and tests), resources/internal/ (the config file's
parser) by resources/ (and tests). curl is included by kube/ only (and its
tests, test/kube/), in every directory of ours, tests and benchmarks included.
Exit 0 when every include keeps to this, 1 with one line per include that does not.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OURS = {"base", "topology", "resources", "allocator", "proto", "hca", "serving", "metrics", "node", "kube",
        "deviceplugin", "dra", "nri", "check", "cmd", "sim", "bench", "test"}
FOUNDATION = {"base", "topology", "resources", "hca", "serving", "metrics", "node"}
ALLOWED = {
    "base": {"base"},
    "topology": {"base", "topology"},
    "resources": {"base", "topology", "resources"},
    "allocator": {"base", "topology", "allocator"},
    "hca": {"base", "topology", "hca"},
    "serving": {"base", "serving"},
    "metrics": {"base", "topology", "hca", "metrics"},
    "node": {"base", "topology", "hca", "serving", "metrics", "node"},
    "kube": {"base", "kube"},
    "deviceplugin": FOUNDATION | {"allocator", "proto", "deviceplugin"},
    "dra": FOUNDATION | {"proto", "kube", "dra"},
    "nri": FOUNDATION | {"proto", "nri"},
    "check": {"base", "topology", "check"},
    "sim": FOUNDATION | {"allocator", "proto", "deviceplugin", "kube", "sim"},
    "cmd": OURS - {"bench", "test", "sim"},
    "bench": OURS - {"cmd"},
}
# The front doors never include each other.
DOORS = {"deviceplugin", "dra", "nri"}
for door in DOORS:
    assert not (ALLOWED[door] & DOORS) - {door}, door
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
# The only places that include curl: the client's transport and its tests.
CURL_ALLOWED = ("kube/", "test/kube/")


def main():
    bad = []
    checked = 0
    for module, allowed in ALLOWED.items():
        for src in sorted((ROOT / module).rglob("*")):
            if src.suffix not in {".h", ".cc", ".in"}:
                continue
            checked += 1
            rel = src.relative_to(ROOT).as_posix()
            for inc in INCLUDE.findall(src.read_text(errors="replace")):
                top = inc.split("/", 1)[0]
                if top in OURS and top not in allowed:
                    bad.append(f"{rel}: includes {inc} ({module}/ may include {sorted(allowed)})")
                if inc.startswith("topology/internal/") and module != "topology":
                    bad.append(f"{rel}: includes {inc} (internal to topology/)")
                if inc.startswith("resources/internal/") and module != "resources":
                    bad.append(f"{rel}: includes {inc} (internal to resources/)")
                if inc == "hwloc.h" and module != "bench" and not rel.startswith("topology/internal/"):
                    bad.append(f"{rel}: includes hwloc.h (only topology/internal/ does)")
    for top in sorted(OURS):
        for src in sorted((ROOT / top).rglob("*")):
            if src.suffix not in {".h", ".cc", ".in"}:
                continue
            rel = src.relative_to(ROOT).as_posix()
            if rel.startswith(CURL_ALLOWED):
                continue
            for inc in INCLUDE.findall(src.read_text(errors="replace")):
                if inc.startswith("curl/"):
                    bad.append(f"{rel}: includes {inc} (only kube/ does)")
    for line in bad:
        print(line)
    print(f"layout: {checked} sources checked, {len(bad)} includes out of place")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
