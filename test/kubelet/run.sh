#!/usr/bin/env bash
# Kubelet conformance: builds the Go harness in this directory and runs it against a built
# rdma-device-plugin. The harness runs the kubelet's own device manager, Topology Manager and
# pod-resources server (k8s.io/kubernetes, pinned in go.mod) - see docs/conformance.md.
#
# Usage: test/kubelet/run.sh [--build-only] [BINARY] [go test flags...]
#        test/kubelet/run.sh --proto [go test flags...]
#        test/kubelet/run.sh --control-plane [go test flags...]
#        test/kubelet/run.sh --nri [BINARY] [go test flags...]
#        test/kubelet/run.sh --scheduler-bench OUT [go test flags...]
#   BINARY defaults to $RDP_BINARY, then <repo>/build/cmd/rdma-device-plugin.
#   --build-only: download the modules and compile the harness (fills Go's caches), check that
#   every file is gofmt-formatted, run nothing.
#   --proto: only TestProtoMatchesKubelet and TestProtoMatchesNRI (proto/*.proto against the
#   kubelet's, NRI's and ttrpc's descriptors); needs
#   neither root nor the binary. Both take the descriptor set from $RDP_PROTO_DESCRIPTORS, else
#   <build>/proto/rdp_proto.binpb beside BINARY's <build>/cmd (CMake target
#   rdp_proto_descriptors); without one the full run skips that test and --proto fails.
#   e.g. test/kubelet/run.sh build/cmd/rdma-device-plugin -run 'TestKubeletRestart'
#   The chart test uses helm from PATH, $RDP_HELM or <build>/tools/bin/helm, else it skips.
#   --control-plane: the package ./controlplane (a real kube-apiserver on an embedded etcd, the
#   DaemonSet controller, the garbage collector and the scheduler; helm installs the chart into it); needs
#   no root; helm ($RDP_HELM, PATH or <repo>/build/tools/bin/helm), and for its DRA tests the binary
#   ($RDP_BINARY or <repo>/build/cmd/rdma-device-plugin).
#   e.g. test/kubelet/run.sh --control-plane -run 'TestHelmControlPlane/InstallPodSecurity' 
#   --nri: the package ./nri: github.com/containerd/nri's runtime side (the adaptation containerd
#   runs) drives BINARY's `nri` subcommand over a real socket; needs neither root nor containerd.
#   --scheduler-bench OUT: ./controlplane's TestSchedulerBench (docs/benchmarks.md, "Scheduler"):
#   the real kube-scheduler allocating GPU and GPU + HCA claims on RDP_SCHED_BENCH_NODES (1000)
#   nodes, RDP_SCHED_BENCH_PODS (500) pods per class; writes the figures to OUT and checks them
#   with bench/scheduler_summary.py. Needs what --control-plane's DRA tests need (helm, the
#   binary); scripts/bench.sh --scheduler provides both. Skipped (77) when the test skips.
#   --real-node: the package ./realnode (TestRealNode*, docs/real-node.md): scripts/real-node.sh
#   brings a real node up (kubelet binary, containerd, the chart's DaemonSet from our image) in
#   the build directory (BUILD_DIR, else <repo>/build) and the tests look inside its containers;
#   needs root. `scripts/real-node.sh build` first builds what it runs (ctest real_node_build).
# Exit: go test's status (0 pass, 1 fail); 77 when it cannot run here (no Go >= 1.26; not root,
# except for --proto), which ctest reports as skipped. The Go module and build caches stay in
# Go's default places, so a second run on the same machine builds nothing.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

build_only=0
proto_only=0
control_plane=0
nri=0
real_node=0
sched_bench=0
case ${1:-} in
  --build-only) build_only=1; shift ;;
  --proto) proto_only=1; shift ;;
  --control-plane) control_plane=1; shift ;;
  --nri) nri=1; shift ;;
  --real-node) real_node=1; shift ;;
  --scheduler-bench)
    sched_bench=1
    [[ -n ${2:-} && ${2:-} != -* ]] || { echo "usage: run.sh --scheduler-bench OUT [go test flags...]" >&2; exit 2; }
    sched_out=$(realpath -m -- "$2")
    shift 2 ;;
esac
if ((!proto_only && !control_plane && !real_node && !sched_bench)) && [[ $# -gt 0 && $1 != -* ]]; then
  RDP_BINARY=$1
  shift
fi
RDP_BINARY=${RDP_BINARY:-$repo/build/cmd/rdma-device-plugin}
RDP_PROTO_DESCRIPTORS=${RDP_PROTO_DESCRIPTORS:-$(dirname "$(dirname "$RDP_BINARY")")/proto/rdp_proto.binpb}

skip() { echo "kubelet conformance: SKIPPED: $*"; exit 77; }
command -v go >/dev/null || skip "Go not found (needs Go >= 1.26)"
version=$(go env GOVERSION)          # go1.26.8
minor=${version#go1.}; minor=${minor%%.*}
[[ $version == go1.* && $minor =~ ^[0-9]+$ && $minor -ge 26 ]] || skip "$version is older than Go 1.26"
# The API server reports the Kubernetes version the way release builds stamp it (hack/lib/version.sh):
# without it, /version says v0.0.0-master and helm refuses the chart's kubeVersion. Only the link
# step depends on it.
cd "$here"
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)     # v1.37.2
k8s_minor=${k8s_version#v1.}; k8s_minor=${k8s_minor%%.*}
version_ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$k8s_minor -X k8s.io/component-base/version.gitTreeState=clean"
if ((build_only)); then
  start=$(date +%s)
  go test -count=1 -run '^$' .
  go test -count=1 -ldflags "$version_ldflags" -run '^$' ./controlplane
  go test -count=1 -run '^$' ./nri
  go test -count=1 -run '^$' ./realnode
  # House style for the harness is gofmt's: a file it would change fails the build step.
  unformatted=$(gofmt -l .)
  if [[ -n $unformatted ]]; then
    echo "kubelet conformance: FAILED: not gofmt-formatted (run gofmt -w):" $unformatted >&2
    exit 1
  fi
  echo "kubelet conformance: harness built in $(( $(date +%s) - start ))s"
  exit 0
fi
if ((nri)); then
  if [[ ! -x $RDP_BINARY ]]; then
    echo "nri: FAILED: no plugin binary at $RDP_BINARY" >&2
    exit 1
  fi
  export RDP_BINARY=$(cd "$(dirname "$RDP_BINARY")" && pwd)/$(basename "$RDP_BINARY")
  echo "nri: $version, github.com/containerd/nri $(go list -m -f '{{.Version}}' github.com/containerd/nri), plugin $RDP_BINARY"
  start=$(date +%s)
  set +e
  go test -count=1 -timeout 5m -v "$@" ./nri
  rc=$?
  set -e
  echo "nri: go test exited $rc after $(( $(date +%s) - start ))s"
  exit $rc
fi
if ((real_node)); then
  [[ $(id -u) == 0 ]] || skip "needs root (the node's mount namespace, cgroups, containerd)"
  export BUILD_DIR=${BUILD_DIR:-$repo/build}
  echo "real node: $version, k8s.io/kubernetes $k8s_version, build directory $BUILD_DIR"
  start=$(date +%s)
  set +e
  go test -count=1 -timeout 12m -v -run '^TestRealNode' "$@" ./realnode
  rc=$?
  set -e
  echo "real node: go test exited $rc after $(( $(date +%s) - start ))s"
  exit $rc
fi
if ((sched_bench)); then
  if [[ ! -x $RDP_BINARY ]]; then
    echo "scheduler bench: FAILED: no plugin binary at $RDP_BINARY" >&2
    exit 1
  fi
  export RDP_BINARY=$(cd "$(dirname "$RDP_BINARY")" && pwd)/$(basename "$RDP_BINARY")
  mkdir -p "$(dirname "$sched_out")"
  export RDP_SCHED_BENCH_OUT=$sched_out
  rm -f "$RDP_SCHED_BENCH_OUT"
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  echo "scheduler bench: $version, k8s.io/kubernetes $k8s_version, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), nodes ${RDP_SCHED_BENCH_NODES:-1000}, pods ${RDP_SCHED_BENCH_PODS:-500} per class"
  start=$(date +%s)
  set +e
  go test -count=1 -timeout 90m -v -ldflags "$version_ldflags" -run '^TestSchedulerBench$' "$@" ./controlplane 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "scheduler bench: go test exited $rc after $(( $(date +%s) - start ))s, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  ((rc == 0)) || exit $rc
  if [[ ! -f $RDP_SCHED_BENCH_OUT ]] && grep -q -- '--- SKIP: TestSchedulerBench' "$log"; then
    skip "TestSchedulerBench skipped (its reason is in the log above)"
  fi
  python3 "$repo/bench/scheduler_summary.py" "$RDP_SCHED_BENCH_OUT"
  exit 0
fi
if ((control_plane)); then
  # The DRA tests run the plugin binary (they fail without it; the helm tests do not need it).
  if [[ -x $RDP_BINARY ]]; then
    export RDP_BINARY=$(cd "$(dirname "$RDP_BINARY")" && pwd)/$(basename "$RDP_BINARY")
  fi
  echo "control plane: $version, k8s.io/kubernetes $k8s_version, helm ${RDP_HELM:-from PATH or build/tools/bin}, plugin ${RDP_BINARY}"
  start=$(date +%s)
  set +e
  go test -count=1 -timeout 10m -v -ldflags "$version_ldflags" "$@" ./controlplane
  rc=$?
  set -e
  echo "control plane: go test exited $rc after $(( $(date +%s) - start ))s"
  exit $rc
fi
# go test runs in $here: the descriptor set's path made absolute, or left unset (the test skips).
if [[ -f $RDP_PROTO_DESCRIPTORS ]]; then
  export RDP_PROTO_DESCRIPTORS=$(cd "$(dirname "$RDP_PROTO_DESCRIPTORS")" && pwd)/$(basename "$RDP_PROTO_DESCRIPTORS")
elif ((proto_only)); then
  echo "kubelet conformance: FAILED: no descriptor set at $RDP_PROTO_DESCRIPTORS (build the CMake target rdp_proto_descriptors)" >&2
  exit 1
else
  unset RDP_PROTO_DESCRIPTORS
fi
if ((proto_only)); then
  cd "$here"
  echo "kubelet conformance: proto drift check, k8s.io/kubelet $(go list -m -f '{{.Version}}' k8s.io/kubelet), descriptors $RDP_PROTO_DESCRIPTORS"
  exec go test -count=1 -v -run '^TestProtoMatches(Kubelet|NRI)$' "$@" .
fi
[[ $(id -u) == 0 ]] || skip "needs root (each test mounts a tmpfs over the kubelet's device-plugin directory in its own mount namespace)"
command -v unshare >/dev/null || skip "unshare(1) not found (util-linux)"
if [[ ! -x $RDP_BINARY ]]; then
  echo "kubelet conformance: FAILED: no plugin binary at $RDP_BINARY" >&2
  exit 1
fi
export RDP_BINARY=$(cd "$(dirname "$RDP_BINARY")" && pwd)/$(basename "$RDP_BINARY")

cd "$here"
echo "kubelet conformance: $version, k8s.io/kubernetes $(go list -m -f '{{.Version}}' k8s.io/kubernetes), plugin $RDP_BINARY, proto descriptors ${RDP_PROTO_DESCRIPTORS:-none}"
start=$(date +%s)
set +e
go test -count=1 -timeout 14m -v "$@" .
rc=$?
set -e
echo "kubelet conformance: go test exited $rc after $(( $(date +%s) - start ))s"
exit $rc
