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
#     the chart's liveness probe (GET /livez, or the `probe` command) answers; the process runs
#     with no capabilities, no new privileges and a read-only root; `topology --json` inside
#     equals the host-built binary's; SIGTERM (podman stop) ends it with exit 0 and its socket
#     removed;
#  5. the linux/arm64 image (built by scripts/build-image.sh --arm64 with the amd64 one: the
#     same Dockerfile, `--platform linux/arm64 --target runtime-copied`, on an arm64
#     bookworm-slim made with `debootstrap --arch arm64 --foreign`): its `rdma-device-plugin
#     --version` and `topology --json` on the GB200 fixture run in it under qemu-aarch64-static
#     and equal the host binary's; both images in one manifest list (podman manifest inspect
#     printed).
# Exit 0 passed, 1 failed, 77 skipped (not root, podman/runc/debootstrap missing after
# scripts/install-deps.sh, no helm at --helm, or podman unable to run: the reason is printed). Every wait has a deadline; nothing sleeps for a
# fixed time to synchronise.
#
#   scripts/image-test.sh [--build-dir DIR] [--binary PATH] [--standin PATH] [--helm PATH]
#                         [--work DIR] [--image NAME]
# Defaults from the build directory (${BUILD_DIR:-build}): its cmd/rdma-device-plugin (with
# rdma-device-plugin-sim beside it) and test/image/image_kubelet_standin (built when missing), helm as scripts/lib/helm.sh finds or
# fetches it, and image-test/. The Debian packages it needs are installed when missing.
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
given_binary=$binary given_standin=$standin
binary=${binary:-$build/cmd/rdma-device-plugin}
standin=${standin:-$build/test/image/image_kubelet_standin}
work=${work:-$build/image-test}

# shellcheck source=scripts/lib/log.sh
source scripts/lib/log.sh image-test
# shellcheck source=scripts/lib/helm.sh
source scripts/lib/helm.sh

# --- Preconditions ----------------------------------------------------------------------------
# What a person running it alone lacks is set up here: the Debian packages, helm, and the two
# programs when their default paths are missing. ctest gives every path, so there only the
# package check runs (and finds them installed by the test command).
[[ $(id -u) -eq 0 ]] || skip "needs root: rootful podman, bind-mounted sockets in root-owned directories as on a node"
scripts/install-deps.sh || fail "scripts/install-deps.sh failed"
for tool in podman runc debootstrap python3 qemu-aarch64-static; do
  command -v "$tool" >/dev/null || skip "$tool not installed after scripts/install-deps.sh"
done
if [[ -z $helm ]]; then helm=$(find_or_fetch_helm "$build") || fail "no helm, and fetching one failed"; fi
[[ -x $helm ]] || skip "no helm at $helm (scripts/get-helm.sh $(dirname "$helm"))"
# `fixture` runs rdma-device-plugin-sim from the plugin's directory.
if [[ -z $given_binary && ! ( -x $binary && -x $binary-sim ) || -z $given_standin && ! -x $standin ]]; then
  say "building the plugin, rdma-device-plugin-sim and the kubelet stand-in in $build (scripts/build.sh)"
  BUILD_DIR=$build RDP_BUILD_TARGETS="rdma-device-plugin rdma-device-plugin-sim image_kubelet_standin" \
    scripts/build.sh -DBUILD_TESTING=ON
fi
[[ -x $binary ]] || fail "no plugin binary at $binary"
[[ -x $standin ]] || fail "no kubelet stand-in at $standin"
binary=$(realpath "$binary") standin=$(realpath "$standin") helm=$(realpath "$helm")
mkdir -p "$work"
work=$(realpath "$work")

# One run at a time on a machine: the image tag and the base images are shared.
exec 9>/var/tmp/rdp-image-test.lock
flock -w 3600 9 || fail "another image-test.sh held /var/tmp/rdp-image-test.lock for an hour"

# podman as scripts/build-image.sh runs it (scripts/podman-env.sh).
# shellcheck source=scripts/podman-env.sh
source scripts/podman-env.sh
podman_env "$work" || skip "podman cannot run here: $podman_error"

containers=() standin_pid= scratch=
cleanup() {
  local c
  [[ -z $scratch ]] || rm -rf "$scratch"
  for c in "${containers[@]}"; do pm rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  if [[ -n $standin_pid ]]; then kill "$standin_pid" 2>/dev/null || true; wait "$standin_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

# --- 1, 2. Base images and the image, from the Dockerfile unchanged (scripts/build-image.sh) --
RDP_IMAGE_LOCK_HELD=1 scripts/build-image.sh --arm64 --image "$image" --work "$work" || {
  rc=$?
  ((rc == 77)) && skip "scripts/build-image.sh cannot run here"
  fail "scripts/build-image.sh failed"
}
version=$(cat VERSION)
slim=docker.io/library/debian:bookworm-slim
id=$(pm image inspect --format '{{.Id}}' "$image")
image_arm64=${image%:*}:${image##*:}-arm64 list=${image%:*}:${image##*:}-multiarch
phase "base images and image builds (amd64, arm64)"

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
rm -rf "$node" "$kubelet" "$work/chart" "$work/allocations"
"$binary" fixture --topology-xml test/data/dgx-h100-like.xml --out "$node" --log-level warn >/dev/null
mkdir -p "$node/proc/driver" "$kubelet/device-plugins" "$kubelet/pod-resources" "$work/allocations"
hcas=$("$binary" topology --json --sysfs-root "$node" --dev-root "$node" --log-level off 2>/dev/null |
       python3 -c 'import json, sys; print(len(json.load(sys.stdin)["hcas"]))')
"$helm" template rdp charts/rdma-device-plugin --namespace kube-system \
    --set image.repository="${image%:*}" --set image.tag="${image##*:}" >"$work/chart.yaml"
modes=$(python3 test/image/chart_run.py --image "$image" --out "$work/chart" \
    --host-path "/var/lib/kubelet/device-plugins=$kubelet/device-plugins" \
    --host-path "/var/lib/kubelet/pod-resources=$kubelet/pod-resources" \
    --host-path "/sys=$node/sys" --host-path "/dev=$node/dev" \
    --host-path "/proc/driver=$node/proc/driver" --host-path "/var/run/nri=$work/nri" \
    --host-path "/var/run/rdma-device-plugin/allocations=$work/allocations" \
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

  # The chart's liveness probe: its command inside, or its GET in the container's network
  # namespace as the kubelet sends it.
  if [[ ${probe[0]} == exec ]]; then
    out=$(pm exec "$name" "${probe[@]:1}" 2>&1) || fail "$mode: probe failed: $out"
  else
    pid=$(pm inspect -f '{{.State.Pid}}' "$name")
    out=$(nsenter -t "$pid" -n curl -sS --fail-with-body --max-time 5 "${probe[1]}" 2>&1) ||
      fail "$mode: probe GET ${probe[1]} failed: $out"
  fi
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

# --- 5. linux/arm64, and the manifest list ----------------------------------------------------
# The arm64 image's program runs only under qemu-aarch64-static (a static amd64 program, mounted
# and given as the entrypoint) inside the image's own root filesystem.
qemu=$(command -v qemu-aarch64-static)
under_qemu() {
  pm run --rm --network=none "${ulimits[@]}" --user 0:0 --read-only --cap-drop ALL \
    -v "$qemu:/usr/libexec/qemu-aarch64-static:ro" --entrypoint /usr/libexec/qemu-aarch64-static \
    "$@"
}
got=$(under_qemu "$image_arm64" /usr/bin/rdma-device-plugin --version 2>"$work/arm64.log") ||
  { cat "$work/arm64.log"; fail "$image_arm64: rdma-device-plugin --version failed under qemu"; }
[[ $got == "rdma-device-plugin $version" ]] || fail "$image_arm64 --version said '$got'"
grace=$work/grace
rm -rf "$grace"
"$binary" fixture --topology-xml test/data/gb200-tray.xml --out "$grace" --log-level warn >/dev/null
cp test/data/gb200-tray.xml "$grace/node.xml"
hosted() {  # $@: flags naming /node/...; the same flags naming the fixture on the host
  local a
  for a in "$@"; do echo "${a/=\/node/=$grace}"; done
}
for args in "--topology-xml=/node/node.xml" "--topology-xml=/node/node.xml --sysfs-root=/node --dev-root=/node"; do
  read -r -a a <<<"$args"
  inside=$(under_qemu -v "$grace/sys:/node/sys:ro" -v "$grace/dev:/node/dev:ro" \
           -v "$grace/node.xml:/node/node.xml:ro" "$image_arm64" \
           /usr/bin/rdma-device-plugin topology --json "${a[@]}" --log-level off 2>>"$work/arm64.log") ||
    { tail "$work/arm64.log"; fail "$image_arm64: topology --json $args failed under qemu"; }
  mapfile -t h < <(hosted "${a[@]}")
  outside=$("$binary" topology --json "${h[@]}" --log-level off)
  [[ $inside == "$outside" ]] ||
    { diff <(echo "$outside") <(echo "$inside") | head -20; fail "arm64 image: topology --json $args differs"; }
done
if under_qemu "$image_arm64" /usr/bin/rdma-device-plugin topology --topology-xml /dev/null \
     --log-level off >/dev/null 2>&1; then
  fail "arm64 image: topology on an empty XML did not fail (the comparisons above could not either)"
fi
say "arm64 image $image_arm64: '$got'; topology --json on the GB200 fixture (XML, and sysfs + XML)" \
    "under qemu equals the host's"

pm manifest inspect "$list" >"$work/manifest.json"
platforms=$(python3 -c 'import json, sys; print(" ".join(sorted(m["platform"]["os"] + "/" + m["platform"]["architecture"] for m in json.load(sys.stdin)["manifests"])))' <"$work/manifest.json")
[[ $platforms == "linux/amd64 linux/arm64" ]] || { cat "$work/manifest.json"; fail "manifest list $list: platforms '$platforms'"; }
cat "$work/manifest.json"
say "manifest list $list: $platforms"
phase "arm64 image and manifest list"
say "passed in $(elapsed) s (image $((size / 1000000)) MB)"
