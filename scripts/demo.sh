#!/usr/bin/env bash
# The main job on the embedded default: builds (scripts/build.sh installs the Debian packages that
# building needs, when missing) and runs the plugin's demo: the plugin serving the bundled
# DGX-H100-like node fixture to the built-in kubelet simulator.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh -DBUILD_TESTING=OFF -DRDP_BUILD_BENCHMARKS=OFF >/dev/null
build=${BUILD_DIR:-build}
exec "$build"/cmd/rdma-device-plugin demo
