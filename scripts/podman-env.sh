# Sourced by scripts/image-test.sh and scripts/build-image.sh: podman as they run it.
#
# podman: runc (crun refuses this machine's hybrid cgroup v1/v2 layout) and explicit
# ulimits within the hard limits (podman's defaults for root exceed a sandbox's, and runc may
# not raise them). Capped further, as containers are started through conmon, which podman runs
# with an RLIMIT_NPROC of its own (32768 on the machine this was written on, whatever ulimit -Hu
# says); a build and the plugin need far less.
#
# podman_env WORK: writes WORK/containers.conf, exports CONTAINERS_CONF and TMPDIR, sets the
# array ulimits (podman run/build flags) and defines pm (podman with runc). Returns 1, with
# the reason in podman_error, when podman cannot run here.
limit() {  # $1: ulimit option, $2: cap
  local v
  v=$(ulimit "$1")
  [[ $v == unlimited || $v -gt $2 ]] && v=$2
  echo "$v"
}
pm() { podman --runtime runc "$@"; }
podman_env() {
  local work=$1
  local nofile nproc
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
  local info
  info=$(pm info 2>&1) || { podman_error=$(tail -1 <<<"$info"); return 1; }
}
