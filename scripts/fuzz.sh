#!/usr/bin/env bash
# The libFuzzer targets (test/fuzz/), from the clang ASan+UBSan+libFuzzer build that
# `scripts/sanitize.sh address` makes (built here if missing).
#   scripts/fuzz.sh [target ...]              deterministic: every committed seed and regression
#                                             replayed, then a fixed-seed run of a fixed number
#                                             of inputs per target (ctest fuzz_replay_*/fuzz_run_*,
#                                             what CI runs inside `sanitize.sh address`)
#   scripts/fuzz.sh --campaign [target ...]   time-boxed campaigns with random seeds,
#                                             FUZZ_SECONDS (600) each, targets two at a time:
#                                             these may find new inputs
# targets: sysfs hwloc_xml rpc pod_resources (default: all). A campaign keeps its corpus in
# <build>/fuzz/<target>/corpus, never in the repository. A crash, leak, sanitizer report, failed
# invariant or an input that takes over 10 s fails it; the input is saved as
# <build>/fuzz/<target>/{crash,leak,timeout,oom}-<sha1>: add it to test/fuzz/regressions/<target>/
# with the fix, and every build replays it from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-asan}
campaign=0
if [[ ${1:-} == --campaign ]]; then
  campaign=1
  shift
fi
targets=("$@")
if ((${#targets[@]} == 0)); then targets=(sysfs hwloc_xml rpc pod_resources); fi
for t in "${targets[@]}"; do
  case "$t" in
    sysfs|hwloc_xml|rpc|pod_resources) ;;
    *) echo "fuzz.sh: no fuzz target '$t' (sysfs hwloc_xml rpc pod_resources)" >&2; exit 2 ;;
  esac
done

need_build=0
for t in "${targets[@]}"; do
  [[ -x "$build/test/fuzz/fuzz_$t" ]] || need_build=1
done
if ((need_build)); then BUILD_DIR=$build scripts/sanitize.sh address --build-only; fi

if ((!campaign)); then
  logs=$(realpath -m "$build")/sanitizer-logs
  rm -rf "$logs"
  mkdir -p "$logs"
  source scripts/sanitizer-env.sh "$logs"
  pattern="^fuzz_(replay|run)_($(IFS='|'; echo "${targets[*]}"))\$"
  status=0
  ctest --test-dir "$build" --output-on-failure -j"$(nproc)" -R "$pattern" || status=$?
  if compgen -G "$logs/*" >/dev/null; then
    cat "$logs"/* >&2
    status=1
  fi
  exit "$status"
fi

seconds=${FUZZ_SECONDS:-600}
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
