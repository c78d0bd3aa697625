#!/usr/bin/env python3
"""Turns the chart's rendered DaemonSets into podman command lines, for scripts/image-test.sh.

Reads `helm template` output (stdin) and writes, for each DaemonSet, into --out:
  <mode>.run    podman run options, the image and the container's args (NUL-separated)
  <mode>.probe  the liveness probe, NUL-separated: "exec" and its command, or "http" and the URL
                the kubelet GETs (the container's loopback and its named port's number)
  <mode>.vars   shell assignments: mode, socket, resource, shared_devices, plugin_dir (host),
                pod_resources_socket (host), discovery (the serve flags `topology` also takes,
                --sysfs-root, --dev-root, --topology-xml; space-separated), nri_socket (host;
                "" without the NRI container)
  <mode>.nri.run  the same for the pod's NRI container (docs/nri.md), when the chart has one
The plugin's container is the one named rdma-device-plugin; the only other one it knows is nri.
Every hostPath volume becomes a bind mount of the fixture path given for it (--host-path
<hostPath>=<fixture dir>); the pod's and the container's security context, env (fieldRef
spec.nodeName -> --node-name's env), resource limits and probes are translated. A field this
script does not know is an error, so that a chart change is never silently left out of the test.
"""

import argparse
import os
import shlex
import sys

import yaml

# Fields of the pod spec and the container that do not change how the process runs on one
# node (scheduling, metadata, image pull, probe timing).
POD_IGNORED = {"automountServiceAccountToken", "enableServiceLinks", "priorityClassName",
               "affinity", "tolerations", "nodeSelector", "imagePullSecrets", "containers",
               "volumes", "securityContext"}
CONTAINER_IGNORED = {"name", "image", "imagePullPolicy", "startupProbe", "readinessProbe",
                     "livenessProbe", "args", "env", "securityContext", "resources",
                     "volumeMounts",
                     # declarative only (the metrics port); the container's address serves it
                     "ports"}


class ChartError(Exception):
    pass


def unknown(kind, obj, known):
    extra = sorted(set(obj) - set(known))
    if extra:
        raise ChartError(f"{kind}: fields this test does not translate: {extra}")


def flag(args, name):
    """The value of --name=value (or --name value) in args, or None."""
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def security(pod_sc, sc):
    opts = []
    unknown("pod securityContext", pod_sc, {"seccompProfile"})
    seccomp = (pod_sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        opts += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":  # podman's default profile is the runtime default
        raise ChartError(f"seccompProfile type {seccomp}")
    unknown("container securityContext", sc,
            {"runAsUser", "runAsGroup", "privileged", "allowPrivilegeEscalation",
             "readOnlyRootFilesystem", "capabilities"})
    if "runAsUser" in sc:
        opts += ["--user", f"{sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}"]
    if sc.get("privileged"):
        opts += ["--privileged"]
    if sc.get("allowPrivilegeEscalation") is False:
        opts += ["--security-opt", "no-new-privileges"]
    if sc.get("readOnlyRootFilesystem"):
        # A Kubernetes read-only root has no tmpfs on /tmp, /var/tmp and /run; podman's has.
        opts += ["--read-only", "--read-only-tmpfs=false"]
    caps = sc.get("capabilities") or {}
    unknown("capabilities", caps, {"drop", "add"})
    for c in caps.get("drop") or []:
        opts += ["--cap-drop", c]
    for c in caps.get("add") or []:
        opts += ["--cap-add", c]
    return opts


def limits(resources):
    opts = []
    unknown("resources", resources, {"requests", "limits"})
    lim = resources.get("limits") or {}
    unknown("resources.limits", lim, {"memory", "cpu"})
    if "memory" in lim:
        m = str(lim["memory"])
        units = {"Ki": "k", "Mi": "m", "Gi": "g"}
        opts += ["--memory", m[:-2] + units[m[-2:]] if m[-2:] in units else m]
    if "cpu" in lim:
        c = str(lim["cpu"])
        opts += ["--cpus", str(int(c[:-1]) / 1000) if c.endswith("m") else c]
    return opts


def mounts(container, volumes, host_paths):
    """Bind mounts of the fixture, and [(container path, host path)] for path mapping."""
    opts, table = [], []
    by_name = {v["name"]: v for v in volumes}
    for m in container.get("volumeMounts") or []:
        unknown(f"volumeMount {m.get('name')}", m, {"name", "mountPath", "readOnly"})
        v = by_name.get(m["name"])
        if v is None or set(v) != {"name", "hostPath"}:
            raise ChartError(f"volume {m['name']}: only hostPath volumes are translated")
        unknown(f"hostPath {m['name']}", v["hostPath"], {"path", "type"})
        path, kind = v["hostPath"]["path"], v["hostPath"].get("type", "")
        if path not in host_paths:
            raise ChartError(f"hostPath {path} (volume {m['name']}): no fixture path given "
                             "(--host-path)")
        source = host_paths[path]
        if kind == "DirectoryOrCreate":
            os.makedirs(source, exist_ok=True)
        elif kind == "Directory" and not os.path.isdir(source):
            raise ChartError(f"hostPath {path} must be a directory: {source} is not")
        elif kind not in ("Directory", "DirectoryOrCreate"):
            raise ChartError(f"hostPath {path}: type {kind!r}")
        opts += ["-v", f"{source}:{m['mountPath']}:{'ro' if m.get('readOnly') else 'rw'}"]
        table.append((m["mountPath"].rstrip("/"), source))
    return opts, table


def to_host(path, table):
    """The host path behind a container path, through the bind mounts (longest prefix)."""
    best = None
    for inside, source in table:
        if path == inside or path.startswith(inside + "/"):
            if best is None or len(inside) > len(best[0]):
                best = (inside, source)
    if best is None:
        raise ChartError(f"{path} is on no mounted volume")
    return best[1] + path[len(best[0]):]


def env(container, node_name):
    opts = []
    for e in container.get("env") or []:
        if "value" in e:
            opts += ["-e", f"{e['name']}={e['value']}"]
        elif (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            opts += ["-e", f"{e['name']}={node_name}"]
        else:
            raise ChartError(f"env {e.get('name')}: only values and spec.nodeName are translated")
    return opts


def liveness(c):
    """The liveness probe as image-test.sh runs it: ["exec", command...] or ["http", url]."""
    probe = c["livenessProbe"]
    if "exec" in probe:
        return ["exec"] + probe["exec"]["command"]
    get = probe.get("httpGet")
    if not get:
        raise ChartError(f"livenessProbe {sorted(probe)}: exec and httpGet are translated")
    port = get["port"]
    if isinstance(port, str):
        named = [p["containerPort"] for p in c.get("ports", []) if p.get("name") == port]
        if not named:
            raise ChartError(f"livenessProbe: no container port named {port}")
        port = named[0]
    return ["http", f"http://127.0.0.1:{port}{get['path']}"]


def daemonset(ds, image, host_paths, node_name):
    spec = ds["spec"]["template"]["spec"]
    unknown("pod spec", spec, POD_IGNORED)
    by_name = {c["name"]: c for c in spec["containers"]}
    if "rdma-device-plugin" not in by_name or set(by_name) - {"rdma-device-plugin", "nri"}:
        raise ChartError(f"containers {sorted(by_name)} in {ds['metadata']['name']}: "
                         "rdma-device-plugin and optionally nri are translated")
    c = by_name["rdma-device-plugin"]
    unknown("container", c, CONTAINER_IGNORED)
    args = list(c.get("args") or [])
    mount_opts, table = mounts(c, spec.get("volumes") or [], host_paths)
    run = (security(spec.get("securityContext") or {}, c.get("securityContext") or {})
           + limits(c.get("resources") or {}) + env(c, node_name) + mount_opts + [image] + args)
    probe = liveness(c)
    mode = flag(args, "--mode") or "shared"
    kubelet_dir = flag(args, "--kubelet-dir")
    pod_resources = flag(args, "--pod-resources-socket")
    if not kubelet_dir or not pod_resources:
        raise ChartError("--kubelet-dir and --pod-resources-socket must be given")
    # The flags `topology` shares with `serve` that say where the node is read.
    discovery = [a for a in args if a.split("=", 1)[0] in
                 ("--sysfs-root", "--dev-root", "--topology-xml")]
    variables = {
        "mode": mode,
        "socket": flag(args, "--socket-name") or "rdma-hca.sock",
        "resource": flag(args, "--resource-name") or "rdma/hca",
        "shared_devices": flag(args, "--shared-devices") or "1000",
        "plugin_dir": to_host(kubelet_dir, table),
        "pod_resources_socket": to_host(pod_resources, table),
        "discovery": " ".join(discovery),
        "nri_socket": "",
    }
    nri_run = None
    if "nri" in by_name:
        n = by_name["nri"]
        unknown("container nri", n, CONTAINER_IGNORED)
        nri_args = list(n.get("args") or [])
        nri_mounts, nri_table = mounts(n, spec.get("volumes") or [], host_paths)
        nri_run = (security(spec.get("securityContext") or {}, n.get("securityContext") or {})
                   + limits(n.get("resources") or {}) + env(n, node_name) + nri_mounts + [image]
                   + nri_args)
        socket = flag(nri_args, "--nri-socket")
        if not socket:
            raise ChartError("the nri container must be given --nri-socket")
        variables["nri_socket"] = to_host(socket, nri_table)
    return mode, run, probe, variables, nri_run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--node-name", default="image-test-node")
    parser.add_argument("--host-path", action="append", default=[],
                        help="<hostPath in the chart>=<fixture directory>")
    args = parser.parse_args()
    host_paths = dict(h.split("=", 1) for h in args.host_path)
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d and d.get("kind") == "DaemonSet"]
    if not docs:
        print("chart_run: no DaemonSet in the rendered chart", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    try:
        for ds in docs:
            mode, run, probe, variables, nri_run = daemonset(ds, args.image, host_paths,
                                                             args.node_name)
            with open(os.path.join(args.out, f"{mode}.run"), "w") as f:
                f.write("\0".join(run) + "\0")
            if nri_run:
                with open(os.path.join(args.out, f"{mode}.nri.run"), "w") as f:
                    f.write("\0".join(nri_run) + "\0")
            with open(os.path.join(args.out, f"{mode}.probe"), "w") as f:
                f.write("\0".join(probe) + "\0")
            with open(os.path.join(args.out, f"{mode}.vars"), "w") as f:
                for k, v in variables.items():
                    f.write(f"{k}={shlex.quote(v)}\n")
            print(mode)
    except ChartError as e:
        print(f"chart_run: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
