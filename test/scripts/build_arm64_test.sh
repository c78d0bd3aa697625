#!/usr/bin/env bash
# `scripts/build.sh --arch arm64`, as docs/install.md gives it to build a node's binary by hand,
# configures with what is installed: tests and benchmarks off unless asked for (no :arm64
# benchmark library is installed), and only the packages building needs
# (`scripts/install-deps.sh --build --arch arm64`). Builds one target that compiles nothing
# (rdp_proto_descriptors) in a scratch directory.
# Exit 0 pass, 1 fail, 77 (skipped) without the cross compiler.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fail() { echo "build_arm64_test: FAILED: $*" >&2; exit 1; }
command -v aarch64-linux-gnu-g++ >/dev/null ||
  { echo "build_arm64_test: SKIPPED: no aarch64-linux-gnu-g++ (scripts/install-deps.sh)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

out=$(BUILD_DIR=$work/arm64 RDP_BUILD_TARGETS=rdp_proto_descriptors "$repo/scripts/build.sh" \
        --arch arm64 2>&1) || { echo "$out" | tail -20 >&2; fail "scripts/build.sh --arch arm64 failed"; }
cache=$work/arm64/CMakeCache.txt
grep -qx 'BUILD_TESTING:BOOL=OFF' "$cache" || fail "BUILD_TESTING is not OFF: $(grep '^BUILD_TESTING' "$cache")"
grep -qx 'RDP_BUILD_BENCHMARKS:BOOL=OFF' "$cache" ||
  fail "RDP_BUILD_BENCHMARKS is not OFF: $(grep '^RDP_BUILD_BENCHMARKS' "$cache")"
grep -hq 'set(CMAKE_CXX_COMPILER ".*aarch64-linux-gnu-g++")' "$work"/arm64/CMakeFiles/*/CMakeCXXCompiler.cmake ||
  fail "not configured with the cross compiler"
[[ -s $work/arm64/proto/rdp_proto.binpb ]] || fail "rdp_proto_descriptors was not built"
# The package set building needs, the line install-deps prints for it.
want=$("$repo/scripts/install-deps.sh" --build --arch arm64 | head -1)
[[ $out == *"$want"* ]] || fail "build.sh did not install the build set ('$want'): $(grep install-deps <<<"$out")"

# An argument turns the tests on again; the whole set is then what build.sh installs.
out=$(BUILD_DIR=$work/arm64 RDP_BUILD_TARGETS=rdp_proto_descriptors "$repo/scripts/build.sh" \
        --arch arm64 -DBUILD_TESTING=ON 2>&1) || { echo "$out" | tail -20 >&2; fail "with -DBUILD_TESTING=ON"; }
grep -qx 'BUILD_TESTING:BOOL=ON' "$cache" || fail "-DBUILD_TESTING=ON was not kept"
want=$("$repo/scripts/install-deps.sh" | head -1)
[[ $out == *"$want"* ]] || fail "build.sh with tests did not install the whole set ('$want')"
echo "build_arm64_test: passed"
