#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time (FUZZ_SECONDS, default 60) from the clang
# ASan+UBSan+libFuzzer build that `scripts/sanitize.sh address` makes (built here if missing).
#   scripts/fuzz.sh [target ...]     targets: sysfs hwloc_xml rpc pod_resources (default: all)
# New inputs go to <build>/fuzz/<target>/corpus, never into the repository. A crash, leak,
# sanitizer report, failed invariant or an input that takes over 10 s fails the script; the input
# is saved as <build>/fuzz/<target>/{crash,leak,timeout,oom}-<sha1>: add it to
# test/fuzz/regressions/<target>/ with the fix, and ctest replays it from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-asan}
seconds=${FUZZ_SECONDS:-60}
targets=("$@")
if ((${#targets[@]} == 0)); then targets=(sysfs hwloc_xml rpc pod_resources); fi

need_build=0
for t in "${targets[@]}"; do
  [[ -x "$build/test/fuzz/fuzz_$t" ]] || need_build=1
done
if ((need_build)); then BUILD_DIR=$build scripts/sanitize.sh address --build-only; fi

# One target: its own output dir and log; returns non-zero on a finding.
run_target() {
  local t=$1
  local bin=$build/test/fuzz/fuzz_$t
  local out
  out=$(realpath -m "$build")/fuzz/$t
  mkdir -p "$out/corpus"
  local extra=()
  if [[ -f test/fuzz/$t.dict ]]; then extra+=(-dict="test/fuzz/$t.dict"); fi
  local seeds=(test/fuzz/corpus/"$t" test/fuzz/regressions/"$t")
  if [[ $t == hwloc_xml ]]; then seeds+=(test/data); fi
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=131072 \
    -print_final_stats=1 -close_fd_mask=1 -artifact_prefix="$out/" "${extra[@]}" \
    "$out/corpus" "${seeds[@]}" >"$out/log" 2>&1
}

for t in "${targets[@]}"; do
  if [[ ! -x $build/test/fuzz/fuzz_$t ]]; then
    echo "fuzz.sh: no fuzz target '$t' ($build/test/fuzz/fuzz_$t)" >&2
    exit 2
  fi
done
source scripts/sanitizer-env.sh ""  # reports to stderr (each fuzzer's log); "" or it sees our arguments
# As many targets at a time as there are CPUs (each fuzzer is one process on one CPU), in batches.
jobs=${FUZZ_JOBS:-$(nproc)}
failed=()
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  pids=()
  for t in "${batch[@]}"; do
    echo "fuzz.sh: $t for ${seconds}s"
    run_target "$t" &
    pids+=($!)
  done
  for j in "${!batch[@]}"; do
    wait "${pids[$j]}" || failed+=("${batch[$j]}")
  done
done
for t in "${targets[@]}"; do
  out=$(realpath -m "$build")/fuzz/$t
  if [[ ! " ${failed[*]} " =~ " $t " ]]; then
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE' "$out/log" | sed "s/^/  $t: /"  || true
  else
    echo "fuzz.sh: $t FAILED; the last lines of $out/log:" >&2
    tail -n 60 "$out/log" >&2
    ls "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-* 2>/dev/null >&2 || true
  fi
done
if ((${#failed[@]})); then
  echo "fuzz.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${targets[*]}: no findings in ${seconds}s each"
