#!/usr/bin/env bash
# Installs the Debian 12 packages the project builds and tests with, and only those missing;
# with --build, only those it builds with (the image's build stage).
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
  # the DRA driver's API-server client (HTTPS, token auth)
  libcurl4-openssl-dev
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
  # promtool checks the /metrics exposition; a real Prometheus scrapes the plugin
  # (test/metrics/prometheus_test.py)
  prometheus
)

build_only=0
case "${1:-}" in
  --build) build_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--build]   (--build: only what building the binary needs)" >&2; exit 2 ;;
esac
packages=("${build_packages[@]}")
if ((build_only == 0)); then packages+=("${test_packages[@]}"); fi

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
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
