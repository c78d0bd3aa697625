#!/bin/sh
# Copies the shared libraries an ELF program needs, and those they need in turn (DT_NEEDED), from
# the Debian multiarch directory of its architecture into DIR, under the same paths, soname links
# kept; except those of libc6, libgcc-s1 and libstdc++6, which every Debian base image has. For
# the image's runtime stage of a target whose programs cannot run in the build (the Dockerfile's
# runtime-copied: an arm64 image built on amd64 without emulation), where apt cannot run.
#
#   scripts/runtime-libs.sh PROGRAM DIR
# Exit 1 naming the library when one cannot be found.
set -eu
program=$1 dir=$2
case $(readelf -h "$program" | sed -n 's/^ *Machine: *//p') in
  AArch64) triplet=aarch64-linux-gnu ;;
  "Advanced Micro Devices X86-64") triplet=x86_64-linux-gnu ;;
  *) echo "runtime-libs: $program: unknown machine" >&2; exit 1 ;;
esac
libdir=/usr/lib/$triplet
base_packages=" libc6 libgcc-s1 libstdc++6 "
mkdir -p "$dir$libdir"
todo=$program seen=" "
while [ -n "$todo" ]; do
  set -- $todo
  file=$1
  shift
  todo=$*
  for soname in $(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    case $seen in *" $soname "*) continue ;; esac
    seen="$seen$soname "
    [ -e "$libdir/$soname" ] || { echo "runtime-libs: $soname (needed by $file) not in $libdir" >&2; exit 1; }
    real=$(readlink -f "$libdir/$soname")
    # dpkg knows some of them by their path before /usr was merged (/lib/<triplet>/...).
    package=$({ dpkg -S "$real" || dpkg -S "${real#/usr}"; } 2>/dev/null | head -1 | cut -d: -f1) || package=
    case $base_packages in *" $package "*) continue ;; esac
    cp -a "$libdir/$soname" "$dir$libdir/"
    [ "$real" = "$libdir/$soname" ] || cp -a "$real" "$dir$libdir/"
    todo="$todo $real"
  done
done
