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

# scripts/bench.sh --real-node [--window DURATION]: on the real node of scripts/real-node.sh (needs
# root), what an HCA adds to a pod's start (device plugin and DRA), what our NRI plugin adds to
# every container's creation, and what the plugin pod costs at rest over DURATION (default 10m);
# writes <build>/bench/real-node.json (TestRealNodeBench, docs/benchmarks.md). One real node runs
# on a machine at a time: it first waits (up to 20 min) for another checkout's to go down.
if [[ ${1:-} == --real-node ]]; then
  shift
  window=10m
  while (($#)); do
    case $1 in
      --window) [[ $# -ge 2 ]] || { echo "bench.sh: --window needs a duration (e.g. 10m)" >&2; exit 2; }
                window=$2; shift 2 ;;
      *) echo "usage: scripts/bench.sh --real-node [--window DURATION] (got '$1')" >&2; exit 2 ;;
    esac
  done
  build=${BUILD_DIR:-build}
  mkdir -p "$build/bench"
  build=$(cd "$build" && pwd)
  BUILD_DIR=$build scripts/real-node.sh build
  if BUILD_DIR=$build scripts/real-node.sh kubectl get nodes >/dev/null 2>&1; then
    echo "bench.sh: a real node of $build is up; scripts/real-node.sh down first" >&2
    exit 1
  fi
  other_node() {  # a running kubelet, containerd or control plane of any checkout's real node
    local p
    for p in /proc/[0-9]*; do
      [[ $(readlink "$p/exe" 2>/dev/null) =~ /real-node/bin/(kubelet|containerd|controlplane)$ ]] && return 0
    done
    return 1
  }
  deadline=$((SECONDS + 1200))
  while other_node; do
    ((SECONDS < deadline)) || { echo "bench.sh: another real node is still up after 20 min" >&2; exit 1; }
    echo "bench.sh: waiting for another real node on this machine to go down" >&2
    sleep 10
  done
  out=$build/bench/real-node.json
  rm -f "$out"
  echo "bench.sh: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)" >&2
  rc=0
  BUILD_DIR=$build RDP_REAL_NODE_BENCH=$out RDP_REAL_NODE_BENCH_WINDOW=$window \
    test/kubelet/run.sh --real-node -run '^TestRealNodeBench$' -timeout 90m || rc=$?
  [[ -f $out ]] && python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
budgets = {"pod_start_added_ms.deviceplugin_p95": 100, "pod_start_added_ms.dra_p95": 250,
           "nri_create_us.no_hca_p99": 1000, "node_overhead.cpu_millicores": 5, "node_overhead.rss_mib": 32}
for group in ("pod_start_added_ms", "nri_create_us", "node_overhead"):
    for key, value in r.get(group, {}).items():
        name = f"{group}.{key}"
        budget = budgets.get(name)
        verdict = "" if budget is None or value is None else ("ok" if value <= budget else "OVER")
        print(f"{name:40} {value!s:>10} {'' if budget is None else budget!s:>8} {verdict}")
PY
  exit $rc
fi

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
