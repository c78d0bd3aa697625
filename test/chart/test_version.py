#!/usr/bin/env python3
"""One version source: VERSION.

- VERSION holds one semantic version (MAJOR.MINOR.PATCH).
- The chart's version and appVersion are that version, and the Dockerfile's RDP_VERSION default
  (the image label) too; with --binary, `rdma-device-plugin --version` prints it (CMake reads
  VERSION).
- The chart does not change without a version bump: charts/chart-digests.txt records, per
  version, the sha256 of the chart's files (paths and contents, sorted). The current chart must
  match the digest recorded for the current version. After a bump, record the new version's
  digest with --record (which refuses to change the digest of a version already recorded).
Prints one line per check and "N passed, M failed"; exits 1 on any failure.
"""

import argparse
import hashlib
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import Results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
CHART = os.path.join(REPO, "charts", "rdma-device-plugin")
DIGESTS = os.path.join(REPO, "charts", "chart-digests.txt")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def chart_digest(chart):
    """sha256 over the chart's files: each relative path, NUL, its bytes, NUL; in sorted order."""
    h = hashlib.sha256()
    files = []
    for root, dirs, names in os.walk(chart):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        files += [os.path.join(root, n) for n in names]
    for path in sorted(files, key=lambda p: os.path.relpath(p, chart)):
        h.update(os.path.relpath(path, chart).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read() + b"\0")
    return h.hexdigest()


def recorded(path):
    """{version: digest} from the digests file (lines "VERSION SHA256"; # comments)."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in read(path).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            version, digest = line.split()
            out[version] = digest
    return out


def chart_field(chart_yaml, name):
    m = re.search(rf'^{name}:\s*"?([^"\s]+)"?\s*$', chart_yaml, re.M)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", help="the built rdma-device-plugin, to compare --version")
    ap.add_argument("--record", action="store_true",
                    help="record the current chart's digest for the current version, then check")
    args = ap.parse_args()
    version = read(os.path.join(REPO, "VERSION")).strip()
    digest = chart_digest(CHART)
    if args.record:
        known = recorded(DIGESTS)
        if version in known and known[version] != digest:
            sys.exit(f"version {version} is recorded with another chart digest: bump VERSION first")
        if version not in known:
            with open(DIGESTS, "a", encoding="utf-8") as f:
                f.write(f"{version} {digest}\n")

    r = Results()
    r.check("VERSION is MAJOR.MINOR.PATCH", SEMVER.match(version), repr(version))
    chart_yaml = read(os.path.join(CHART, "Chart.yaml"))
    for field in ("version", "appVersion"):
        got = chart_field(chart_yaml, field)
        r.check(f"Chart.yaml {field} is VERSION", got == version, f"{got} != {version}")
    m = re.search(r"^ARG RDP_VERSION=(\S+)$", read(os.path.join(REPO, "Dockerfile")), re.M)
    r.check("Dockerfile's RDP_VERSION default is VERSION", m and m.group(1) == version,
            f"{m.group(1) if m else 'no ARG RDP_VERSION'} != {version}")
    if args.binary:
        out = subprocess.run([args.binary, "--version"], capture_output=True, text=True).stdout
        r.check("the binary's --version is VERSION", out.strip() == f"rdma-device-plugin {version}",
                out.strip())
    known = recorded(DIGESTS)
    r.check(f"the chart's digest is recorded for {version}", version in known,
            f"{DIGESTS} has no line for {version}: run {sys.argv[0]} --record after the bump")
    r.check("the chart did not change without a version bump",
            known.get(version) in (None, digest),
            f"the chart differs from the one recorded for {version}: bump VERSION (and the "
            f"chart's version and appVersion), then run {sys.argv[0]} --record")
    print(f"{r.passed} passed, {r.failed} failed")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
