#!/usr/bin/env bash
# Builds the project's image from the Dockerfile with podman, without a registry (docs/image.md):
#  1. debian:bookworm and debian:bookworm-slim made with debootstrap from this machine's Debian
#     mirror and imported into podman, rebuilt only when missing or when their recipe below
#     changed (the images carry its hash as a label);
#  2. the Dockerfile built unchanged (runc, explicit ulimits, no pull, podman's layer cache: with
#     the sources unchanged a rebuild reuses every layer and keeps the image ID).
# The one build step of scripts/image-test.sh (ctest image_podman) and scripts/real-node.sh,
# which share the tag, so that CI builds the image once.
#
#   scripts/build-image.sh [--image NAME] [--work DIR]
# Defaults: localhost/rdma-device-plugin:image-test, ${BUILD_DIR:-build}/image-test.
# RDP_DEBIAN_MIRROR overrides the mirror (default: the one in /etc/apt/sources*). One build at a
# time on a machine (/var/tmp/rdp-image-test.lock; RDP_IMAGE_LOCK_HELD=1 when the caller holds it).
# Exit 0 built, 1 failed, 2 bad flag, 77 cannot run here (not root, podman/runc/debootstrap
# missing or podman unable to run).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=${BUILD_DIR:-build}
image=localhost/rdma-device-plugin:image-test work=
while (($#)); do
  case "$1" in
    --image) image=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "build-image: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
work=${work:-$build/image-test}

t_start=$(date +%s)
say() { echo "build-image: $*"; }
skip() { say "SKIP: $*"; exit 77; }
fail() { say "FAIL: $*"; exit 1; }
phase_start=$t_start
phase() {  # the time the previous phase took
  local now
  now=$(date +%s)
  say "-- $1: $((now - phase_start)) s"
  phase_start=$now
}

[[ $(id -u) -eq 0 ]] || skip "needs root: rootful podman"
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || skip "$tool not installed (scripts/install-deps.sh installs it)"
done
mkdir -p "$work"
work=$(realpath "$work")
if [[ ${RDP_IMAGE_LOCK_HELD:-0} != 1 ]]; then
  # One build at a time on a machine: the image tag and the base images are shared.
  exec 9>/var/tmp/rdp-image-test.lock
  flock -w 3600 9 || fail "another image build held /var/tmp/rdp-image-test.lock for an hour"
fi
# shellcheck source=scripts/podman-env.sh
source scripts/podman-env.sh
podman_env "$work" || skip "podman cannot run here: $podman_error"

scratch=
trap '[[ -z $scratch ]] || rm -rf "$scratch"' EXIT

# --- 1. Base images ---------------------------------------------------------------------------
# The mirror apt uses here (deb822 or one-line sources), else Debian's CDN.
apt_uri() {  # $1: debian or debian-security
  local u
  u=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '$1 == "URIs:" {print $2}' |
      grep -E "/$1/?\$" | head -1 || true)
  [[ -n $u ]] || u=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1 == "deb" && $2 !~ /^\[/ {print $2}' | grep -E "/$1/?\$" | head -1 || true)
  echo "${u:-http://deb.debian.org/$1}"
}
mirror=${RDP_DEBIAN_MIRROR:-$(apt_uri debian)}
security_mirror=$(apt_uri debian-security)
suite=bookworm
base=docker.io/library/debian:$suite
slim=docker.io/library/debian:$suite-slim

# The recipe: its text (these functions and the mirror) is hashed into the images' label.
base_rootfs() {  # $1: directory to create; a minbase Debian as the official image has it
  local root=$1
  debootstrap --variant=minbase "$suite" "$root" "$mirror"
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security_mirror
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # The official images' apt settings: no .deb or package caches kept, no translations.
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log \
         "$root"/var/cache/debconf/*-old "$root"/dev/*
}
slimify() {  # $1: rootfs; what debian:*-slim leaves out (docs, man pages, locales), now and later
  local root=$1
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/{groff,info,linda,locale,man}/* "$root"/usr/share/lintian/overrides/*
}
import_rootfs() {  # $1: rootfs, $2: image name, $3: recipe hash
  tar --numeric-owner --xattrs -C "$1" -c . |
    pm import -q --change 'CMD ["bash"]' --change "LABEL org.rdp.base-recipe=$3" - "$2" >/dev/null
}
recipe=$({ declare -f base_rootfs slimify import_rootfs; echo "$suite $mirror $security_mirror"; } |
         sha256sum | cut -c1-16)
label() { pm image inspect --format '{{index .Labels "org.rdp.base-recipe"}}' "$1" 2>/dev/null || true; }
if [[ $(label "$base") == "$recipe" && $(label "$slim") == "$recipe" ]]; then
  say "base images $base and $slim up to date (recipe $recipe)"
else
  say "making $base and $slim with debootstrap from $mirror (recipe $recipe)"
  scratch=$(mktemp -d /var/tmp/rdp-image-base.XXXXXX)
  if ! base_rootfs "$scratch/rootfs" >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log"
    fail "debootstrap failed (log: $work/debootstrap.log)"
  fi
  import_rootfs "$scratch/rootfs" "$base" "$recipe"
  slimify "$scratch/rootfs"
  import_rootfs "$scratch/rootfs" "$slim" "$recipe"
  rm -rf "$scratch"
  scratch=
  pm image prune -f >/dev/null  # the previous bases, if any
fi
phase "base images"

# --- 2. The image, from the Dockerfile unchanged ----------------------------------------------
version=$(cat VERSION)
previous=$(pm image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
build_started=$(date +%s)
say "podman build -t $image (Dockerfile, context $repo)"
if ! pm build --pull=never --network=host "${ulimits[@]}" --layers \
       --build-arg "RDP_VERSION=$version" -t "$image" -f Dockerfile . >"$work/build.log" 2>&1; then
  tail -40 "$work/build.log"
  fail "podman build failed (log: $work/build.log)"
fi
grep -E '^(\[[0-9]+/[0-9]+\] )?STEP|^--> Using cache' "$work/build.log" | cut -c1-100 | sed 's/^/  /' || true
id=$(pm image inspect --format '{{.Id}}' "$image")
if [[ -n $previous && $previous != "$id" ]]; then
  pm rmi "$previous" >/dev/null 2>&1 || true  # the last run's image and its unshared layers
fi
# Earlier runs' untagged leaves (the build stage's compile layers, some 25 MB each): without
# this they pile up, one per source change.
pm image prune -f --filter "until=$build_started" >/dev/null
phase "image build"
say "built $image ($id) in $(($(date +%s) - t_start)) s"
