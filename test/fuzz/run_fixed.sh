#!/usr/bin/env bash
# One deterministic fuzz run, as ctest's fuzz_run_<target> runs it in the libFuzzer build:
#   run_fixed.sh <fuzzer> <scratch-dir> <runs> [libFuzzer flags ...] -- <seed dir ...>
# A fixed seed (-seed=1) and a fixed number of inputs (-runs) starting from the committed seeds
# alone: the same code gives the same inputs, so a failure here is reproducible and comes from
# the change under test, not from luck. New inputs go to the scratch dir, emptied first, never
# into the repository. A crash, leak, sanitizer report, failed invariant or an input slower than
# 60 s fails it; the input is saved in the scratch dir and its path printed.
# Time-boxed campaigns with random seeds, which may find new inputs: scripts/fuzz.sh --campaign.
set -euo pipefail
fuzzer=$1 scratch=$2 runs=$3
shift 3
flags=()
while (($#)) && [[ $1 != -- ]]; do flags+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
rm -rf "$scratch"
mkdir -p "$scratch/corpus"
exec "$fuzzer" -seed=1 -runs="$runs" -max_total_time=600 -timeout=60 -rss_limit_mb=4096 \
  -max_len=131072 -print_final_stats=1 -close_fd_mask=1 -artifact_prefix="$scratch/" \
  "${flags[@]}" "$scratch/corpus" "$@"
