#!/usr/bin/env bash
# Kubelet conformance: builds the Go harness in this directory and runs it against a built
# rdma-device-plugin. The harness runs the kubelet's own device manager, Topology Manager and
# pod-resources server (k8s.io/kubernetes, pinned in go.mod) - see docs/conformance.md.
#
# Usage: test/kubelet/run.sh [--build-only] [BINARY] [go test flags...]
#   BINARY defaults to $RDP_BINARY, then <repo>/build/cmd/rdma-device-plugin.
#   --build-only: download the modules and compile the harness (fills Go's caches), run nothing.
#   e.g. test/kubelet/run.sh build/cmd/rdma-device-plugin -run 'TestKubeletRestart'
#   The chart test uses helm from PATH, $RDP_HELM or <build>/tools/bin/helm, else it skips.
# Exit: go test's status (0 pass, 1 fail); 77 when it cannot run here (no Go >= 1.26, not
# root), which ctest reports as skipped. The Go module and build caches stay in Go's default
# places, so a second run on the same machine builds nothing.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

build_only=0
if [[ ${1:-} == --build-only ]]; then
  build_only=1
  shift
fi
if [[ $# -gt 0 && $1 != -* ]]; then
  RDP_BINARY=$1
  shift
fi
RDP_BINARY=${RDP_BINARY:-$repo/build/cmd/rdma-device-plugin}

skip() { echo "kubelet conformance: SKIPPED: $*"; exit 77; }
command -v go >/dev/null || skip "Go not found (needs Go >= 1.26)"
version=$(go env GOVERSION)          # go1.26.8
minor=${version#go1.}; minor=${minor%%.*}
[[ $version == go1.* && $minor =~ ^[0-9]+$ && $minor -ge 26 ]] || skip "$version is older than Go 1.26"
if ((build_only)); then
  cd "$here"
  start=$(date +%s)
  go test -count=1 -run '^$' .
  echo "kubelet conformance: harness built in $(( $(date +%s) - start ))s"
  exit 0
fi
[[ $(id -u) == 0 ]] || skip "needs root (each test mounts a tmpfs over the kubelet's device-plugin directory in its own mount namespace)"
command -v unshare >/dev/null || skip "unshare(1) not found (util-linux)"
if [[ ! -x $RDP_BINARY ]]; then
  echo "kubelet conformance: FAILED: no plugin binary at $RDP_BINARY" >&2
  exit 1
fi
export RDP_BINARY=$(cd "$(dirname "$RDP_BINARY")" && pwd)/$(basename "$RDP_BINARY")

cd "$here"
echo "kubelet conformance: $version, k8s.io/kubernetes $(go list -m -f '{{.Version}}' k8s.io/kubernetes), plugin $RDP_BINARY"
start=$(date +%s)
set +e
go test -count=1 -timeout 14m -v "$@" .
rc=$?
set -e
echo "kubelet conformance: go test exited $rc after $(( $(date +%s) - start ))s"
exit $rc
