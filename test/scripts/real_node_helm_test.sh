#!/usr/bin/env bash
# scripts/real-node.sh up fetches helm when none is found ($RDP_HELM, <build>/tools/bin, PATH),
# before it builds or starts anything: here it then stops at "already up" (a live process stands
# in for the node's namespace holder), so nothing is built or started. Also the lookup order of
# scripts/lib/helm.sh. Needs what real-node.sh's preconditions need (root, Go >= 1.26) and npm.
# Exit 0 pass, 1 fail, 77 (skipped) when those are missing.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fail() { echo "real_node_helm_test: FAILED: $*" >&2; exit 1; }
command -v npm >/dev/null || { echo "real_node_helm_test: SKIPPED: no npm"; exit 77; }
work=$(mktemp -d)
holder=
trap '[[ -z $holder ]] || kill "$holder" 2>/dev/null || true; rm -rf "$work"' EXIT
pinned=$(sed -n 's/^readonly kSha256=\${RDP_HELM_SHA256:-\([0-9a-f]\{64\}\)}$/\1/p' "$repo/scripts/get-helm.sh")
[[ -n $pinned ]] || fail "no pinned sha256 in scripts/get-helm.sh"

# scripts/lib/helm.sh: $RDP_HELM first, then <build>/tools/bin/helm.
mkdir -p "$work/stub" "$work/build/tools/bin"
printf '#!/bin/sh\n' >"$work/stub/helm"
printf '#!/bin/sh\n' >"$work/build/tools/bin/helm"
chmod +x "$work/stub/helm" "$work/build/tools/bin/helm"
got=$(cd "$repo" && source scripts/lib/helm.sh && RDP_HELM=$work/stub/helm find_or_fetch_helm "$work/build")
[[ $got == "$work/stub/helm" ]] || fail "RDP_HELM not taken first: $got"
got=$(cd "$repo" && source scripts/lib/helm.sh && RDP_HELM= find_or_fetch_helm "$work/build")
[[ $got == "$work/build/tools/bin/helm" ]] || fail "<build>/tools/bin/helm not taken: $got"

# PATH without any helm (test.sh puts <build>/tools/bin on it).
path=
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do [[ -x $d/helm ]] || path=${path:+$path:}$d; done
# A node directory as --node wants it (nothing in it is read before "already up").
node=$work/node
mkdir -p "$node/sys" "$node/dev/infiniband"
touch "$node/topology.xml"
build=$work/rn
mkdir -p "$build/real-node/run/pids"
sleep 600 &
holder=$!
echo "$holder" >"$build/real-node/run/pids/holder"

rc=0
out=$(cd "$repo" && env -u RDP_HELM PATH="$path" BUILD_DIR="$build" scripts/real-node.sh up --node "$node" 2>&1) || rc=$?
if ((rc == 77)); then echo "real_node_helm_test: SKIPPED: ${out##*SKIPPED: }"; exit 77; fi
((rc == 1)) && [[ $out == *"already up"* ]] || fail "exit $rc, want 1 with 'already up': $out"
[[ -x $build/tools/bin/helm ]] || fail "no helm fetched into $build/tools/bin: $out"
[[ $(sha256sum "$build/tools/bin/helm" | cut -d' ' -f1) == "$pinned" ]] || fail "the fetched helm is not the pinned one"
echo "real_node_helm_test: passed"
