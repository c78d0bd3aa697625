#!/usr/bin/env bash
# Builds the project's image from the Dockerfile with podman, without a registry (docs/image.md):
#  1. debian:bookworm and debian:bookworm-slim made with debootstrap from this machine's Debian
#     mirror and imported into podman, rebuilt only when missing or when their recipe below
#     changed (the images carry its hash as a label);
#  2. the Dockerfile built unchanged (runc, explicit ulimits, no pull, podman's layer cache: with
#     the sources unchanged a rebuild reuses every layer and keeps the image ID; the build
#     stage is kept as NAME-build, so that no later prune takes its apt layer), with this
#     machine's ccache mounted as the build stage's (RDP_CCACHE_DIR): what scripts/build.sh
#     compiled here is not compiled again in the image;
#  3. with --arm64, also the linux/arm64 image NAME-arm64 from the same Dockerfile
#     (`--platform linux/arm64 --target runtime-copied`: cross-compiled in the build stage,
#     nothing of arm64 run) on an arm64 bookworm-slim made with `debootstrap --arch arm64
#     --foreign` (localhost/rdp-debian:bookworm-slim-arm64, rebuilt as the others; its build
#     stage kept as NAME-arm64-build), and both images in one manifest list NAME-multiarch
#     (docs/install.md).
# The one build step of scripts/image-test.sh (ctest image_podman, with --arm64) and
# scripts/real-node.sh, which share the tag, so that CI builds the image once.
#
#   scripts/build-image.sh [--image NAME] [--work DIR] [--arm64]
# Defaults: localhost/rdma-device-plugin:image-test, ${BUILD_DIR:-build}/image-test.
# RDP_DEBIAN_MIRROR overrides the mirror (default: the one in /etc/apt/sources*). One build at a
# time on a machine (/var/tmp/rdp-image-test.lock; RDP_IMAGE_LOCK_HELD=1 when the caller holds it).
# Installs the Debian packages it needs when missing (scripts/install-deps.sh).
# Exit 0 built, 1 failed, 2 bad flag, 77 cannot run here (not root, podman/runc/debootstrap
# missing after install-deps.sh, or podman unable to run).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=${BUILD_DIR:-build}
image=localhost/rdma-device-plugin:image-test work= arm64=0
while (($#)); do
  case "$1" in
    --arm64) arm64=1; shift ;;
    --image) image=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "build-image: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
work=${work:-$build/image-test}

# shellcheck source=scripts/lib/log.sh
source scripts/lib/log.sh build-image

[[ $(id -u) -eq 0 ]] || skip "needs root: rootful podman"
scripts/install-deps.sh || fail "scripts/install-deps.sh failed"
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || skip "$tool not installed after scripts/install-deps.sh"
done
if ((arm64)); then
  command -v aarch64-linux-gnu-strip >/dev/null ||
    skip "no aarch64-linux-gnu-strip for --arm64 after scripts/install-deps.sh"
fi
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
# A cleanup: an image held by a container outside this script (a buildah working container left
# by an interrupted build, say: "image is in use by a container") fails the prune, not the build.
prune_images() {
  local out
  if ! out=$(pm image prune -f "$@" 2>&1 >/dev/null); then
    say "warning: podman image prune failed, layers left for a later run: ${out##*$'\n'}"
  fi
}
label() { pm image inspect --format '{{index .Labels "org.rdp.base-recipe"}}' "$1" 2>/dev/null || true; }
# Runs $2 (base_rootfs or base_rootfs_arm64) into $scratch/rootfs, a new scratch directory, its
# output in $work/$1; fails with the log's end.
make_rootfs() {
  scratch=$(mktemp -d /var/tmp/rdp-image-base.XXXXXX)
  if ! "$2" "$scratch/rootfs" >"$work/$1" 2>&1; then
    tail -20 "$work/$1"
    fail "$2 (debootstrap) failed (log: $work/$1)"
  fi
}
if [[ $(label "$base") == "$recipe" && $(label "$slim") == "$recipe" ]]; then
  say "base images $base and $slim up to date (recipe $recipe)"
else
  say "making $base and $slim with debootstrap from $mirror (recipe $recipe)"
  make_rootfs debootstrap.log base_rootfs
  import_rootfs "$scratch/rootfs" "$base" "$recipe"
  slimify "$scratch/rootfs"
  import_rootfs "$scratch/rootfs" "$slim" "$recipe"
  rm -rf "$scratch"
  scratch=
  prune_images  # the previous bases, if any
fi
phase "base images"

# --- 2. The image, from the Dockerfile unchanged ----------------------------------------------
version=$(cat VERSION)
# Builds the Dockerfile's stage $2 as image $1, podman's output in $work/$3, with the podman
# build flags $4...; prints its steps and removes the image the tag named before (the last run's,
# with its unshared layers) when it changed. Then tags that build's build stage $1-build (the same
# build with --target build: every step from the layer cache). Untagged, the build stage would be
# dangling, and the prune below (this script's next run, or a run for the other architecture,
# such as real-node.sh's) would remove it with its parents down to the layer of the build
# dependencies (apt, ~1 GB for the arm64 cross build), installed again by the next build instead
# of a compile from ccache; tagged, only the build stage of an earlier source tree goes.
podman_build() {
  local tag=$1 target=$2 log=$work/$3 previous
  shift 3
  previous=$(pm image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  say "podman build --target $target $* -t $tag (Dockerfile, context $repo)"
  local flags=(--pull=never --network=host "${ulimits[@]}" --layers --build-arg "RDP_VERSION=$version"
               ${ccache_flags[@]+"${ccache_flags[@]}"} "$@")
  if ! pm build "${flags[@]}" --target "$target" -t "$tag" -f Dockerfile . >"$log" 2>&1; then
    tail -40 "$log"
    fail "podman build failed (log: $log)"
  fi
  grep -E '^(\[[0-9]+/[0-9]+\] )?STEP|^--> Using cache' "$log" | cut -c1-100 | sed 's/^/  /' || true
  built_id=$(pm image inspect --format '{{.Id}}' "$tag")
  if [[ -n $previous && $previous != "$built_id" ]]; then pm rmi "$previous" >/dev/null 2>&1 || true; fi
  if ! pm build "${flags[@]}" --target build -t "$tag-build" -f Dockerfile . >>"$log" 2>&1; then
    tail -20 "$log"
    fail "podman build --target build (to tag the build stage) failed (log: $log)"
  fi
}
# The machine's own ccache, mounted as the build stage's (the Dockerfile's RDP_CCACHE_DIR): the
# build stage compiles in the tree scripts/build.sh makes here, so what this machine compiled
# (scripts/test.sh's build, the arm64 cross build) is not compiled again in the image, and the
# reverse. Without ccache here, the Dockerfile's own cache mount.
ccache_flags=()
if command -v ccache >/dev/null && cache_dir=$(ccache --get-config cache_dir 2>/dev/null) &&
   [[ -n $cache_dir ]] && mkdir -p "$cache_dir"; then
  ccache_flags=(--volume "$cache_dir:/var/cache/rdp-ccache"
                --build-arg RDP_CCACHE_DIR=/var/cache/rdp-ccache)
  say "ccache: the machine's, $cache_dir"
fi
build_started=$(date +%s)
podman_build "$image" runtime build.log
id=$built_id
phase "image build"

# --- 3. linux/arm64 and the manifest list (--arm64) -------------------------------------------
# The arm64 base: debootstrap's first stage only (--foreign: it unpacks the packages, runs none
# of them), then what the slim images leave out. No arm64 program runs here.
arm64_base=localhost/rdp-debian:$suite-slim-arm64
base_rootfs_arm64() {  # $1: directory to create
  local root=$1
  debootstrap --arch arm64 --foreign --variant=minbase "$suite" "$root" "$mirror"
  rm -rf "$root/debootstrap" "$root"/var/cache/apt/archives/*.deb "$root"/dev/*
  # The first stage leaves /proc a link to the host's; a container runtime mounts proc there.
  rm -f "$root/proc" && mkdir -m 0555 "$root/proc"
}
if ((arm64)); then
  recipe_arm64=$({ declare -f base_rootfs_arm64 slimify; echo "$suite $mirror"; } | sha256sum | cut -c1-16)
  if [[ $(label "$arm64_base") == "$recipe_arm64" ]]; then
    say "arm64 base $arm64_base up to date (recipe $recipe_arm64)"
  else
    say "making $arm64_base with debootstrap --arch arm64 --foreign from $mirror (recipe $recipe_arm64)"
    make_rootfs debootstrap-arm64.log base_rootfs_arm64
    slimify "$scratch/rootfs"
    tar --numeric-owner --xattrs -C "$scratch/rootfs" -c . |
      pm import -q --arch arm64 --os linux --change "LABEL org.rdp.base-recipe=$recipe_arm64" - \
        "$arm64_base" >/dev/null
    rm -rf "$scratch"
    scratch=
  fi
  phase "arm64 base image"

  image_arm64=${image%:*}:${image##*:}-arm64
  podman_build "$image_arm64" runtime-copied build-arm64.log --platform linux/arm64 \
    --build-arg "BUILDPLATFORM=linux/$(dpkg --print-architecture)" \
    --build-arg "RDP_RUNTIME_BASE=$arm64_base"
  id_arm64=$built_id
  arch=$(pm image inspect --format '{{.Architecture}}' "$image_arm64")
  [[ $arch == arm64 ]] || fail "$image_arm64 is for '$arch', not arm64"
  phase "arm64 image build"

  list=${image%:*}:${image##*:}-multiarch
  pm manifest rm "$list" >/dev/null 2>&1 || true
  pm manifest create "$list" >/dev/null
  pm manifest add "$list" "containers-storage:$image" >/dev/null
  pm manifest add "$list" "containers-storage:$image_arm64" >/dev/null
  say "manifest list $list: $image and $image_arm64"
fi

# Earlier runs' untagged leaves (the build stages' compile layers, some 25 MB each): without
# this they pile up, one per source change. Once, after both architectures' builds: pruned
# between them, the arm64 build stage's would go before it could be reused.
prune_images --filter "until=$build_started"
say "built $image ($id)$( ((arm64)) && echo ", $image_arm64 ($id_arm64) and $list") in $(elapsed) s"
