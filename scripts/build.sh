#!/usr/bin/env bash
# Installs the Debian packages it needs (scripts/install-deps.sh: only those missing), then
# configures and builds the project into ${BUILD_DIR:-build}. Extra arguments go to cmake's
# configure step (e.g. -DRDP_SANITIZE=address); RDP_BUILD_TARGETS (space-separated) builds only
# those targets.
#   --arch arm64: cross-build for linux/arm64 into ${BUILD_DIR:-build-arm64}
#   (cmake/arm64-toolchain.cmake): the binary is build-arm64/cmd/rdma-device-plugin, an aarch64
#   ELF. Tests and benchmarks are off unless an argument turns them on: the cross build is for
#   the binary of a node; scripts/test-arm64.sh builds the arm64 tests and runs them under
#   qemu-aarch64-static, and no :arm64 benchmark library is installed.
# Packages: what building the binary needs (install-deps.sh --build [--arch arm64]) when the
# build has neither tests nor benchmarks and uses gcc; otherwise the whole set the project is
# built and tested with.
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
  set -- -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/arm64-toolchain.cmake" \
    -DBUILD_TESTING=OFF -DRDP_BUILD_BENCHMARKS=OFF "$@"
else
  build=${BUILD_DIR:-build}
fi

# The value the configure step gives cache variable $1: the last -D$1=... of the arguments,
# else $2.
configured() {
  local name=$1 value=$2 a
  shift 2
  for a in "$@"; do
    [[ $a =~ ^-D$name(:[A-Za-z]+)?=(.*)$ ]] && value=${BASH_REMATCH[2]}
  done
  echo "$value"
}
is_off() { [[ ${1^^} =~ ^(OFF|0|FALSE|NO|N|IGNORE|NOTFOUND|)$ ]]; }
deps=()
if is_off "$(configured BUILD_TESTING ON "$@")" && is_off "$(configured RDP_BUILD_BENCHMARKS ON "$@")" &&
   [[ -z $(configured RDP_SANITIZE "" "$@") && ${CXX:-g++} != *clang* ]]; then
  deps=(--build)
  [[ $arch == arm64 ]] && deps+=(--arch arm64)
fi
scripts/install-deps.sh ${deps[@]+"${deps[@]}"}

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} -DRDP_SKIP_MODULES= "$@"
read -r -a targets <<<"${RDP_BUILD_TARGETS:-}"
cmake --build "$build" -j"$(nproc)" ${targets[@]+--target "${targets[@]}"}
