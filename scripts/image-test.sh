#!/usr/bin/env bash
# The container image, built and run for real (docs/image.md; ctest image_podman):
#  1. debian:bookworm and debian:bookworm-slim made with debootstrap from this machine's Debian
#     mirror and imported into podman (no registry needed), rebuilt only when missing or when
#     their recipe below changed (the images carry its hash as a label);
#  2. the project's Dockerfile built unchanged with podman (runc, explicit ulimits, no pull);
#  3. the image holds only what the runtime needs (no compiler, headers, static libraries, apt
#     lists or build tree; only runtime library packages over bookworm-slim; a stripped binary)
#     and its size is reported;
#  4. each of the chart's DaemonSets (helm template, translated by test/image/chart_run.py) runs
#     as the chart runs it: its args, env, security context (read-only root, every capability
#     dropped, no new privileges, root), memory limit and hostPath mounts, as bind mounts of a
#     fixture node (`rdma-device-plugin fixture`). A kubelet stand-in on the host
#     (test/image/kubelet_standin.cc: Registration on kubelet.sock and pod-resources, real gRPC)
#     takes the plugin's registration through the mounted device-plugins directory, follows
#     ListAndWatch and makes GetPreferredAllocation and Allocate calls on the plugin's socket;
#     the chart's liveness command (`probe`) answers inside the container; the process runs
#     with no capabilities, no new privileges and a read-only root; `topology --json` inside
#     equals the host-built binary's; SIGTERM (podman stop) ends it with exit 0 and its socket
#     removed.
# Exit 0 passed, 1 failed, 77 skipped (not root, or podman/runc/debootstrap/helm missing or
# podman unable to run: the reason is printed). Every wait has a deadline; nothing sleeps for a
# fixed time to synchronise.
#
#   scripts/image-test.sh [--build-dir DIR] [--binary PATH] [--standin PATH] [--helm PATH]
#                         [--work DIR] [--image NAME]
# Defaults from the build directory (${BUILD_DIR:-build}): its cmd/rdma-device-plugin,
# test/image/image_kubelet_standin, tools/bin/helm (else helm on PATH) and image-test/.
# RDP_DEBIAN_MIRROR overrides the mirror (default: the one in /etc/apt/sources*).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=${BUILD_DIR:-build}
binary= standin= helm= work= image=localhost/rdma-device-plugin:image-test
while (($#)); do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    --standin) standin=$2; shift 2 ;;
    --helm) helm=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --image) image=$2; shift 2 ;;
    *) echo "image-test: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
binary=${binary:-$build/cmd/rdma-device-plugin}
standin=${standin:-$build/test/image/image_kubelet_standin}
work=${work:-$build/image-test}
if [[ -z $helm ]]; then
  helm=$build/tools/bin/helm
  [[ -x $helm ]] || helm=$(command -v helm || true)
fi

t_start=$(date +%s)
say() { echo "image-test: $*"; }
skip() { say "SKIP: $*"; exit 77; }
fail() { say "FAIL: $*"; exit 1; }
phase_start=$t_start
phase() {  # the time the previous phase took
  local now
  now=$(date +%s)
  say "-- $1: $((now - phase_start)) s"
  phase_start=$now
}

# --- Preconditions ----------------------------------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "needs root: rootful podman, bind-mounted sockets in root-owned directories as on a node"
for tool in podman runc debootstrap python3; do
  command -v "$tool" >/dev/null || skip "$tool not installed (scripts/install-deps.sh installs it)"
done
[[ -n $helm && -x $helm ]] || skip "helm not found (scripts/get-helm.sh $build/tools/bin)"
[[ -x $binary ]] || fail "no plugin binary at $binary (scripts/build.sh)"
[[ -x $standin ]] || fail "no kubelet stand-in at $standin (scripts/build.sh -DBUILD_TESTING=ON)"
binary=$(realpath "$binary") standin=$(realpath "$standin") helm=$(realpath "$helm")
mkdir -p "$work"
work=$(realpath "$work")

# One run at a time on a machine: the image tag and the base images are shared.
exec 9>/var/tmp/rdp-image-test.lock
flock -w 3600 9 || fail "another image-test.sh held /var/tmp/rdp-image-test.lock for an hour"

# podman: runc (crun refused this machine's hybrid cgroup v1/v2 layout, issue 15) and explicit
# ulimits within the hard limits (podman's defaults for root exceed a sandbox's, and runc may
# not raise them). Capped further, as containers are started through conmon, which podman runs
# with an RLIMIT_NPROC of its own (32768 on the machine this was written on, whatever ulimit -Hu
# says); a build and the plugin need far less.
limit() {  # $1: ulimit option, $2: cap
  local v
  v=$(ulimit "$1")
  [[ $v == unlimited || $v -gt $2 ]] && v=$2
  echo "$v"
}
nofile=$(limit -Hn 65536) nproc=$(limit -Hu 16384)
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF=$work/containers.conf
# buildah keeps RUN --mount=type=cache directories under $TMPDIR: a place that persists.
export TMPDIR=/var/tmp
ulimits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
pm() { podman --runtime runc "$@"; }
info=$(pm info 2>&1) || skip "podman cannot run here: $(tail -1 <<<"$info")"

containers=() standin_pid= scratch=
cleanup() {
  local c
  [[ -z $scratch ]] || rm -rf "$scratch"
  for c in "${containers[@]}"; do pm rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  if [[ -n $standin_pid ]]; then kill "$standin_pid" 2>/dev/null || true; wait "$standin_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

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

# --- 3. Only what the runtime needs ----------------------------------------------------------
size=$(pm image inspect --format '{{.Size}}' "$image")
slim_size=$(pm image inspect --format '{{.Size}}' "$slim")
label_version=$(pm image inspect --format '{{index .Labels "org.opencontainers.image.version"}}' "$image")
[[ $label_version == "$version" ]] || fail "image label version '$label_version', VERSION $version"
run_once() { pm run --rm --network=none "${ulimits[@]}" "$@"; }
got=$(run_once "$image" --version) || fail "$image --version failed"
[[ $got == "rdma-device-plugin $version" ]] || fail "$image --version said '$got'"

cid=$(pm create "$image")
containers+=("$cid")
pm export "$cid" >"$work/rootfs.tar"
pm rm "$cid" >/dev/null
tar -tf "$work/rootfs.tar" | sed 's|^\./||' | sort >"$work/rootfs.list"
# Paths a runtime image must not have: compilers and build tools, headers, static and pkg-config
# files, apt's lists and downloaded packages, the build stage's trees, ccache.
forbidden='^(usr/bin/(gcc|g\+\+|cc|c\+\+|cpp|clang|ld|as|make|cmake|ccache|protoc|grpc_cpp_plugin)(-[0-9.]+)?$'
forbidden+='|usr/include/.|usr/lib/gcc/|usr/local/include/.|.*\.a$|.*/pkgconfig/.'
forbidden+='|var/lib/apt/lists/[^/]+[^/]$|var/cache/apt/archives/[^/]+\.deb$'
forbidden+='|(src|build|out)/|root/\.cache/)'
if grep -E "$forbidden" "$work/rootfs.list" >"$work/forbidden.list"; then
  head -20 "$work/forbidden.list"
  fail "the image holds $(wc -l <"$work/forbidden.list") paths a runtime does not need"
fi
tar -xOf "$work/rootfs.tar" usr/bin/rdma-device-plugin >"$work/binary.in-image" 2>/dev/null ||
  tar -xOf "$work/rootfs.tar" ./usr/bin/rdma-device-plugin >"$work/binary.in-image"
if readelf -S "$work/binary.in-image" | grep -q '\.symtab'; then fail "the image's binary is not stripped"; fi
binary_size=$(stat -c %s "$work/binary.in-image")
rm -f "$work/rootfs.tar" "$work/binary.in-image"

packages() { run_once --entrypoint dpkg-query "$1" -W -f '${Package}\n' | sort; }
packages "$slim" >"$work/packages.slim"
packages "$image" >"$work/packages.image"
comm -13 "$work/packages.slim" "$work/packages.image" >"$work/packages.added"
# Over bookworm-slim: shared-library packages only (no -dev, -doc, tools, compilers, python).
if grep -vE '^lib[a-z0-9.+-]+$' "$work/packages.added" | grep -q . ||
   grep -E -- '-(dev|doc|dbg|bin|utils)$' "$work/packages.added" | grep -q .; then
  fail "packages over bookworm-slim that are not runtime libraries: $(grep -vE '^lib[a-z0-9.+-]+$' "$work/packages.added"; grep -E -- '-(dev|doc|dbg|bin|utils)$' "$work/packages.added" | tr '\n' ' ')"
fi
say "image $image ($id): $((size / 1000000)) MB; bookworm-slim $((slim_size / 1000000)) MB," \
    "$(wc -l <"$work/packages.added") runtime library packages and the stripped binary" \
    "($((binary_size / 1000)) kB) over it"
say "runtime packages over bookworm-slim: $(tr '\n' ' ' <"$work/packages.added")"
phase "image contents"

# --- 4. Run as the chart runs it --------------------------------------------------------------
node=$work/node
kubelet=$work/kubelet
rm -rf "$node" "$kubelet" "$work/chart"
"$binary" fixture --topology-xml test/data/dgx-h100-like.xml --out "$node" --log-level warn >/dev/null
mkdir -p "$node/proc/driver" "$kubelet/device-plugins" "$kubelet/pod-resources"
hcas=$("$binary" topology --json --sysfs-root "$node" --dev-root "$node" --log-level off 2>/dev/null |
       python3 -c 'import json, sys; print(len(json.load(sys.stdin)["hcas"]))')
"$helm" template rdp charts/rdma-device-plugin --namespace kube-system \
    --set image.repository="${image%:*}" --set image.tag="${image##*:}" >"$work/chart.yaml"
modes=$(python3 test/image/chart_run.py --image "$image" --out "$work/chart" \
    --host-path "/var/lib/kubelet/device-plugins=$kubelet/device-plugins" \
    --host-path "/var/lib/kubelet/pod-resources=$kubelet/pod-resources" \
    --host-path "/sys=$node/sys" --host-path "/dev/infiniband=$node/dev/infiniband" \
    --host-path "/proc/driver=$node/proc/driver" --host-path "/var/run/nri=$work/nri" \
    <"$work/chart.yaml") ||
  fail "cannot translate the chart's DaemonSets (test/image/chart_run.py)"
say "fixture node: $hcas HCAs under $node; the chart's DaemonSets: $(echo $modes)"

# Waits until the file $1 is a socket (or stops being one with $2=gone), for at most $3 s.
wait_socket() {
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    if [[ $2 == there && -S $1 ]] || [[ $2 == gone && ! -e $1 ]]; then return 0; fi
    sleep 0.1
  done
  return 1
}

# Prints the kubelet stand-in's lines (fd 8) until one starts with $1: 0; at a FAIL line, the
# end of its output or after 180 s: 1.
read_until() {
  local line deadline=$((SECONDS + 180))
  while ((SECONDS < deadline)); do
    IFS= read -r -t $((deadline - SECONDS)) line <&8 || break
    echo "  kubelet: $line"
    [[ $line == "$1"* ]] && return 0
    [[ $line == FAIL* ]] && return 1
  done
  return 1
}

for mode in $modes; do
  say "== $mode DaemonSet =="
  # shellcheck disable=SC1090
  source "$work/chart/$mode.vars"
  mapfile -d '' run_args <"$work/chart/$mode.run"
  mapfile -d '' probe <"$work/chart/$mode.probe"
  expect=$hcas
  [[ $mode == shared ]] && expect=$shared_devices
  rm -f "$kubelet"/device-plugins/* "$kubelet"/pod-resources/*

  # The kubelet stand-in: its stdout comes through a pipe, read with a deadline.
  exec 8< <(exec "$standin" --device-plugins "$plugin_dir" \
                --pod-resources-socket "$pod_resources_socket" --dev-root "$node" \
                --mode "$mode" --resource "$resource" --endpoint "$socket" \
                --devices "$expect" --timeout 120s 2>&1)
  standin_pid=$!
  read_until "listening on " ||
    fail "the kubelet stand-in did not start"

  name=rdp-image-test-$mode
  pm rm -f -t 0 "$name" >/dev/null 2>&1 || true
  containers+=("$name")
  say "podman run --name $name --network=none ${run_args[*]}"
  pm run -d --name "$name" --network=none "${ulimits[@]}" "${run_args[@]}" >/dev/null ||
    fail "podman run failed"
  if ! read_until ok; then
    pm logs "$name" 2>&1 | tail -30 | sed 's/^/  plugin: /'
    fail "$mode: the plugin in the container did not register, list and allocate"
  fi

  # The chart's liveness command, inside.
  out=$(pm exec "$name" "${probe[@]}" 2>&1) || fail "$mode: probe failed: $out"
  say "probe: $out"

  # The security context in effect: PID 1 is the plugin, with no capabilities, no new
  # privileges, as root, under seccomp, on a read-only root.
  status=$(pm exec "$name" cat /proc/1/status)
  for want in 'CapPrm:	0000000000000000' 'CapEff:	0000000000000000' \
              'CapBnd:	0000000000000000' 'NoNewPrivs:	1' 'Seccomp:	2' 'Uid:	0	0	0	0'; do
    grep -qF "$want" <<<"$status" || fail "$mode: /proc/1/status lacks '$want'"
  done
  grep -q '^Name:	rdma-device-pl' <<<"$status" || fail "$mode: PID 1 is not the plugin"
  if out=$(pm exec "$name" touch /usr/bin/rdp-write-test 2>&1); then
    fail "$mode: the root filesystem is writable"
  fi
  grep -q 'Read-only file system' <<<"$out" || fail "$mode: writing the root failed otherwise: $out"
  say "security: no capabilities, NoNewPrivs, seccomp, uid 0, read-only root"

  # topology --json inside equals the host-built binary's on the same fixture: with the chart's
  # discovery flags (sysfs only), and with the node's hwloc XML mounted (PCIe tree and GPUs).
  # The chart's /host is the node's root, the fixture's $node outside.
  read -r -a discovery_args <<<"$discovery"
  host_args=()
  for a in "${discovery_args[@]}"; do
    case $a in
      --sysfs-root=/host | --dev-root=/host) host_args+=("${a%%=*}=$node") ;;
      *) fail "$mode: the chart's $a: this test maps only --sysfs-root=/host and --dev-root=/host" ;;
    esac
  done
  inside=$(pm exec "$name" rdma-device-plugin topology --json "${discovery_args[@]}" --log-level off 2>>"$work/topology.log") ||
    fail "$mode: topology --json failed inside"
  outside=$("$binary" topology --json "${host_args[@]}" --log-level off 2>>"$work/topology.log")
  [[ $inside == "$outside" ]] || { diff <(echo "$inside") <(echo "$outside") | head -20; fail "$mode: topology --json inside differs"; }
  sec=(); for ((i = 0; i < ${#run_args[@]}; i++)); do
    [[ ${run_args[i]} == "$image" ]] && break
    sec+=("${run_args[i]}")
  done
  inside=$(run_once "${sec[@]}" -v "$repo/test/data/dgx-h100-like.xml:/etc/rdp/node.xml:ro" \
           "$image" topology --json --topology-xml=/etc/rdp/node.xml "${discovery_args[@]}" --log-level off 2>>"$work/topology.log") ||
    fail "$mode: topology --json --topology-xml failed inside"
  outside=$("$binary" topology --json --topology-xml="$repo/test/data/dgx-h100-like.xml" "${host_args[@]}" --log-level off 2>>"$work/topology.log")
  [[ $inside == "$outside" ]] || { diff <(echo "$inside") <(echo "$outside") | head -20; fail "$mode: topology --json --topology-xml inside differs"; }
  say "topology --json: inside == outside, from sysfs and with the XML ($(python3 -c \
      'import json, sys; t = json.load(sys.stdin); print(len(t["hcas"]), "HCAs,", len(t["gpus"]), "GPUs")' <<<"$outside"))"

  # The pod's NRI container, as the chart runs it, with no runtime behind its socket (the NRI
  # runtime side itself drives the binary in ctest nri_runtime): it starts under the same
  # security context, says it waits for the socket, and stops on SIGTERM with exit 0.
  if [[ -f $work/chart/$mode.nri.run ]]; then
    mapfile -d '' nri_args <"$work/chart/$mode.nri.run"
    nri=rdp-image-test-$mode-nri
    pm rm -f -t 0 "$nri" >/dev/null 2>&1 || true
    containers+=("$nri")
    pm run -d --name "$nri" --network=none "${nri_args[@]}" >/dev/null || fail "$mode: podman run (nri) failed"
    found=
    while IFS= read -r -t 60 line; do
      [[ $line == *"waiting for the runtime's NRI socket"* ]] && { found=$line; break; }
    done < <(timeout 60 podman --runtime runc logs -f "$nri" 2>&1)
    [[ -n $found ]] || { pm logs "$nri" 2>&1 | tail -10; fail "$mode: the NRI container did not say it waits for the socket"; }
    status=$(pm exec "$nri" cat /proc/1/status)
    for want in 'CapEff:	0000000000000000' 'NoNewPrivs:	1' 'Seccomp:	2'; do
      grep -qF "$want" <<<"$status" || fail "$mode: the NRI container's /proc/1/status lacks '$want'"
    done
    pm stop --time 30 "$nri" >/dev/null
    code=$(pm inspect --format '{{.State.ExitCode}}' "$nri")
    [[ $code == 0 ]] || fail "$mode: the NRI container exited $code after SIGTERM"
    say "nri: waits for $nri_socket, no capabilities, exit 0 on SIGTERM"
    pm rm "$nri" >/dev/null
  fi

  # SIGTERM, as the kubelet stops a pod: exit 0, socket gone.
  pm stop --time 60 "$name" >/dev/null
  code=$(pm inspect --format '{{.State.ExitCode}}' "$name")
  logs=$(pm logs "$name" 2>&1)
  [[ $code == 0 ]] || { tail -20 <<<"$logs"; fail "$mode: exit code $code after SIGTERM"; }
  grep -q 'SIGTERM received: stopping' <<<"$logs" || fail "$mode: no 'SIGTERM received' in the log"
  wait_socket "$plugin_dir/$socket" gone 10 || fail "$mode: $socket still there after exit"
  say "SIGTERM: exit 0, $socket removed"
  pm rm "$name" >/dev/null
  kill "$standin_pid"
  wait "$standin_pid" || fail "$mode: the kubelet stand-in exited $?"
  standin_pid=
  exec 8<&-
done
phase "run as the chart runs it"
say "passed in $(($(date +%s) - t_start)) s (image $((size / 1000000)) MB)"
