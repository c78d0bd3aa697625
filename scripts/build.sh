#!/usr/bin/env bash
# Configures and builds the project into ${BUILD_DIR:-build}. Extra arguments go to cmake's
# configure step (e.g. -DRDP_SANITIZE=address); RDP_BUILD_TARGETS (space-separated) builds only
# those targets.
#   --arch arm64: cross-build for linux/arm64 into ${BUILD_DIR:-build-arm64}
#   (cmake/arm64-toolchain.cmake; needs `scripts/install-deps.sh --arch arm64`): the binary is
#   build-arm64/cmd/rdma-device-plugin, an aarch64 ELF; its tests run under qemu-aarch64-static.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=
if [[ ${1:-} == --arch ]]; then
  arch=${2:-}
  shift 2 || true
  case $arch in
    arm64) ;;
    amd64) arch= ;;
    *) echo "build.sh: --arch must be arm64 or amd64, not '$arch'" >&2; exit 2 ;;
  esac
fi
if [[ $arch == arm64 ]]; then
  build=${BUILD_DIR:-build-arm64}
  set -- -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/arm64-toolchain.cmake" "$@"
else
  build=${BUILD_DIR:-build}
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} -DRDP_SKIP_MODULES= "$@"
read -r -a targets <<<"${RDP_BUILD_TARGETS:-}"
cmake --build "$build" -j"$(nproc)" ${targets[@]+--target "${targets[@]}"}
