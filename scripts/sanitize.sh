#!/usr/bin/env bash
# Builds the project under sanitizers and runs the whole test suite there; fails on any report.
#   scripts/sanitize.sh address   clang-14, ASan + UBSan (and libFuzzer instrumentation, so the
#                                 same build gives scripts/fuzz.sh its fuzzers), in build-asan
#   scripts/sanitize.sh thread    g++, TSan, in build-tsan
# A second argument --build-only stops after the build. BUILD_DIR overrides the directory.
# Every test of scripts/test.sh runs except `image`, which checks the release binary's shared
# libraries (a sanitizer runtime adds one by design). Reports go to <build>/sanitizer-logs/ as
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
    extra=()
    ;;
  *)
    echo "usage: scripts/sanitize.sh address|thread (got '${kind}')" >&2
    exit 2
    ;;
esac
scripts/install-deps.sh
# -O1 -g1: line tables are all a report needs, and the build is about a third faster than -O2 -g.
BUILD_DIR=$build scripts/build.sh -DBUILD_TESTING=ON -DRDP_BUILD_BENCHMARKS=OFF \
  -DRDP_SANITIZE="$kind" "${extra[@]}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
if [[ ${2:-} == --build-only ]]; then exit 0; fi

logs=$(realpath -m "$build")/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
source scripts/sanitizer-env.sh "$logs"
scripts/get-helm.sh "$(realpath -m "$build")/tools/bin"  # for the chart test; npm's cache makes it cheap

status=0
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --timeout 600 -E '^image$' || status=$?
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
