# shellcheck shell=bash
# The helm a script installs or renders the chart with (scripts/real-node.sh,
# scripts/image-test.sh). Sourced, from the repository's root:
#
#   source scripts/lib/helm.sh
#   helm=$(find_or_fetch_helm BUILD_DIR) || exit 1
#
# find_or_fetch_helm prints the first of $RDP_HELM, BUILD_DIR/tools/bin/helm and helm on PATH
# that is an executable; with none of them, it fetches the pinned helm into BUILD_DIR/tools/bin
# (scripts/get-helm.sh, its messages on stderr) and prints that. Returns 1 when the fetch fails.
find_or_fetch_helm() {
  local dest=$1/tools/bin h
  for h in "${RDP_HELM:-}" "$dest/helm" "$(command -v helm || true)"; do
    if [[ -n $h && -x $h ]]; then
      echo "$h"
      return 0
    fi
  done
  echo "no helm: fetching it into $dest (scripts/get-helm.sh)" >&2
  scripts/get-helm.sh "$dest" >&2 || return 1
  echo "$dest/helm"
}
