#!/usr/bin/env bash
# Configures and builds the project into ${BUILD_DIR:-build}. Extra arguments go to cmake's
# configure step (e.g. -DRDP_SANITIZE=address).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} -DRDP_SKIP_MODULES= "$@"
cmake --build "$build" -j"$(nproc)"
