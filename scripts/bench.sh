#!/usr/bin/env bash
# The benchmarks side by side, one command:
#   scripts/bench.sh [--quick]
#   scripts/bench.sh --scheduler
# Builds what it needs (benchmarks on, in ${BUILD_DIR:-build}), then runs, each with its floor
# measured in the same run and interleaved with it:
#   bench_allocator  the allocator's CPU time per answer (DGX-like, scaled, distinct, shared)
#   bench_rpc        GetPreferredAllocation and Allocate round trips / the empty RPC and / a no-op
#                    RPC carrying the same request and response bytes, same socket
#   bench_discovery  discovery / hwloc's own load of the same XML, per fixture
#   bench_load       the serving plugin process under load: its anonymous memory
# and writes <build>/bench/summary.json (bench/summary.py says what each key is) with a table of
# the figures against their budgets (docs/benchmarks.md). --quick: 0.3 s runs, medians of three
# (about 2 minutes here); without it 1 s runs, medians of five.
# --scheduler instead: the real kube-scheduler placing pods with GPU and GPU + HCA claims on 1,000
# DGX-H100-like nodes' ResourceSlices (test/kubelet/run.sh --scheduler-bench, TestSchedulerBench;
# RDP_SCHED_BENCH_NODES and RDP_SCHED_BENCH_PODS change the sizes); builds rdma-device-plugin,
# fetches helm when there is none (scripts/lib/helm.sh) and writes <build>/bench/scheduler.json
# (bench/scheduler_summary.py says what each key is). Needs Go >= 1.26; exits 77 without it.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
scheduler=0
case ${1:-} in
  --quick) quick=1 ;;
  --scheduler) scheduler=1 ;;
  "") ;;
  *) echo "usage: scripts/bench.sh [--quick | --scheduler] (got '$1')" >&2; exit 2 ;;
esac
build=${BUILD_DIR:-build}
if ((scheduler)); then
  BUILD_DIR=$build RDP_BUILD_TARGETS=rdma-device-plugin scripts/build.sh
  source scripts/lib/helm.sh
  helm=$(find_or_fetch_helm "$build") || { echo "bench.sh: no helm, and scripts/get-helm.sh failed" >&2; exit 1; }
  RDP_HELM=$(realpath -- "$helm") RDP_BINARY=$(realpath -m -- "$build/cmd/rdma-device-plugin") \
    exec test/kubelet/run.sh --scheduler-bench "$build/bench/scheduler.json"
fi
# build.sh installs what is missing (scripts/install-deps.sh).
BUILD_DIR=$build scripts/build.sh -DRDP_BUILD_BENCHMARKS=ON
out=$build/bench
mkdir -p "$out"
rm -f "$out"/{allocator,rpc,discovery,load,summary}.json

# Medians of repetitions in both modes: a single short run on a shared VM strays by 10-40 %.
if ((quick)); then
  gb=(--benchmark_min_time=0.3 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true)
  load=(--clients 4 --duration 3s --floor-duration 1s --warmup 500ms)
else
  gb=(--benchmark_min_time=1 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true)
  load=(--clients 8 --duration 10s --floor-duration 3s --warmup 1s)
fi
run() {  # name json-file filter
  echo "== $1" >&2
  "$out/$1" --benchmark_filter="$3" --benchmark_out="$out/$2" --benchmark_out_format=json \
    "${gb[@]}" >&2
}
echo "bench.sh: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)" >&2
run bench_allocator allocator.json \
  '^BM_Exclusive/hcas:(8/size:2|32/size:4|32/size:8)/gpus:1/shape:0$|^BM_Exclusive/hcas:64/size:8/gpus:0/shape:1$|^BM_Shared/ids:1000/size:8$'
run bench_rpc rpc.json '^BM_GetPreferredAllocation/(0/8/[124]|0/32/4|1/8/8)/|^BM_Allocate/0/8/[14]/|^BM_AdmissionDense250'
run bench_discovery discovery.json '^BM_Discover/'
echo "== bench_load" >&2
"$out/bench_load" "${load[@]}" --json "$out/load.json" >&2
echo "bench.sh: load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 bench/summary.py "$out"
