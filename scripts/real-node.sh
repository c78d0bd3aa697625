#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine (docs/real-node.md): the harness's control
# plane (test/kubelet/controlplane: kube-apiserver on an embedded etcd, scheduler, DaemonSet,
# garbage-collector and service-account controllers) as a process, containerd with Debian's runc,
# and the kubelet binary joined to it as a real node, all built from the Go module proxy at the
# versions test/kubelet/go.mod pins; the project's image (built from the Dockerfile with podman)
# and the chart installed with helm, its DaemonSet running on that kubelet.
#
#   scripts/real-node.sh up [--node DIR | --named-node NAME] [--driver deviceplugin|dra]
#                           [--mode shared|exclusive] [--nri] [--values FILE]...
#   scripts/real-node.sh kubectl ARGS...        a kubectl of the same version against it
#   scripts/real-node.sh down                   stop everything it started (also after a failed run)
#   scripts/real-node.sh restart kubelet|containerd
#   scripts/real-node.sh reboot                 the node's processes stopped, its /run and the
#                                               kubelet's pod state wiped, started again
#   scripts/real-node.sh ns CMD...              run CMD in the node's mount namespace
#   scripts/real-node.sh build                  only build the binaries and images
#
# up: --node DIR is a node laid out as `rdma-device-plugin fixture --out` lays it out (sys/, dev/,
# optional proc/) plus DIR/topology.xml; --named-node NAME is a node the binary lays out by name
# (`rdma-device-plugin fixture --node NAME`, e.g. dgx-roles); default the bundled DGX-H100-like
# node. --driver and --mode (default deviceplugin, exclusive) choose the chart's driver and the
# node's label. --values FILE (repeatable, a path relative to the caller's directory) is a YAML
# file of chart values given to helm install (-f), e.g. rdmaResources; the values the script sets
# itself (image, driver, host paths, ports, health interval, NRI) take precedence. --nri
# (or RDP_REAL_NODE_NRI=1) enables containerd's NRI with its socket at
# build/real-node/run/nri/nri.sock. It returns when the node's allocatable shows rdma/hca (device
# plugin) or its ResourceSlices are published (DRA), and prints the kubeconfig's path,
# build/real-node/kubeconfig. Before anything starts, up (and build) installs the Debian packages
# it runs that are missing (scripts/install-deps.sh), and up fetches helm when none is found
# (scripts/get-helm.sh into <build>/tools/bin) and builds <build>/cmd/rdma-device-plugin and
# rdma-device-plugin-sim when they are missing (scripts/build.sh; they lay out the bundled node).
#
# The node writes nothing outside the build directory: containerd and the kubelet run in one private
# mount namespace with tmpfs over /var/lib (the build's kubelet directory bind-mounted on
# /var/lib/kubelet), /var/log, /run, /tmp and /dev (a copy of the host's, with the node's
# dev/infiniband as character devices), and the sysctls the kubelet sets bind-mounted from files
# that already hold its values. Pods' cgroups live under a cgroup root of this build directory's
# own, removed at down. The control plane runs in a namespace of its own (a tmpfs /tmp).
#
# Exit: 0; 1 on failure (a second up while one runs says so); 2 on a bad flag (named); 77 when this
# machine cannot run it (not root, no Go >= 1.26, a tool missing after install-deps.sh).
# Environment: BUILD_DIR (default build), RDP_HELM (the helm to use; else <build>/tools/bin/helm,
# then helm on PATH, then the one scripts/get-helm.sh fetches), RDP_REAL_NODE_HEALTH_INTERVAL (the
# chart's healthInterval, default 1s; set and empty: the chart's own default).
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."
repo=$PWD
build=${BUILD_DIR:-build}
mkdir -p "$build/real-node"
build=$(cd "$build" && pwd)
top=$build/real-node
bin=$top/bin
images=$top/images
run=$top/run
kubeconfig=$top/kubeconfig
harness=$repo/test/kubelet

readonly node_name=rdp-real-node
readonly containerd_version=v2.4.2
readonly pause_image=localhost/rdp-pause:1
readonly workload_image=localhost/rdp-workload:1
# Our image under a tag of this build directory's own (podman's images are the machine's); with
# image-test.sh's build of the same sources, every layer is shared.
rdp_image=localhost/rdma-device-plugin:real-node-$(echo "$build" | sha256sum | cut -c1-8)
readonly release=rdp
readonly namespace=kube-system
readonly dra_driver=rdma.network.alibabacloud.com
readonly rdma_label=feature.node.kubernetes.io/pci-15b3.present
readonly exclusive_label=rdma.network.alibabacloud.com/exclusive
# The values the kubelet sets these sysctls to (pkg/kubelet/cm/container_manager_linux.go
# setupKernelTunables); inside the namespace, files holding them are mounted over /proc/sys.
readonly kubelet_sysctls="vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000"

# shellcheck source=scripts/lib/helm.sh
source scripts/lib/helm.sh
say() { echo "real-node: $*"; }
fail() { echo "real-node: FAILED: $*" >&2; exit 1; }
usage_error() { echo "real-node: $*" >&2; echo "usage: $0 up [--node DIR | --named-node NAME] [--driver deviceplugin|dra] [--mode shared|exclusive] [--nri] [--values FILE]... | kubectl ARGS... | down | restart kubelet|containerd | reboot | ns CMD... | build" >&2; exit 2; }
skip() { echo "real-node: SKIPPED: $*"; exit 77; }
now_ms() { date +%s%3N; }
# RDP_REAL_NODE_TRACE=1: when each step of a teardown ended.
trace() { [[ ${RDP_REAL_NODE_TRACE:-0} == 0 ]] || echo "real-node: $(date +%T.%3N) $*" >&2; }

# Waits until "$@" succeeds, at most $1 seconds; $2 names what is awaited.
wait_for() {
  local timeout=$1 what=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { say "timed out after ${timeout}s waiting for $what"; return 1; }
    sleep 0.2
  done
}

alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }
pid_of() { cat "$run/pids/$1" 2>/dev/null || true; }
# The node's mount namespace is held by a process of ours; every node process is started in it.
holder() { pid_of holder; }
in_ns() { nsenter -t "$(holder)" -m -- "$@"; }

preconditions() {
  [[ $(id -u) == 0 ]] || skip "needs root (mount namespaces, cgroups, containerd)"
  # The Debian packages it runs (podman, runc, debootstrap, ...): only those missing.
  scripts/install-deps.sh >&2 || fail "scripts/install-deps.sh failed"
  local tool
  for tool in go unshare nsenter runc podman gcc dpkg-deb apt-get python3; do
    command -v "$tool" >/dev/null && continue
    [[ $tool == go ]] && skip "go not found: needs Go >= 1.26 (https://go.dev/dl; Debian 12's is older)"
    skip "$tool not found after scripts/install-deps.sh"
  done
  local version minor
  version=$(go env GOVERSION)
  minor=${version#go1.}; minor=${minor%%.*}
  [[ $version == go1.* && $minor =~ ^[0-9]+$ && $minor -ge 26 ]] || skip "$version is older than Go 1.26"
  [[ -f /sys/fs/cgroup/cpu/cgroup.procs || -f /sys/fs/cgroup/cgroup.controllers ]] || skip "no cgroup filesystem"
}

# A TCP port the kernel has free now: the chart's pods run with hostNetwork here, so a fixed
# metrics port (the plugin's, the NRI container's) would collide with another node's or with the
# other mode's pod during a relabel.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The helm that installs the chart (scripts/lib/helm.sh: found, else fetched).
helm=
ensure_helm() {
  helm=$(find_or_fetch_helm "$build") || fail "no helm, and scripts/get-helm.sh $build/tools/bin failed"
}

# --- Binaries (cached: rebuilt when a version or a source changes) ----------------------------
k8s_version() { (cd "$harness" && go list -m -f '{{.Version}}' k8s.io/kubernetes); }

build_binaries() {
  mkdir -p "$bin"
  local k8s minor ldflags stamp want
  k8s=$(k8s_version)
  minor=${k8s#v1.}; minor=${minor%%.*}
  ldflags="-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  local cp_sources
  cp_sources=$(cat "$harness/go.mod" "$harness/go.sum" "$harness"/controlplane/controlplane.go \
               "$harness"/realnode/controlplane/*.go | sha256sum | cut -c1-16)
  local pause_src=$harness/realnode/image/pause.c
  declare -A want_stamp=(
    [kubelet]="$k8s $(go env GOVERSION)"
    [kubectl]="$k8s $(go env GOVERSION)"
    [containerd]="$containerd_version $(go env GOVERSION)"
    [controlplane]="$k8s $(go env GOVERSION) $cp_sources"
    [pause]="$(sha256sum "$pause_src" | cut -c1-16)"
  )
  local name
  for name in kubelet kubectl containerd controlplane pause; do
    stamp=$bin/.$name.stamp
    want=${want_stamp[$name]}
    [[ -f $stamp && $(cat "$stamp") == "$want" ]] && continue
    local t0=$SECONDS
    say "building $name ($want)"
    case $name in
      kubelet | kubectl)
        (cd "$harness" && go build -ldflags "$ldflags" -o "$bin/$name" "k8s.io/kubernetes/cmd/$name") ;;
      containerd)
        GOBIN=$bin go install "github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
          "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version" \
          "github.com/containerd/containerd/v2/cmd/ctr@$containerd_version" ;;
      controlplane)
        (cd "$harness" && go build -ldflags "$ldflags" -o "$bin/controlplane" ./realnode/controlplane) ;;
      pause)
        gcc -static -O2 -o "$bin/pause" "$pause_src" ;;
    esac
    echo "$want" >"$stamp"
    say "built $name in $((SECONDS - t0)) s"
  done
}

# --- Images (no registry): OCI archives imported into containerd ------------------------------
# Writes an OCI image layout archive $1 named $2 from the rootfs directory $3 with the
# entrypoint $4 (a JSON array), by hand: one layer, its config, manifest and index.
oci_archive() {
  local out=$1 name=$2 rootfs=$3 entrypoint=$4
  local d
  d=$(mktemp -d "$images/oci.XXXXXX")
  mkdir -p "$d/blobs/sha256"
  tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$rootfs" -cf "$d/layer.tar" .
  local layer layer_size config config_size manifest manifest_size
  layer=$(sha256sum "$d/layer.tar" | cut -d' ' -f1)
  layer_size=$(stat -c %s "$d/layer.tar")
  mv "$d/layer.tar" "$d/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"Env":["PATH=/bin:/usr/bin:/sbin:/usr/sbin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$entrypoint" "$layer" >"$d/config.json"
  config=$(sha256sum "$d/config.json" | cut -d' ' -f1)
  config_size=$(stat -c %s "$d/config.json")
  mv "$d/config.json" "$d/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$d/manifest.json"
  manifest=$(sha256sum "$d/manifest.json" | cut -d' ' -f1)
  manifest_size=$(stat -c %s "$d/manifest.json")
  mv "$d/manifest.json" "$d/blobs/sha256/$manifest"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$name" "${name##*:}" >"$d/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$d/oci-layout"
  tar -C "$d" -cf "$out.tmp" oci-layout index.json blobs
  mv "$out.tmp" "$out"
  rm -rf "$d"
}

build_images() {
  mkdir -p "$images"
  # The sandbox image: the static pause.
  if [[ ! -f $images/pause.tar || $images/pause.tar -ot $bin/pause ]]; then
    local r
    r=$(mktemp -d "$images/rootfs.XXXXXX")
    install -m 0755 "$bin/pause" "$r/pause"
    oci_archive "$images/pause.tar" "$pause_image" "$r" '["/pause"]'
    rm -rf "$r"
  fi
  # The workload image: Debian's busybox-static, a POSIX shell and the tools the tests use.
  if [[ ! -f $images/workload.tar ]]; then
    local d
    d=$(mktemp -d "$images/busybox.XXXXXX")
    # Downloaded, not installed; on a machine whose package lists lack it, after apt-get update.
    if ! (cd "$d" && apt-get download busybox-static >/dev/null 2>"$d/apt.err"); then
      apt-get -o DPkg::Lock::Timeout=900 update -qq >/dev/null 2>&1 || true
      (cd "$d" && apt-get download busybox-static >/dev/null 2>"$d/apt.err") ||
        { cat "$d/apt.err" >&2; fail "apt-get download busybox-static"; }
    fi
    dpkg-deb -x "$d"/busybox-static_*.deb "$d/x"
    mkdir -p "$d/rootfs/bin" "$d/rootfs/tmp" "$d/rootfs/dev" "$d/rootfs/proc" "$d/rootfs/sys" "$d/rootfs/etc"
    install -m 0755 "$d/x/bin/busybox" "$d/rootfs/bin/busybox"
    local applet
    for applet in $("$d/rootfs/bin/busybox" --list); do
      [[ $applet == busybox ]] || ln -s busybox "$d/rootfs/bin/$applet"
    done
    echo 'root:x:0:0:root:/:/bin/sh' >"$d/rootfs/etc/passwd"
    echo 'root:x:0:' >"$d/rootfs/etc/group"
    chmod 1777 "$d/rootfs/tmp"
    oci_archive "$images/workload.tar" "$workload_image" "$d/rootfs" '["/bin/sh"]'
    rm -rf "$d"
  fi
  # The project's image from the Dockerfile (scripts/build-image.sh, the build step of
  # scripts/image-test.sh: with the sources unchanged podman reuses every layer of its build).
  # Built again only when what the image is built from changed (a hash of the context's files
  # less the tests, benchmarks, scripts and prose the Dockerfile's build leaves out: BUILD_TESTING
  # and RDP_BUILD_BENCHMARKS off, only install-deps.sh run), so that up does not wait on the machine's image-build lock for
  # nothing.
  local context id
  context=$(git ls-files -co --exclude-standard -- . ':!docs' ':!charts' ':!build*' ':!test' \
            ':!bench' ':!*.md' ':!scripts' scripts/install-deps.sh | sort |
            xargs -d '\n' sha256sum 2>/dev/null | sha256sum | cut -c1-16)
  id=$(podman --runtime runc image inspect --format '{{.Id}}' "$rdp_image" 2>/dev/null || true)
  if [[ -z $id || $(cat "$images/rdp.context" 2>/dev/null) != "$context $id" ]]; then
    say "building $rdp_image (scripts/build-image.sh)"
    scripts/build-image.sh --image "$rdp_image" --work "$build/image-test" >"$images/rdp-build.log" 2>&1 ||
      { tail -20 "$images/rdp-build.log" >&2; fail "building $rdp_image (log: $images/rdp-build.log)"; }
    id=$(podman --runtime runc image inspect --format '{{.Id}}' "$rdp_image")
    echo "$context $id" >"$images/rdp.context"
  fi
  if [[ ! -f $images/rdp.tar || $(cat "$images/rdp.id" 2>/dev/null) != "$id" ]]; then
    rm -f "$images/rdp.tar"
    podman --runtime runc save --format oci-archive -o "$images/rdp.tar" "$rdp_image" >"$images/rdp-save.log" 2>&1 ||
      { cat "$images/rdp-save.log" >&2; fail "podman save $rdp_image"; }
    echo "$id" >"$images/rdp.id"
  fi
}

# A tmpfs over /tmp (in a mount namespace of our own) that keeps the checkout and the build
# where they are when they live under /tmp, as CI clones often do: else the binaries, configs and
# run directory under them vanish behind the tmpfs ("exec: .../controlplane: not found"). Each is
# opened before the mount and bound back from its descriptor after it; --no-canonicalize, since
# mount would resolve /proc/self/fd/N to the path the tmpfs now covers.
private_tmp() {
  local keep=() fds=() p fd i
  for p in "$repo" "$build"; do
    [[ $p/ == /tmp/* ]] || continue
    [[ ${#keep[@]} -gt 0 && $p/ == "${keep[0]}"/* ]] && continue  # the build inside the checkout
    exec {fd}<"$p"
    keep+=("$p") fds+=("$fd")
  done
  mount -t tmpfs -o mode=1777 tmpfs /tmp
  for i in "${!keep[@]}"; do
    mkdir -p "${keep[$i]}"
    mount --no-canonicalize --bind "/proc/self/fd/${fds[$i]}" "${keep[$i]}"
    fd=${fds[$i]}
    exec {fd}<&-
  done
}

# The control plane's mount namespace: its pid (it execs the control plane) in PIDFILE, the
# private /tmp, then CMD.
cp_ns() {
  echo $$ >"$1"
  shift
  private_tmp
  exec "$@"
}

# --- The node's mount namespace ----------------------------------------------------------------
# Run by `unshare -m --propagation private` (as `real-node.sh __ns RUN NODE`): the mounts, then
# the ready mark, then it holds the namespace until killed.
ns_setup() {
  local run=$1 node=$2
  mount -t tmpfs -o mode=0755 tmpfs /var/lib
  mkdir -p /var/lib/kubelet
  mount --bind "$run/kubelet" /var/lib/kubelet
  mount -t tmpfs -o mode=0755 tmpfs /var/log
  mount -t tmpfs -o mode=0755 tmpfs /run
  mkdir -p /run/cdi /run/lock
  private_tmp
  # /dev: a copy of the host's (device nodes, symlinks), its pts, shm and mqueue moved across,
  # and the node's dev/infiniband as character devices.
  mkdir /tmp/dev
  mount -t tmpfs -o mode=0755 tmpfs /tmp/dev
  local e
  for e in /dev/* /dev/.[!.]*; do
    [[ -e $e || -L $e ]] || continue
    case ${e#/dev/} in pts | shm | mqueue | hugepages | infiniband) continue ;; esac
    cp -a "$e" /tmp/dev/ 2>/dev/null || true
  done
  for e in pts shm mqueue; do
    mkdir -p "/tmp/dev/$e"
    if mountpoint -q "/dev/$e"; then mount --move "/dev/$e" "/tmp/dev/$e"; fi
  done
  mount --move /tmp/dev /dev
  mkdir -p /dev/infiniband
  local f name devfile
  for f in "$node"/dev/infiniband/*; do
    name=$(basename "$f")
    devfile=
    for class in infiniband_verbs infiniband_mad misc; do
      [[ -f $node/sys/class/$class/$name/dev ]] && devfile=$node/sys/class/$class/$name/dev
    done
    [[ -n $devfile ]] || { echo "no sysfs dev file for $f" >&2; exit 1; }
    IFS=: read -r major minor <"$devfile"
    mknod -m 0666 "/dev/infiniband/$name" c "$major" "$minor"
  done
  # The kubelet's sysctls: files already holding its values.
  mkdir -p "$run/sysctl"
  local kv key value
  for kv in $kubelet_sysctls; do
    key=${kv%%=*} value=${kv#*=}
    echo "$value" >"$run/sysctl/${key//\//.}"
    mount --bind "$run/sysctl/${key//\//.}" "/proc/sys/$key"
  done
  touch "$run/ns-ready"
  exec sleep infinity
}

# --- Configuration files ------------------------------------------------------------------------
write_containerd_config() {
  local nri_disable=true
  [[ $nri == 1 ]] && nri_disable=false
  mkdir -p "$run/containerd" "$run/cni/net.d" "$run/nri/plugins" "$run/nri/conf.d"
  cat >"$run/containerd.toml" <<EOF
# Written by scripts/real-node.sh: every path under $run or the namespace's tmpfs /run.
version = 3
root = "$run/containerd/root"
state = "/run/containerd"
temp = "/tmp"
[grpc]
  address = "$run/containerd/containerd.sock"
[ttrpc]
  address = "$run/containerd/containerd.sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$run/containerd/opt"
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "/run/containerd/s"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$pause_image"
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ["/var/run/cdi"]
  # No CAP_SYS_RESOURCE in this machine's bounding set, no AppArmor for us.
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "/run/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$bin/cni"]
    conf_dir = "$run/cni/net.d"
[plugins.'io.containerd.nri.v1.nri']
  disable = $nri_disable
  socket_path = "$run/nri/nri.sock"
  plugin_path = "$run/nri/plugins"
  plugin_config_path = "$run/nri/conf.d"
EOF
  # No pod network on this node (pods use hostNetwork): the runtime reports NetworkReady once a
  # network configuration is loaded; this one is only the loopback.
  cat >"$run/cni/net.d/10-loopback.conflist" <<'EOF'
{"cniVersion": "1.0.0", "name": "rdp-real-node-lo", "plugins": [{"type": "loopback"}]}
EOF
}

cgroup_root() { echo "rdp-real-node-$(echo "$build" | sha256sum | cut -c1-8)"; }

# The cgroup v1 hierarchies (and the unified one) the kubelet uses.
cgroup_mounts() {
  awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts
}

write_kubelet_config() {
  mkdir -p "$run/kubelet" "$run/manifests"
  local port healthz
  read -r port healthz < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
  cat >"$run/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $port
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $run/cp/pki/ca.crt}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: /$(cgroup_root)
failCgroupV1: false
failSwapOn: false
resolvConf: ""
staticPodPath: $run/manifests
fileCheckFrequency: 1s
syncFrequency: 5s
nodeStatusUpdateFrequency: 2s
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
containerRuntimeEndpoint: unix://$run/containerd/containerd.sock
EOF
}

# --- Processes ------------------------------------------------------------------------------------
# start NAME CMD...: in the node's namespace, output to logs/NAME.log, its PID (written by the
# shell that then becomes CMD) in pids/NAME.
start() {
  local name=$1
  shift
  rm -f "$run/pids/$name"
  nsenter -t "$(holder)" -m -- sh -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' "$run/pids/$name" "$@" \
    >>"$run/logs/$name.log" 2>&1 </dev/null 9>&- &
  wait_for 10 "$name's PID" test -s "$run/pids/$name" || fail "$name did not start (log: $run/logs/$name.log)"
}

# With --nri, containerd (and so every container) starts with a soft locked-memory limit below
# its hard one, and the chart's NRI plugin raises it to the hard one for the containers holding
# an HCA (nri.memlock): a container without an HCA shows the runtime's limit, one with an HCA the
# plugin's. The hard limit stays the machine's: raising it needs CAP_SYS_RESOURCE, which a
# sandbox may not grant (this machine's bounding set has none), and runc then fails every
# container the plugin adjusts above it ("error setting rlimits ... rlimit type 8: operation not
# permitted"). Prints "SOFT HARD" in bytes ("unlimited" for none).
memlock_plan() {
  local hard
  hard=$(ulimit -Hl)
  if [[ $hard == unlimited ]]; then
    echo "$((64 << 20)) unlimited"
  else
    echo "$((hard * 1024 / 2)) $((hard * 1024))"
  fi
}

# A key of $run/config ("" when absent).
config_value() { tr ' ' '\n' <"$run/config" | sed -n "s/^$1=//p"; }

start_containerd() {
  local limits=() soft hard
  soft=$(config_value memlock_soft)
  hard=$(config_value memlock_hard)
  [[ -n $soft ]] && limits=(prlimit --memlock="$soft:$hard" --)
  start containerd "${limits[@]}" "$bin/containerd" --config "$run/containerd.toml"
  wait_for 30 "containerd's socket" test -S "$run/containerd/containerd.sock" || fail "containerd did not start (log: $run/logs/containerd.log)"
  wait_for 30 "containerd's CRI" in_ns "$bin/ctr" --address "$run/containerd/containerd.sock" -n k8s.io version ||
    fail "containerd does not answer"
}

ctr_() { in_ns "$bin/ctr" --address "$run/containerd/containerd.sock" -n k8s.io "$@"; }

import_images() {
  local tar
  for tar in pause workload rdp; do
    ctr_ images import --no-unpack "$images/$tar.tar" >>"$run/logs/import.log" 2>&1 ||
      fail "importing $tar.tar (log: $run/logs/import.log)"
  done
  # The chart's image as podman names it (localhost/...), for pods with imagePullPolicy: Never.
}

start_kubelet() {
  start kubelet "$bin/kubelet" --config "$run/kubelet.yaml" \
    --kubeconfig "$run/cp/kubelet.kubeconfig" --hostname-override "$node_name" \
    --cloud-provider external --v 3
}

start_controlplane() {
  mkdir -p "$run/cp"
  # Its own namespace: the API server's and etcd's temporary files land in a tmpfs /tmp.
  unshare -m --propagation private -- "$repo/scripts/real-node.sh" __cpns \
    "$run/pids/controlplane" "$bin/controlplane" --dir "$run/cp" --kubeconfig "$kubeconfig" \
    --node-name "$node_name" >>"$run/logs/controlplane.log" 2>&1 </dev/null 9>&- &
}

kubectl_() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

node_ready() {
  [[ $(kubectl_ get node "$node_name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
node_untainted() {
  [[ -z $(kubectl_ get node "$node_name" -o jsonpath='{.spec.taints}' 2>/dev/null) ]]
}
allocatable_hca() {
  local a
  a=$(kubectl_ get node "$node_name" -o jsonpath='{.status.allocatable.rdma/hca}' 2>/dev/null)
  [[ -n $a && $a != 0 ]]
}
slices_published() {
  [[ -n $(kubectl_ get resourceslices -o jsonpath="{.items[?(@.spec.driver==\"$dra_driver\")].metadata.name}" 2>/dev/null) ]]
}

# Starts the node's processes: the namespace, containerd, images, kubelet.
start_node() {
  rm -f "$run/ns-ready"
  unshare -m --propagation private -- "$repo/scripts/real-node.sh" __ns "$run" "$run/node" \
    >>"$run/logs/ns.log" 2>&1 </dev/null 9>&- &
  echo $! >"$run/pids/holder"
  wait_for 20 "the node's namespace" test -f "$run/ns-ready" || fail "namespace setup failed (log: $run/logs/ns.log)"
  readlink "/proc/$(holder)/ns/mnt" >"$run/mntns"
  local c
  for c in $(cgroup_mounts); do mkdir -p "$c/$(cgroup_root)"; done
  write_containerd_config
  start_containerd
  trace "containerd up"
  import_images
  trace "images imported"
  [[ -f $run/kubelet.yaml ]] || write_kubelet_config
  start_kubelet
}

install_chart() {
  local args=(--namespace "$namespace" --set image.repository="${rdp_image%:*}"
    --set image.tag="${rdp_image##*:}" --set image.pullPolicy=Never --set driver="$driver"
    --set hostPaths.sys="$run/node/sys"
    --set-json "extraArgs=[\"--topology-xml=/etc/rdp/node.xml\"]"
    --set metrics.port="$(free_port)" --set nri.metricsPort="$(free_port)")
  # The tests' 1 s health poll sees a removed device within a second; RDP_REAL_NODE_HEALTH_INTERVAL
  # set but empty leaves the chart's default (the benchmark measures the node as users run it).
  local health=${RDP_REAL_NODE_HEALTH_INTERVAL-1s}
  [[ -n $health ]] && args+=(--set healthInterval="$health")
  # With --nri the NRI container connects to the node's containerd (without, it waits for a
  # socket that never comes, and containers are created unadjusted).
  [[ $nri == 1 ]] && args+=(--set nri.socket="$run/nri/nri.sock" --set-string nri.memlock="$(config_value memlock_hard)")
  local f
  for f in "${values_files[@]}"; do args+=(--values "$f"); done
  if [[ -d $run/node/proc/driver ]]; then
    args+=(--set hostPaths.procDriver="$run/node/proc/driver")
  else
    args+=(--set hostPaths.procDriver=)
  fi
  if [[ $driver == dra ]]; then
    # In-cluster access on a node without kube-proxy: the API server's own address.
    local host port
    host=$(sed -E 's|https://([^:]+):.*|\1|' "$run/cp/ready")
    port=$(sed -E 's|.*:([0-9]+)/?$|\1|' "$run/cp/ready")
    args+=(--set-json "extraEnv=[{\"name\":\"KUBERNETES_SERVICE_HOST\",\"value\":\"$host\"},{\"name\":\"KUBERNETES_SERVICE_PORT\",\"value\":\"$port\"}]")
  fi
  # The post-renderer: hostNetwork (no pod network here) and the node's topology.xml mounted at
  # /etc/rdp/node.xml (the chart's extraArgs example).
  RDP_NODE_XML=$run/node/topology.xml KUBECONFIG=$kubeconfig HELM_CACHE_HOME=$top/helm/cache \
    HELM_CONFIG_HOME=$top/helm/config HELM_DATA_HOME=$top/helm/data \
    "$helm" install "$release" charts/rdma-device-plugin "${args[@]}" \
    --post-renderer "$harness/realnode/post-render.py" >>"$run/logs/helm.log" 2>&1 ||
    { tail -20 "$run/logs/helm.log" >&2; fail "helm install (log: $run/logs/helm.log)"; }
}

cmd_up() {
  local node_dir="" named_node="" nri=${RDP_REAL_NODE_NRI:-0} soft hard
  driver=deviceplugin mode=exclusive values_files=()
  while (($#)); do
    case $1 in
      --node) [[ $# -ge 2 ]] || usage_error "--node needs a directory"; node_dir=$2; shift 2 ;;
      --named-node) [[ $# -ge 2 && -n $2 ]] || usage_error "--named-node needs a bundled node's name (e.g. dgx-roles)"; named_node=$2; shift 2 ;;
      --values) [[ $# -ge 2 ]] || usage_error "--values needs a YAML file of chart values"; values_files+=("$2"); shift 2 ;;
      --driver) [[ $# -ge 2 ]] || usage_error "--driver needs deviceplugin or dra"; driver=$2; shift 2 ;;
      --mode) [[ $# -ge 2 ]] || usage_error "--mode needs shared or exclusive"; mode=$2; shift 2 ;;
      --nri) nri=1; shift ;;
      *) usage_error "unknown flag '$1'" ;;
    esac
  done
  [[ $driver == deviceplugin || $driver == dra ]] || usage_error "--driver: '$driver' is not deviceplugin or dra"
  [[ $mode == shared || $mode == exclusive ]] || usage_error "--mode: '$mode' is not shared or exclusive"
  if [[ -n $node_dir ]]; then
    [[ -d $node_dir/sys && -d $node_dir/dev/infiniband ]] || usage_error "--node: $node_dir has no sys/ and dev/infiniband/ (rdma-device-plugin fixture --out lays them out)"
    [[ -f $node_dir/topology.xml ]] || usage_error "--node: $node_dir/topology.xml is missing"
    node_dir=$(cd "$node_dir" && pwd)
  fi
  [[ -n $node_dir && -n $named_node ]] && usage_error "--node and --named-node both given: one node at a time"
  [[ $named_node =~ ^[A-Za-z0-9._-]*$ ]] || usage_error "--named-node: '$named_node' is not a node's name"
  local i
  for i in "${!values_files[@]}"; do
    [[ ${values_files[$i]} == /* ]] || values_files[$i]=$caller_dir/${values_files[$i]}
    [[ -f ${values_files[$i]} && -r ${values_files[$i]} ]] || usage_error "--values: ${values_files[$i]} is not a readable file"
  done
  preconditions
  ensure_helm
  local plugin=$build/cmd/rdma-device-plugin
  # `rdma-device-plugin fixture` lays out the bundled node (it runs rdma-device-plugin-sim from
  # its directory).
  if [[ -z $node_dir && ! ( -x $plugin && -x $plugin-sim ) ]]; then
    say "building $plugin and $plugin-sim (scripts/build.sh)"
    BUILD_DIR=$build RDP_BUILD_TARGETS="rdma-device-plugin rdma-device-plugin-sim" scripts/build.sh \
      >"$top/plugin-build.log" 2>&1 ||
      { tail -20 "$top/plugin-build.log" >&2; fail "building $plugin (log: $top/plugin-build.log)"; }
  fi
  exec 9>"$top/lock"
  flock -n 9 || fail "another real-node.sh up or down is running on $top"
  if alive "$(holder)" || alive "$(pid_of controlplane)"; then
    echo "real-node: already up (build dir $build, node $node_name); run scripts/real-node.sh down first" >&2
    exit 1
  fi
  # A named node is laid out once here, then copied as a --node DIR is; an unknown name is the
  # fixture's usage error (exit 2), which names the known ones.
  if [[ -n $named_node ]]; then
    node_dir=$top/named-node
    rm -rf "$node_dir"
    local rc=0
    "$plugin" fixture --node "$named_node" --out "$node_dir" --log-level warn >"$top/fixture.log" 2>&1 || rc=$?
    ((rc != 2)) || usage_error "--named-node: $(cat "$top/fixture.log")"
    ((rc == 0)) || { cat "$top/fixture.log" >&2; fail "--named-node $named_node: rdma-device-plugin fixture exited $rc"; }
    mv "$node_dir/$named_node.xml" "$node_dir/topology.xml"
  fi
  cleanup_leftovers
  build_binaries
  build_images
  trace "binaries and images ready"
  local t0
  t0=$(now_ms)
  rm -rf "$run"
  mkdir -p "$run/pids" "$run/logs" "$run/kubelet" "$run/node"
  local memlock=""
  if [[ $nri == 1 ]]; then
    read -r soft hard <<<"$(memlock_plan)"
    memlock=" memlock_soft=$soft memlock_hard=$hard"
  fi
  echo "driver=$driver mode=$mode nri=$nri$memlock" >"$run/config"
  # The node: a copy (the tests remove device nodes and change port states in it).
  if [[ -n $node_dir ]]; then
    cp -a "$node_dir/." "$run/node/"
  else
    "$plugin" fixture --topology-xml test/data/dgx-h100-like.xml --out "$run/node" --log-level warn >/dev/null
    cp test/data/dgx-h100-like.xml "$run/node/topology.xml"
  fi
  # A failed up stops what it started (the logs stay under $run/logs).
  up_done=0
  trap 'if ((up_done == 0)); then say "up failed: stopping what started (logs: $run/logs)"; cmd_down_locked >/dev/null 2>&1 || true; fi' EXIT
  trace "node laid out"
  start_controlplane
  wait_for 60 "the control plane" test -f "$run/cp/ready" || fail "the control plane did not start (log: $run/logs/controlplane.log)"
  trace "control plane ready"
  start_node
  trace "kubelet started"
  wait_for 60 "node $node_name Ready" node_ready || fail "the node is not Ready (logs: $run/logs/kubelet.log)"
  trace "node Ready"
  kubectl_ label node "$node_name" "$rdma_label=true" >/dev/null
  [[ $mode == exclusive ]] && kubectl_ label node "$node_name" "$exclusive_label=true" >/dev/null
  wait_for 30 "the node's taints lifted" node_untainted || fail "the node keeps its taints: $(kubectl_ get node "$node_name" -o jsonpath='{.spec.taints}')"
  install_chart
  trace "chart installed"
  if [[ $driver == deviceplugin ]]; then
    wait_for 60 "allocatable rdma/hca" allocatable_hca || fail "no rdma/hca on the node (kubectl get pods -n $namespace; logs under $run/logs)"
    say "allocatable rdma/hca: $(kubectl_ get node "$node_name" -o jsonpath='{.status.allocatable.rdma/hca}')"
  else
    wait_for 60 "ResourceSlices of $dra_driver" slices_published || fail "no ResourceSlice of $dra_driver published"
    say "ResourceSlices: $(kubectl_ get resourceslices -o jsonpath='{.items[*].metadata.name}')"
  fi
  up_done=1
  say "up in $(( ($(now_ms) - t0) )) ms ($driver, $mode): $(kubectl_ get node "$node_name" --no-headers 2>/dev/null)"
  echo "$kubeconfig"
}

# --- Teardown --------------------------------------------------------------------------------------
# Stops PID $1 with SIGTERM, SIGKILL after $2 seconds; waits until it is gone.
stop_pid() {
  local pid=$1 grace=$2
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + grace))
  while alive "$pid" && ((SECONDS < deadline)); do sleep 0.05; done
  alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  while alive "$pid" && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; do sleep 0.05; done
  return 0
}

# Every process whose mount namespace is the node's (containerd's shims, what a test started
# there), and every task in the node's cgroup root (the containers).
node_processes() {
  local ns p
  ns=$(cat "$run/mntns" 2>/dev/null || true)
  if [[ -n $ns ]]; then
    for p in /proc/[0-9]*; do
      [[ $(readlink "$p/ns/mnt" 2>/dev/null) == "$ns" ]] && echo "${p#/proc/}"
    done
  fi
  local c
  for c in $(cgroup_mounts); do
    [[ -d $c/$(cgroup_root) ]] && find "$c/$(cgroup_root)" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
  return 0
}

remove_cgroups() {
  local c d
  for c in $(cgroup_mounts); do
    [[ -d $c/$(cgroup_root) ]] || continue
    # Bottom-up: rmdir removes a cgroup without tasks or children.
    find "$c/$(cgroup_root)" -depth -type d -print 2>/dev/null | while read -r d; do rmdir "$d" 2>/dev/null || true; done
    [[ -d $c/$(cgroup_root) ]] && say "cgroup $c/$(cgroup_root) still there"
  done
  return 0
}

# Stops the node (kubelet, containers, shims, containerd, the namespace), not the control plane.
stop_node() {
  stop_pid "$(pid_of kubelet)" 5
  trace "kubelet stopped"
  # The containers (the runc shim keeps them under <Root>/<containerd namespace>).
  if alive "$(holder)"; then
    in_ns runc --root /run/runc/k8s.io list -q 2>/dev/null | while read -r c; do
      in_ns runc --root /run/runc/k8s.io kill "$c" KILL 2>/dev/null || true
    done
  fi
  local p
  for p in $(node_processes); do
    [[ $p == "$(pid_of containerd)" || $p == "$(holder)" ]] && continue
    kill -KILL "$p" 2>/dev/null || true
  done
  trace "containers and shims killed"
  stop_pid "$(pid_of containerd)" 5
  stop_pid "$(holder)" 1
  trace "containerd and the namespace stopped"
  local deadline=$((SECONDS + 5)) left
  while left=$(node_processes) && [[ -n $left ]] && ((SECONDS < deadline)); do
    for p in $left; do kill -KILL "$p" 2>/dev/null || true; done
    sleep 0.05
  done
  [[ -z $left ]] || say "processes of the node still there: $(for p in $left; do echo -n "$p($(cat /proc/$p/comm 2>/dev/null)) "; done)"
  trace "no process left"
  remove_cgroups
  rm -f "$run/pids/kubelet" "$run/pids/containerd" "$run/pids/holder"
}

cmd_down_locked() {
  stop_node
  stop_pid "$(pid_of controlplane)" 10
  trace "control plane stopped"
  rm -f "$run/pids/controlplane" "$run/cp/ready" "$run/mntns" "$kubeconfig"
  # The sockets left in the build directory by processes that are gone.
  [[ -d $run ]] && find "$run" -type s -delete 2>/dev/null
  return 0
}

# What a crashed or killed run left: the same teardown, whatever is still there.
cleanup_leftovers() {
  [[ -d $run ]] || return 0
  cmd_down_locked
}

cmd_down() {
  [[ $# == 0 ]] || usage_error "down takes no flag ('$1')"
  [[ $(id -u) == 0 ]] || skip "needs root"
  exec 9>"$top/lock"
  flock -w 60 9 || fail "another real-node.sh up or down holds $top/lock"
  local t0
  t0=$(now_ms)
  cmd_down_locked
  say "down in $(( $(now_ms) - t0 )) ms"
}

cmd_restart() {
  [[ $# == 1 ]] || usage_error "restart needs kubelet or containerd"
  [[ $1 == kubelet || $1 == containerd ]] || usage_error "restart: '$1' is not kubelet or containerd"
  alive "$(holder)" || fail "the node is not up"
  case $1 in
    kubelet) stop_pid "$(pid_of kubelet)" 5; start_kubelet ;;
    containerd) stop_pid "$(pid_of containerd)" 5; start_containerd ;;
    *) usage_error "restart: '$1' is not kubelet or containerd" ;;
  esac
  say "restarted $1"
}

cmd_reboot() {
  [[ $# == 0 ]] || usage_error "reboot takes no flag ('$1')"
  alive "$(holder)" || fail "the node is not up"
  # shellcheck disable=SC1090
  source <(tr ' ' '\n' <"$run/config")
  stop_node
  # /run was a tmpfs of the namespace; the kubelet's pod state goes too.
  rm -rf "$run/kubelet/pods" "$run/containerd/root/io.containerd.runtime.v2.task"
  start_node
  wait_for 60 "node $node_name Ready" node_ready || fail "the node is not Ready after the reboot"
  say "rebooted"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  kubectl) shift; [[ -f $kubeconfig ]] || fail "not up (no $kubeconfig)"; kubectl_ "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  reboot) shift; cmd_reboot "$@" ;;
  ns) shift; alive "$(holder)" || fail "the node is not up"; in_ns "$@" ;;
  build) shift; preconditions; build_binaries; build_images ;;
  __ns) shift; ns_setup "$@" ;;
  __cpns) shift; cp_ns "$@" ;;
  "" | -h | --help) usage_error "a subcommand is needed" ;;
  *) usage_error "unknown subcommand '$1'" ;;
esac
