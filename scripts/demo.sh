#!/usr/bin/env bash
# The main job on the embedded default: installs what is missing, builds, and runs the plugin's
# demo: the plugin serving the bundled DGX-H100-like node fixture to the built-in kubelet simulator.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DBUILD_TESTING=OFF -DRDP_BUILD_BENCHMARKS=OFF >/dev/null
build=${BUILD_DIR:-build}
exec "$build"/cmd/rdma-device-plugin demo
