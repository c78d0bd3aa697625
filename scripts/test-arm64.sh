#!/usr/bin/env bash
# The linux/arm64 build, tested on this (amd64) machine: cross-builds the binary and the tests
# labelled arm64 into ${BUILD_DIR:-build-arm64} (scripts/build.sh --arch arm64), checks the binary
# is an aarch64 ELF, runs it under qemu-aarch64-static against the amd64 build's answers on the
# Grace fixtures, then runs the arm64 tests under qemu with ctest (-L arm64).
#
# Which tests, and why not all: the topology tests (sysfs reader, hwloc XML loading with its probe
# child, the Grace nodes) and the allocator's (its property tests against brute force): the code
# whose results could differ on aarch64 (bit packing, hwloc's and abseil's arm64 builds), 355
# tests. The rest (device plugin, DRA, cmd, check, the demo) run the same C++ through the same
# libraries, but build about 5 times as many objects and serve gRPC against the kubelet's short
# admission deadlines: under emulation, 10-20 times slower, a pod-resources List misses its
# deadline (the demo's scrape test failed so on a loaded machine), which would make CI flaky,
# and building them would take several times CI's 6-minute allowance for arm64. The binary itself
# is checked end to end here (--version, topology --json) and in the arm64 image.
#
# What it adds to CI, warm (a fresh clone of main after a first run, as CI runs: ccache warm),
# on the 2 shared cores at load average 14 to 17: 209 s, of which the cross build 81 s (configure,
# the protoc steps, 95 compiles from ccache, 20 links, gtest discovery under qemu) and ctest
# 120 s (355 tests), against a budget of 6 minutes. A source change that many files include is
# compiled again for arm64 too (1025 s of cross build once, loaded, with sources changed that
# the binary's modules include): that cost is the change's, not the warm run's.
#
# Child processes that are aarch64 programs (hwloc's XML probe runs the test binary again) need
# the kernel to hand them to qemu: the tests run in a user namespace of their own with a
# binfmt_misc instance of its own (Linux >= 6.7) in which qemu-aarch64-static is registered; the
# machine's binfmt_misc is never touched. Where that namespace cannot be made, the tests run
# through qemu alone, without the two probe tests (their child cannot start).
#
# Exit 0 passed, 1 failed, 77 skipped (no qemu-aarch64-static after scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-arm64}
native=${RDP_NATIVE_BUILD:-build}
# shellcheck source=scripts/lib/log.sh
source scripts/lib/log.sh test-arm64
# build.sh installs the cross compiler, the :arm64 libraries and qemu when missing
# (scripts/install-deps.sh).
targets="rdma-device-plugin topology_test discovery_test grace_test sysfs_test report_test allocator_test"
BUILD_DIR=$build RDP_BUILD_TARGETS=$targets scripts/build.sh --arch arm64 \
  -DBUILD_TESTING=ON -DRDP_BUILD_BENCHMARKS=OFF
phase "cross build"
qemu=$(command -v qemu-aarch64-static) || skip "no qemu-aarch64-static after scripts/install-deps.sh"

bin=$build/cmd/rdma-device-plugin
machine=$(readelf -h "$bin" | awk -F: '/Machine:/ {gsub(/^ +/, "", $2); print $2}')
[[ $machine == AArch64 ]] || fail "$bin is a '$machine' ELF, not AArch64"
version=$("$qemu" "$bin" --version)
[[ $version == "rdma-device-plugin $(cat VERSION)" ]] || fail "--version said '$version'"
say "$bin: $machine ELF, '$version' under qemu"

# The arm64 binary's answers equal the amd64 build's, from the XML and from a fixture sysfs.
if [[ -x $native/cmd/rdma-device-plugin ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  for node in gb200-tray gh200 power9-numa-0-8 dgx-h100-like; do
    xml=test/data/$node.xml
    "$native/cmd/rdma-device-plugin" fixture --topology-xml "$xml" --out "$work/$node" --log-level warn
    for args in "--topology-xml $xml" "--topology-xml $xml --sysfs-root $work/$node --dev-root $work/$node"; do
      # shellcheck disable=SC2086
      want=$("$native/cmd/rdma-device-plugin" topology --json $args --log-level off)
      # shellcheck disable=SC2086
      got=$("$qemu" "$bin" topology --json $args --log-level off)
      [[ $got == "$want" ]] || { diff <(echo "$want") <(echo "$got") | head; fail "$node ($args): arm64 differs"; }
    done
  done
  say "topology --json under qemu == amd64's on 4 nodes, from the XML and from sysfs"
fi
phase "the binary under qemu"

# ctest in a user namespace with its own binfmt_misc: qemu for aarch64 ELF files (flag F: the
# interpreter is opened now, so it is found from any mount namespace below).
register=':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:'"$qemu"':F'
ctest_args=(--test-dir "$build" -L arm64 --output-on-failure -j"$(nproc)" --timeout 300)
if unshare --user --map-root-user --mount sh -c \
     'mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc && printf "%b" "$1" >/proc/sys/fs/binfmt_misc/register' \
     sh "$register" 2>/dev/null; then
  say "ctest -L arm64 under qemu (binfmt_misc of a user namespace of its own)"
  unshare --user --map-root-user --mount sh -c \
    'mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc && printf "%b" "$1" >/proc/sys/fs/binfmt_misc/register && shift && exec ctest "$@"' \
    sh "$register" "${ctest_args[@]}"
else
  say "ctest -L arm64 under qemu, without the hwloc probe tests (no binfmt_misc of our own here)"
  ctest "${ctest_args[@]}" -E 'DiscoveryErrorTest\.(XmlThatCrashesHwlocIsAnError|XmlRewrittenInPlaceIsProbedAgain)'
fi
phase "ctest -L arm64 under qemu"
say "passed in $(elapsed) s"
