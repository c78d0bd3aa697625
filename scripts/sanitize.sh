#!/usr/bin/env bash
# Builds the project under sanitizers and runs the whole test suite there; fails on any report.
#   scripts/sanitize.sh address   clang-14, ASan + UBSan (and libFuzzer instrumentation, so the
#                                 same build gives scripts/fuzz.sh its fuzzers), in build-asan
#   scripts/sanitize.sh thread    clang-14, TSan, in build-tsan
# A second argument --build-only stops after the build. BUILD_DIR overrides the directory.
# The C++ tests run (GoogleTest suites, the fuzz replays and, in the address build, the
# deterministic libFuzzer runs), not the chart/image checks or the Go kubelet harness (labels
# chart and kubelet): those exercise no C++ of ours that the C++ tests do not, and the harness
# asserts kubelet timings that a sanitizer's slowdown makes meaningless. Reports go to
# <build>/sanitizer-logs/ as
# well as failing the process that made them; any file there fails this script, so a report in a
# child process whose exit status a test ignores still counts.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
case "$kind" in
  address)
    build=${BUILD_DIR:-build-asan}
    export CC=clang-14 CXX=clang++-14
    extra=(-DRDP_FUZZ=ON)
    ;;
  thread)
    build=${BUILD_DIR:-build-tsan}
    # clang: it can leave gRPC's headers uninstrumented (test/sanitizers/tsan_ignorelist.txt)
    export CC=clang-14 CXX=clang++-14
    extra=()
    ;;
  *)
    echo "usage: scripts/sanitize.sh address|thread (got '${kind}')" >&2
    exit 2
    ;;
esac
# build.sh installs what is missing (clang-14 among it: scripts/install-deps.sh).
# -O1 -g1: line tables are all a report needs, and the build is about a third faster than -O2 -g.
BUILD_DIR=$build scripts/build.sh -DBUILD_TESTING=ON -DRDP_BUILD_BENCHMARKS=OFF \
  -DRDP_SANITIZE="$kind" "${extra[@]}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
if [[ ${2:-} == --build-only ]]; then exit 0; fi

logs=$(realpath -m "$build")/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
source scripts/sanitizer-env.sh "$logs"

status=0
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --timeout 900 -LE 'chart|kubelet' || status=$?
if compgen -G "$logs/*" >/dev/null; then
  echo "sanitize.sh ($kind): sanitizer reports:" >&2
  for f in "$logs"/*; do
    echo "==== $f" >&2
    cat "$f" >&2
  done
  status=1
fi
if ((status == 0)); then echo "sanitize.sh ($kind): every test passed, no reports"; fi
exit "$status"
