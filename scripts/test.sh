#!/usr/bin/env bash
# Every test: installs what is missing (Debian packages, Helm for the chart checks), builds with
# tests, and runs the whole suite with ctest; then the C++ tests again under
# ASan+UBSan (with a deterministic fixed-seed run of every fuzz target) and under TSan
# (docs/reliability.md); between them the arm64 cross build's tests under qemu
# (scripts/test-arm64.sh; RDP_ARM64=0 leaves it out). RDP_SANITIZERS=0 stops after the first
# suite (and the arm64 one).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}

# Where the time goes, printed last (also when a step fails): each phase's seconds, and the
# slowest tests of the first suite (docs/development.md, CI time).
phases=()
mark=$SECONDS
phase() {
  phases+=("$(printf '%-34s %5d s' "$1" $((SECONDS - mark)))")
  mark=$SECONDS
}
summary() {
  local rc=$?
  echo "test.sh: time by phase (exit $rc)"
  ((${#phases[@]})) && printf '  %s\n' "${phases[@]}"
  echo "  total                              $(printf '%5d' "$SECONDS") s"
  local costs=$build/Testing/Temporary/CTestCostData.txt
  if [[ -f $costs ]]; then
    echo "test.sh: the first suite's slowest tests (s)"
    # sort's SIGPIPE when head has its 12 must not become the script's status.
    awk 'NF == 3 { printf "  %8.1f  %s\n", $3, $1 }' "$costs" | sort -rn | head -12 || true
  fi
  exit "$rc"
}
trap summary EXIT
# build.sh installs the Debian packages first (scripts/install-deps.sh, npm among them). The
# benchmarks a test runs only (bench_load's smoke run); `scripts/build.sh
# -DRDP_BUILD_BENCHMARKS=ON` builds them all.
scripts/build.sh -DBUILD_TESTING=ON -DRDP_BUILD_BENCHMARKS=OFF
scripts/get-helm.sh "$PWD/$build/tools/bin"
phase "install and build"
export PATH="$PWD/$build/tools/bin:$PATH"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --timeout 300
phase "first suite (ctest)"

# linux/arm64: the cross build and its tests under qemu (scripts/test-arm64.sh, docs/install.md).
# RDP_ARM64=0 leaves it out; exit 77 (no qemu-aarch64-static) is a skip.
if [[ ${RDP_ARM64:-1} != 0 ]]; then
  rc=0
  RDP_NATIVE_BUILD=$build scripts/test-arm64.sh || rc=$?
  if ((rc == 77)); then echo "test.sh: arm64 tests skipped"; elif ((rc != 0)); then exit "$rc"; fi
  phase "arm64 (cross build, qemu tests)"
fi

if [[ ${RDP_SANITIZERS:-1} != 0 ]]; then
  for kind in address thread; do
    scripts/sanitize.sh "$kind" --build-only
    phase "$kind sanitizer build"
    scripts/sanitize.sh "$kind"
    phase "$kind sanitizer tests"
  done
fi
