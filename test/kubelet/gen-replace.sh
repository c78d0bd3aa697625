#!/bin/sh
# Prints the replace block that pins every k8s.io/* staging module of k8s.io/kubernetes@$1
# (default v1.37.2) to the matching v0.x.y tag, read from that release's own go.mod.
# Usage: ./gen-replace.sh v1.37.2 > /tmp/replace.txt, then paste into go.mod.
set -eu
release=${1:-v1.37.2}
staging=v0.${release#v1.}
gomod=$(go mod download -json "k8s.io/kubernetes@$release" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
echo "replace ("
awk -v v="$staging" '/^replace \(/{f=1;next} f&&/^\)/{f=0} f&&/=> \.\/staging\//{printf "\t%s => %s %s\n", $1, $1, v}' "$gomod"
echo ")"
