#!/usr/bin/env python3
"""Checks charts/rdma-device-plugin with a real Helm binary.

Runs `helm lint --strict`, renders the chart with `helm template` under several sets of values and
asserts on the rendered objects: the two DaemonSets' node affinities select complementary sets of
nodes (evaluated on sample nodes, not only compared as text), the binary's flags point at the
mounted host paths, least privilege, probes, the test hook; and values.schema.json rejects bad
values. Prints one line per check and a last line "N passed, M failed"; exits 1 on any failure.

Usage: test_chart.py [--helm PATH] [--chart DIR] [--binary PATH]
Helm is taken from --helm when that file exists, else from PATH (scripts/get-helm.sh installs it).
"""

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import Results  # noqa: E402

try:
    import yaml
except ImportError:
    sys.exit("test_chart: PyYAML is needed (Debian: apt-get install -y python3-yaml)")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
DEFAULT_CHART = os.path.normpath(os.path.join(HERE, "..", "..", "charts", "rdma-device-plugin"))
DEFAULT_KEY = "rdma.network.alibabacloud.com/exclusive"
RELEASE = "rdp"
NAMESPACE = "kube-system"

# The flags `rdma-device-plugin serve` accepts (docs/server.md; cmd/serve_cmd.cc and
# cmd/discovery_flags.cc). A rendered flag outside this set is a typo the binary rejects at start.
KNOWN_FLAGS = {
    "--mode", "--resource-name", "--shared-devices", "--kubelet-dir", "--socket-name",
    "--pod-resources-socket", "--sysfs-root", "--dev-root", "--proc-root", "--topology-xml",
    "--health-interval", "--node-name", "--exclusive-label", "--log-level", "--gpu-resources",
    "--gpu-classes", "--gpu-vendors", "--admission-window", "--metrics-address",
    "--allocation-dir", "--degraded-symbol-errors", "--degraded-link-downed", "--degraded-window",
    "--flap-count", "--flap-window", "--flap-stable", "--config",
}

# The flags `rdma-device-plugin nri` accepts (cmd/nri_cmd.cc).
KNOWN_NRI_FLAGS = {"--nri-socket", "--memlock", "--nri-plugin-name", "--nri-plugin-index",
                   "--metrics-address", "--log-level"}

# The flags `rdma-device-plugin dra` accepts that the chart renders (cmd/dra_serve_cmd.cc).
KNOWN_DRA_FLAGS = {
    "--mode", "--driver-name", "--kubelet-dir", "--cdi-root", "--sysfs-root", "--dev-root",
    "--topology-xml", "--health-interval", "--node-name", "--log-level", "--gpu-classes",
    "--gpu-vendors", "--metrics-address", "--proc-root", "--allocation-dir",
    "--degraded-symbol-errors", "--degraded-link-downed", "--degraded-window", "--flap-count",
    "--flap-window", "--flap-stable", "--read-pods",
}
DRA_DRIVER = "rdma.network.alibabacloud.com"
DRA_VALUES = {"driver": "dra"}
# The driver's attributes and the standard ones, as a DeviceClass's CEL reads them.
OWN = f'device.attributes["{DRA_DRIVER}"]'
STD = 'device.attributes["resource.kubernetes.io"]'
# A physical function: no virtualFunction attribute, or false (templates/_resources.tpl).
NOT_VF = f"!(has({OWN}.virtualFunction) && {OWN}.virtualFunction)"
# hostPaths.allocations' default: --allocation-dir (/etc/rdma/allocation.json's host files).
ALLOCATIONS = "/var/run/rdma-device-plugin/allocations"

SCHEMA_ERROR = "values don't meet the specifications of the schema"

# image.repository has no default (the chart fails without one): every render here passes this
# first, as a values file that the case's own values override.
TEST_REPOSITORY = "registry.example/rdma-device-plugin"
BASE_VALUES = {"image": {"repository": TEST_REPOSITORY}}


class Helm:
    def __init__(self, binary, chart):
        self.binary = binary
        self.chart = chart
        self.tmp = tempfile.mkdtemp(prefix="test_chart.")

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _values_file(self, values):
        # JSON (a subset of YAML): PyYAML writes y/on unquoted, which Helm reads as booleans.
        fd, path = tempfile.mkstemp(suffix=".json", dir=self.tmp)
        with os.fdopen(fd, "w") as f:
            json.dump(values, f)
        return path

    def run(self, args, values=None, chart=None, base=True):
        """helm <args> <chart> -f BASE_VALUES -f values; base=False leaves BASE_VALUES out."""
        cmd = [self.binary] + args + [chart or self.chart]
        if base:
            cmd += ["-f", self._values_file(BASE_VALUES)]
        if values is not None:
            cmd += ["-f", self._values_file(values)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return proc.returncode, proc.stdout, proc.stderr

    def template(self, values=None, chart=None, extra=()):
        """Rendered objects (hooks included), or raises with helm's stderr."""
        rc, out, err = self.run(["template", RELEASE, "--namespace", NAMESPACE, *extra],
                                values, chart)
        if rc != 0:
            raise RuntimeError(f"helm template failed ({rc}): {err.strip()}")
        return [d for d in yaml.safe_load_all(out) if d]

    def notes(self, values=None):
        """NOTES.txt rendered without a cluster: a copy of the chart renders it into a ConfigMap."""
        copy_dir = os.path.join(self.tmp, "notes-chart")
        shutil.rmtree(copy_dir, ignore_errors=True)
        shutil.copytree(self.chart, copy_dir)
        shutil.copy(os.path.join(copy_dir, "templates", "NOTES.txt"),
                    os.path.join(copy_dir, "notes-under-test.txt"))
        with open(os.path.join(copy_dir, "templates", "notes-under-test.yaml"), "w") as f:
            f.write('apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-under-test\n'
                    'data:\n  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | quote }}\n')
        docs = self.template(values, chart=copy_dir,
                             extra=["--show-only", "templates/notes-under-test.yaml"])
        return docs[0]["data"]["notes"]


# ---- helpers over rendered objects ---------------------------------------------------------

def daemonsets(docs):
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == "DaemonSet"}


def by_mode(docs):
    """{mode: DaemonSet} keyed by the component label."""
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for d in daemonsets(docs).values()}


def test_pods(docs):
    return [d for d in docs if d.get("kind") == "Pod"
            and d.get("metadata", {}).get("annotations", {}).get("helm.sh/hook") == "test"]


def pod_spec(ds):
    return ds["spec"]["template"]["spec"]


def container(ds):
    """The plugin's (or the DRA driver's) container: the first, named rdma-device-plugin."""
    containers = pod_spec(ds)["containers"]
    assert containers and containers[0]["name"] == "rdma-device-plugin", \
        f"the first container is {containers[0]['name'] if containers else 'missing'}"
    return containers[0]


def nri_container(ds):
    """The NRI plugin's container, or None."""
    found = [c for c in pod_spec(ds)["containers"] if c["name"] == "nri"]
    return found[0] if found else None


def flags(ds):
    """{flag: [values]} from the container's args (all --flag=value)."""
    out = {}
    for arg in container(ds).get("args", []):
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            out.setdefault(name, []).append(value)
    return out


def flag(ds, name):
    values = flags(ds).get(name, [])
    return values[0] if len(values) == 1 else None


def required_terms(ds):
    affinity = pod_spec(ds).get("affinity", {})
    required = affinity.get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {})
    return required.get("nodeSelectorTerms", [])


def expression_matches(expr, labels):
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels:
            return False
        a, b = int(labels[key]), int(values[0])
        return a > b if op == "Gt" else a < b
    raise ValueError(f"unknown operator {op}")


def schedulable_on(ds, labels):
    """Whether the DaemonSet's pod may run on a node with these labels: nodeSelector and
    required node affinity (terms ORed, expressions ANDed), as the scheduler evaluates them."""
    spec = pod_spec(ds)
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    terms = required_terms(ds)
    if not terms:
        return True
    return any(all(expression_matches(e, labels) for e in t.get("matchExpressions", []))
               for t in terms)


def tolerates(tolerations, taint):
    """Whether any toleration tolerates the taint ({key, value, effect}), as the scheduler
    matches them: an empty key with Exists tolerates everything; an empty effect every effect."""
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
CRITICAL_TAINT = {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"}
CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
# The node labels that mean "has an RDMA NIC" by default (values.yaml rdmaNodeLabels): NFD's rdma
# source, and its pci source's vendor labels of RDMA NIC makers.
RDMA_VENDORS = {"15b3": "Mellanox/NVIDIA", "14e4": "Broadcom", "8086": "Intel", "1077": "QLogic",
                "1425": "Chelsio", "19e5": "Huawei", "1d0f": "Amazon", "1414": "Microsoft"}
RDMA_NODE_LABELS = (["feature.node.kubernetes.io/rdma.capable"]
                    + [f"feature.node.kubernetes.io/pci-{v}.present" for v in RDMA_VENDORS])
RDMA_LABEL = {"feature.node.kubernetes.io/pci-15b3.present": "true"}
RDMA_REQUIREMENT = {"key": "feature.node.kubernetes.io/pci-15b3.present", "operator": "In",
                    "values": ["true"]}


def rdma_terms(mode_requirement, before=()):
    """The default required terms: one per RDMA node label, each with the mode's requirement."""
    return [{"matchExpressions": list(before) + [{"key": label, "operator": "In",
                                                  "values": ["true"]}, mode_requirement]}
            for label in RDMA_NODE_LABELS]


def check_tolerations(r, name, tolerations):
    r.check(name + "tolerates GPU nodes' nvidia.com/gpu and CriticalAddonsOnly taints",
            tolerates(tolerations, GPU_TAINT) and tolerates(tolerations, CRITICAL_TAINT),
            str(tolerations))
    r.check(name + "does not tolerate the control plane's taint (nor every taint)",
            not tolerates(tolerations, CONTROL_PLANE_TAINT), str(tolerations))


def mounts_by_name(ds):
    return {m["name"]: m for m in container(ds).get("volumeMounts", [])}


def volumes_by_name(ds):
    return {v["name"]: v for v in pod_spec(ds).get("volumes", [])}


def host_mounts(ds):
    """{host path: mount} for every hostPath volume the container mounts."""
    volumes = volumes_by_name(ds)
    out = {}
    for name, mount in mounts_by_name(ds).items():
        volume = volumes.get(name, {})
        if "hostPath" in volume:
            out[volume["hostPath"]["path"]] = mount
    return out


PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
# Values under which the kubelet cannot GET the metrics port: the probes exec the probe command.
NO_METRICS = {"metrics": {"enabled": False}}


def probe_commands(ds):
    c = container(ds)
    return {kind: c.get(kind, {}).get("exec", {}).get("command") for kind in PROBES}


def probe_gets(ds):
    """(path, port) of each probe's httpGet, None where it has none."""
    c = container(ds)
    out = {}
    for kind in PROBES:
        get = c.get(kind, {}).get("httpGet")
        out[kind] = (get.get("path"), get.get("port")) if get else None
    return out


def check_probe_gets(r, ds, name):
    """The probes GET /livez (startup, liveness) and /readyz (readiness) on the plugin's declared
    metrics port, and exec nothing."""
    ports = [p.get("name") for p in container(ds).get("ports", [])]
    for kind, get in probe_gets(ds).items():
        want = ("/readyz" if kind == "readinessProbe" else "/livez", "metrics")
        r.check(name + f"{kind} GETs {want[0]} on the metrics port (no process started)",
                get == want and "metrics" in ports and probe_commands(ds)[kind] is None,
                f"{get} != {want}, ports {ports}")


# ---- the checks ----------------------------------------------------------------------------

def check_lint(r, helm):
    for label, values in [("default", None),
                          ("exclusive-only", {"modes": ["exclusive"]}),
                          ("shared-only", {"modes": ["shared"]}),
                          ("custom-label", {"exclusiveLabel": {"key": "example.com/rdma-x",
                                                               "value": "yes"}})]:
        rc, out, err = helm.run(["lint", "--strict"], values)
        r.check(f"lint --strict ({label})", rc == 0, (out + err).strip()[-800:])


def check_daemonset_basics(r, ds, mode, scenario="default"):
    spec = pod_spec(ds)
    name = f"{scenario}/{mode}: "
    selector = ds["spec"]["selector"]["matchLabels"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    r.check(name + "selector matches its pod labels",
            all(pod_labels.get(k) == v for k, v in selector.items()), f"{selector} {pod_labels}")
    r.check(name + "selector carries the mode", selector.get("app.kubernetes.io/component") == mode,
            str(selector))
    r.check(name + "namespace is the release's", ds["metadata"].get("namespace") == NAMESPACE)
    r.check(name + "automountServiceAccountToken is false",
            spec.get("automountServiceAccountToken") is False)
    r.check(name + "priorityClassName system-node-critical",
            spec.get("priorityClassName") == "system-node-critical")
    check_tolerations(r, name, spec.get("tolerations"))
    r.check(name + "no host namespaces",
            not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")))

    c = container(ds)
    sc = c.get("securityContext", {})
    r.check(name + "not privileged", sc.get("privileged") is False)
    r.check(name + "no privilege escalation", sc.get("allowPrivilegeEscalation") is False)
    r.check(name + "drops ALL capabilities and adds none",
            sc.get("capabilities", {}).get("drop") == ["ALL"]
            and not sc.get("capabilities", {}).get("add"), str(sc.get("capabilities")))
    r.check(name + "read-only root filesystem", sc.get("readOnlyRootFilesystem") is True)
    seccomp = (sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile")
               or {})
    r.check(name + "seccomp RuntimeDefault", seccomp.get("type") == "RuntimeDefault", str(seccomp))

    resources = c.get("resources", {})
    r.check(name + "requests cpu and memory, limits memory",
            {"cpu", "memory"} <= set(resources.get("requests", {}))
            and "memory" in resources.get("limits", {}), str(resources))

    env = {e["name"]: e for e in c.get("env", [])}
    r.check(name + "NODE_NAME from spec.nodeName",
            env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            == "spec.nodeName", str(env.get("NODE_NAME")))

    args = c.get("args", [])
    f = flags(ds)
    r.check(name + "runs serve", args[:1] == ["serve"], str(args))
    unknown = sorted(set(f) - KNOWN_FLAGS)
    r.check(name + "only flags the binary knows", not unknown, str(unknown))
    repeated = sorted(k for k, v in f.items() if len(v) > 1)
    r.check(name + "no flag given twice", not repeated, str(repeated))
    r.check(name + f"--mode={mode}", flag(ds, "--mode") == mode, str(args))
    r.check(name + "--resource-name=rdma/hca", flag(ds, "--resource-name") == "rdma/hca")
    if mode == "shared":
        r.check(name + "--shared-devices=1000", flag(ds, "--shared-devices") == "1000")
        r.check(name + "no --exclusive-label", "--exclusive-label" not in f)
    else:
        r.check(name + "--exclusive-label=<key>", flag(ds, "--exclusive-label") == DEFAULT_KEY,
                str(f.get("--exclusive-label")))
        r.check(name + "no --shared-devices", "--shared-devices" not in f)
    r.check(name + "null values pass no flag",
            not ({"--health-interval", "--log-level", "--gpu-resources"} & set(f)), str(sorted(f)))

    check_mounts(r, ds, name)
    check_probes(r, ds, name)


def check_mounts(r, ds, name):
    volumes = volumes_by_name(ds)
    mounts = mounts_by_name(ds)
    r.check(name + "every mount has a volume", set(mounts) <= set(volumes),
            str(set(mounts) - set(volumes)))
    hm = host_mounts(ds)
    kubelet_dir = flag(ds, "--kubelet-dir")
    dp = hm.get("/var/lib/kubelet/device-plugins")
    r.check(name + "device-plugins dir mounted read-write at --kubelet-dir",
            dp is not None and dp["mountPath"] == kubelet_dir and not dp.get("readOnly"),
            f"{dp} vs {kubelet_dir}")
    pr = hm.get("/var/lib/kubelet/pod-resources")
    socket = flag(ds, "--pod-resources-socket") or ""
    r.check(name + "pod-resources dir mounted, holding --pod-resources-socket",
            pr is not None and os.path.dirname(socket) == pr["mountPath"], f"{pr} vs {socket}")
    sysfs_root = flag(ds, "--sysfs-root")
    sys_mount = hm.get("/sys")
    r.check(name + "/sys mounted read-only at <--sysfs-root>/sys",
            sys_mount is not None and sysfs_root is not None and sys_mount.get("readOnly") is True
            and sys_mount["mountPath"] == os.path.join(sysfs_root, "sys"),
            f"{sys_mount} vs {sysfs_root}")
    dev_root = flag(ds, "--dev-root")
    dev = hm.get("/dev")
    # The whole /dev: a mount of /dev/infiniband stays on the directory a driver reload removes.
    r.check(name + "/dev mounted read-only at <--dev-root>/dev (not /dev/infiniband)",
            dev is not None and dev_root is not None and dev.get("readOnly") is True
            and dev["mountPath"] == os.path.join(dev_root, "dev")
            and "/dev/infiniband" not in hm,
            f"{dev} vs {dev_root}; host paths {sorted(hm)}")
    proc_root = flag(ds, "--proc-root")
    pd = hm.get("/proc/driver")
    r.check(name + "/proc/driver mounted read-only at <--proc-root>/proc/driver",
            pd is not None and proc_root is not None and pd.get("readOnly") is True
            and pd["mountPath"] == os.path.join(proc_root, "proc/driver"), f"{pd} vs {proc_root}")
    writable = sorted(m["mountPath"] for m in mounts.values() if not m.get("readOnly"))
    r.check(name + "only the device-plugin dir and the allocation files' dir are writable",
            writable == sorted([kubelet_dir, ALLOCATIONS]), str(writable))


def check_probes(r, ds, name):
    check_probe_gets(r, ds, name)
    c = container(ds)
    r.check(name + "liveness tolerates a kubelet restart (>= 2 misses)",
            c.get("livenessProbe", {}).get("failureThreshold", 0) >= 2)
    readiness = c.get("readinessProbe", {})
    r.check(name + "readiness tolerates a slow probe (>= 3 misses, its timeout >= 2 s)",
            readiness.get("failureThreshold", 0) >= 3 and readiness.get("timeoutSeconds", 0) >= 2,
            str(readiness))
    for kind in ("livenessProbe", "readinessProbe"):
        r.check(name + f"{kind} runs at most every 10 s",
                c.get(kind, {}).get("periodSeconds", 0) >= 10, str(c.get(kind)))


def check_probe_fallback(r, helm):
    """Where the kubelet cannot GET /livez and /readyz (metrics off, behind the proxy, or an
    access list that may refuse it), the probes exec the probe command on the plugin's own
    socket (in DRA: the driver's sockets, and for readiness its registration), at most every
    10 s: each starts a process."""
    proxy = {"metrics": {"enabled": True, "proxy": {"enabled": True}}}
    allow = {"metrics": {"enabled": True, "allow": ["10.0.0.0/8"]}}
    for label, values in [("metrics off", NO_METRICS), ("proxy", proxy), ("allow", allow)]:
        for door, extra in [("device plugin", {}), ("DRA", DRA_VALUES)]:
            for mode, ds in sorted(by_mode(helm.template(dict(values, **extra))).items()):
                name = f"probes/{label}/{door}/{mode}: "
                if door == "DRA":
                    expected = ["rdma-device-plugin", "probe", "--dra",
                                f"--kubelet-dir={flag(ds, '--kubelet-dir')}",
                                f"--driver-name={DRA_DRIVER}"]
                else:
                    expected = ["rdma-device-plugin", "probe",
                                f"--kubelet-dir={flag(ds, '--kubelet-dir')}",
                                f"--socket-name={flag(ds, '--socket-name')}"]
                c = container(ds)
                for kind, command in probe_commands(ds).items():
                    want = expected + (["--ready"] if door == "DRA" and kind == "readinessProbe"
                                       else [])
                    r.check(name + f"{kind} execs the probe command", command == want
                            and probe_gets(ds)[kind] is None, f"{command} != {want}")
                    if kind != "startupProbe":
                        r.check(name + f"{kind} runs at most every 10 s (each starts a process)",
                                c.get(kind, {}).get("periodSeconds", 0) >= 10, str(c.get(kind)))
    shared = by_mode(helm.template(dict(NO_METRICS, hostPaths={
        "kubeletDevicePlugins": "/var/lib/k0s/kubelet/device-plugins"})))["shared"]
    r.check("probes/metrics off: the probe command follows the kubelet dir",
            probe_commands(shared)["livenessProbe"][2]
            == "--kubelet-dir=/var/lib/k0s/kubelet/device-plugins", str(probe_commands(shared)))


def check_default(r, helm):
    docs = helm.template()
    modes = by_mode(docs)
    r.check("default: two DaemonSets, shared and exclusive",
            sorted(modes) == ["exclusive", "shared"],
            str(sorted(modes)))
    if sorted(modes) != ["exclusive", "shared"]:
        return
    for mode, ds in sorted(modes.items()):
        check_daemonset_basics(r, ds, mode)
    shared, exclusive = modes["shared"], modes["exclusive"]
    r.check("default: selectors do not overlap",
            shared["spec"]["selector"]["matchLabels"]
            != exclusive["spec"]["selector"]["matchLabels"])
    r.check("default: each mode has its own socket",
            flag(shared, "--socket-name") != flag(exclusive, "--socket-name"),
            str([flag(shared, "--socket-name"), flag(exclusive, "--socket-name")]))
    r.check("default: the shared affinity is exactly one term per RDMA NIC label (NFD) with "
            "<key> NotIn [true]",
            required_terms(shared) == rdma_terms(
                {"key": DEFAULT_KEY, "operator": "NotIn", "values": ["true"]}),
            str(required_terms(shared)))
    r.check("default: the exclusive affinity is exactly one term per RDMA NIC label (NFD) with "
            "<key> In [true]",
            required_terms(exclusive) == rdma_terms(
                {"key": DEFAULT_KEY, "operator": "In", "values": ["true"]}),
            str(required_terms(exclusive)))
    # Any RDMA NIC: NFD's rdma.capable alone, or one vendor's PCI label alone, places the plugin.
    for label in RDMA_NODE_LABELS:
        check_complement(r, f"default/{label}", shared, exclusive, DEFAULT_KEY, "true",
                         other_labels=[{label: "true"},
                                       {label: "true", "kubernetes.io/os": "linux"}])
    cpu_only = [{}, {"kubernetes.io/os": "linux"}, {DEFAULT_KEY: "true"},
                {"feature.node.kubernetes.io/pci-15b3.present": "false"},
                {"feature.node.kubernetes.io/rdma.capable": "false"},
                {"feature.node.kubernetes.io/pci-10de.present": "true"},  # a GPU, no NIC
                {"feature.node.kubernetes.io/rdma.available": "true"}]
    r.check("default: a node without an RDMA NIC label runs neither DaemonSet",
            not any(schedulable_on(ds, labels) for ds in (shared, exclusive)
                    for labels in cpu_only))
    version = open(os.path.join(REPO, "VERSION"), encoding="utf-8").read().strip()
    r.check("default: image defaults to appVersion (VERSION)",
            container(shared)["image"].endswith(":" + version), container(shared)["image"])
    r.check("default: rolling update without surge",
            ds_surge(shared) in (None, 0, "0", "0%"), str(shared["spec"].get("updateStrategy")))
    check_test_pod(r, docs, "rdma/hca")


ARCH_LABELS = ("kubernetes.io/arch", "beta.kubernetes.io/arch")


def check_no_architecture(r, helm):
    """The image is a manifest list for linux/amd64 and linux/arm64 (docs/install.md): no
    rendered DaemonSet, in either driver or mode, pins its pods to an architecture, and each
    runs on an RDMA node of either one."""
    for label, values in (("device plugin", None), ("DRA", DRA_VALUES)):
        for mode, ds in sorted(by_mode(helm.template(values)).items()):
            spec = pod_spec(ds)
            text = yaml.safe_dump({"nodeSelector": spec.get("nodeSelector"),
                                   "affinity": spec.get("affinity")})
            r.check(f"architecture ({label}/{mode}): no node selector or affinity on an "
                    "architecture label", not any(a in text for a in ARCH_LABELS), text[:300])
            nodes = [dict(RDMA_LABEL, **{"kubernetes.io/arch": arch, "kubernetes.io/os": "linux"},
                          **({DEFAULT_KEY: "true"} if mode == "exclusive" else {}))
                     for arch in ("amd64", "arm64")]
            r.check(f"architecture ({label}/{mode}): schedulable on amd64 and arm64 RDMA nodes",
                    all(schedulable_on(ds, n) for n in nodes), str(nodes))


def ds_surge(ds):
    return ds["spec"].get("updateStrategy", {}).get("rollingUpdate", {}).get("maxSurge")


def check_complement(r, label, shared, exclusive, key, value, other_labels):
    """On every sample node exactly one DaemonSet may run, the right one; user-given affinity
    terms that a node fails keep both off it."""
    failures = []
    for base in other_labels:
        for label_value, want in [(None, "shared"), (value, "exclusive"), ("false", "shared"),
                                  (value + "x", "shared"), ("", "shared")]:
            labels = dict(base)
            if label_value is not None:
                labels[key] = label_value
            runs = [m for m, ds in (("shared", shared), ("exclusive", exclusive))
                    if schedulable_on(ds, labels)]
            if runs != [want]:
                failures.append(f"{labels} -> {runs}, want [{want}]")
    r.check(f"{label}: affinities complement each other on sample nodes", not failures,
            "; ".join(failures))


def check_test_pod(r, docs, resource_name):
    """The test hook under the default values: exclusive, so it gets the exclusive DaemonSet's
    node affinity."""
    pods = test_pods(docs)
    r.check("test hook: one pod annotated helm.sh/hook=test", len(pods) == 1, str(len(pods)))
    if len(pods) != 1:
        return
    pod = pods[0]
    spec = pod["spec"]
    c = spec["containers"][0]
    r.check("test hook: asks for one rdma unit",
            str(c.get("resources", {}).get("limits", {}).get(resource_name)) == "1",
            str(c.get("resources")))
    r.check("test hook: runs rdma-device-plugin check",
            c.get("command", []) + c.get("args", []) == ["rdma-device-plugin", "check"],
            str(c.get("command")))
    r.check("test hook: restartPolicy Never", spec.get("restartPolicy") == "Never")
    r.check("test hook: automountServiceAccountToken false",
            spec.get("automountServiceAccountToken") is False)
    sc = c.get("securityContext", {})
    r.check("test hook: least privilege",
            sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities", {}).get("drop")
            == ["ALL"] and sc.get("readOnlyRootFilesystem") is True, str(sc))
    check_tolerations(r, "test hook: ", spec.get("tolerations"))
    r.check("test hook: has a deadline (activeDeadlineSeconds 300)",
            spec.get("activeDeadlineSeconds") == 300, str(spec.get("activeDeadlineSeconds")))
    exclusive = by_mode(docs).get("exclusive")
    r.check("test hook: default mode exclusive, with the exclusive DaemonSet's node affinity",
            exclusive is not None and spec.get("affinity") == pod_spec(exclusive).get("affinity")
            and pod["metadata"]["labels"].get("rdma.network.alibabacloud.com/test-mode")
            == "exclusive", str(spec.get("affinity")))


def check_test_pod_modes(r, helm):
    """test.mode picks the nodes the hook runs on; a mode that is not deployed is refused."""
    cases = [("modes={shared}: shared", {"modes": ["shared"]}, "shared"),
             ("test.mode=shared", {"test": {"mode": "shared"}}, "shared"),
             ("test.mode=exclusive", {"test": {"mode": "exclusive"}}, "exclusive")]
    for label, values, mode in cases:
        docs = helm.template(values)
        pods, ds = test_pods(docs), by_mode(docs).get(mode)
        r.check(f"test hook ({label}): the {mode} DaemonSet's node affinity",
                len(pods) == 1 and ds is not None
                and pods[0]["spec"].get("affinity") == pod_spec(ds).get("affinity"),
                str(pods[0]["spec"].get("affinity") if pods else None))
    docs = helm.template({"test": {"activeDeadlineSeconds": 45}})
    r.check("test hook: activeDeadlineSeconds from test.activeDeadlineSeconds",
            test_pods(docs)[0]["spec"].get("activeDeadlineSeconds") == 45)
    rc, _, err = helm.run(["template", RELEASE],
                          {"modes": ["shared"], "test": {"mode": "exclusive"}})
    r.check("test hook: test.mode not in modes is refused, naming both",
            rc != 0 and "test.mode is exclusive, but modes (shared) does not deploy it" in err,
            err.strip()[:300])


def check_image_required(r, helm):
    """No default image: rendering without image.repository fails saying how to set it; a
    repository without a registry is refused by the schema."""
    rc, _, err = helm.run(["template", RELEASE], base=False)
    r.check("image: no repository fails, pointing at the Dockerfile and docs",
            rc != 0 and "image.repository is not set" in err and "Dockerfile" in err
            and "docs/install.md" in err, err.strip()[:300])
    for repository in ["rdma-device-plugin", "library/rdma-device-plugin",
                       "registry.example/rdp:1.0"]:
        rc, _, err = helm.run(["template", RELEASE], {"image": {"repository": repository}})
        r.check(f"image: schema refuses repository {repository!r} (no registry, or a tag)",
                rc != 0 and SCHEMA_ERROR in err, err.strip()[:300])
    for repository in ["localhost/rdma-device-plugin", "registry.example.com:5000/a/b"]:
        rc, _, err = helm.run(["template", RELEASE], {"image": {"repository": repository}})
        r.check(f"image: repository {repository!r} accepted", rc == 0, err.strip()[:300])


def check_rdma_node_requirements(r, helm):
    """rdmaNodeLabels: [] runs on every node the mode allows; another label replaces NFD's;
    rdmaNodeRequirements are ANDed into every term."""
    modes = by_mode(helm.template({"rdmaNodeLabels": []}))
    if r.check("rdmaNodeLabels=[]: two DaemonSets", sorted(modes) == ["exclusive", "shared"]):
        r.check("rdmaNodeLabels=[]: only the mode's requirement is left",
                required_terms(modes["shared"]) == [{"matchExpressions": [
                    {"key": DEFAULT_KEY, "operator": "NotIn", "values": ["true"]}]}],
                str(required_terms(modes["shared"])))
        check_complement(r, "rdmaNodeLabels=[]", modes["shared"], modes["exclusive"],
                         DEFAULT_KEY, "true", other_labels=[{}, {"kubernetes.io/os": "linux"}])
    modes = by_mode(helm.template({"rdmaNodeLabels": ["example.com/rdma"]}))
    own = {"key": "example.com/rdma", "operator": "In", "values": ["true"]}
    if r.check("own RDMA label: two DaemonSets", sorted(modes) == ["exclusive", "shared"]):
        r.check("own RDMA label: it replaces NFD's, one term",
                all(len(required_terms(ds)) == 1 and own in required_terms(ds)[0]["matchExpressions"]
                    and RDMA_REQUIREMENT not in required_terms(ds)[0]["matchExpressions"]
                    for ds in modes.values()))
        check_complement(r, "own RDMA label", modes["shared"], modes["exclusive"], DEFAULT_KEY,
                         "true", other_labels=[{"example.com/rdma": "true"}])
    pool = {"key": "pool", "operator": "In", "values": ["gpu"]}
    modes = by_mode(helm.template({"rdmaNodeRequirements": [pool]}))
    if r.check("rdmaNodeRequirements: two DaemonSets", sorted(modes) == ["exclusive", "shared"]):
        r.check("rdmaNodeRequirements: in every term, before the RDMA label",
                all(t["matchExpressions"][0] == pool and len(required_terms(ds)) == len(RDMA_NODE_LABELS)
                    for ds in modes.values() for t in required_terms(ds)))
        check_complement(r, "rdmaNodeRequirements", modes["shared"], modes["exclusive"],
                         DEFAULT_KEY, "true", other_labels=[dict(RDMA_LABEL, pool="gpu")])
        r.check("rdmaNodeRequirements: an RDMA node outside the pool runs neither",
                not any(schedulable_on(ds, dict(RDMA_LABEL, pool="cpu")) for ds in modes.values()))


def check_single_mode(r, helm):
    for mode in ("exclusive", "shared"):
        modes = by_mode(helm.template({"modes": [mode]}))
        r.check(f"{mode}-only: one DaemonSet, {mode}", sorted(modes) == [mode], str(sorted(modes)))
        if mode in modes:
            check_daemonset_basics(r, modes[mode], mode, scenario=f"{mode}-only")
    docs = helm.template({"test": {"enabled": False}})
    r.check("test.enabled=false: no test pod", not test_pods(docs))


def check_custom_label(r, helm):
    key, value = "example.com/rdma-exclusive", "on"
    user_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
                {"matchExpressions": [{"key": "rdma", "operator": "Exists"}]},
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]}]}}],
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                              "labelSelector": {"matchLabels": {"x": "y"}}}}]},
    }
    docs = helm.template({"exclusiveLabel": {"key": key, "value": value},
                          "affinity": user_affinity})
    modes = by_mode(docs)
    if not r.check("custom label: two DaemonSets", sorted(modes) == ["exclusive", "shared"]):
        return
    shared, exclusive = modes["shared"], modes["exclusive"]
    r.check("custom label: --exclusive-label=<custom key>",
            flag(exclusive, "--exclusive-label") == key)
    for mode, ds in modes.items():
        terms = required_terms(ds)
        op = "In" if mode == "exclusive" else "NotIn"
        want = {"key": key, "operator": op, "values": [value]}
        r.check(f"custom label: {mode} adds <key> {op} [{value}] to each of the 2 user terms, "
                "once per RDMA NIC label",
                len(terms) == 2 * len(RDMA_NODE_LABELS)
                and all(want in t["matchExpressions"] for t in terms), str(terms))
        r.check(f"custom label: {mode} keeps the default key out",
                DEFAULT_KEY not in yaml.safe_dump(pod_spec(ds)["affinity"]))
        aff = pod_spec(ds)["affinity"]
        r.check(f"custom label: {mode} keeps preferred node affinity and podAntiAffinity",
                aff["nodeAffinity"].get("preferredDuringSchedulingIgnoredDuringExecution")
                == user_affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                and aff.get("podAntiAffinity") == user_affinity["podAntiAffinity"])
    check_complement(r, "custom label", shared, exclusive, key, value,
                     other_labels=[dict(RDMA_LABEL, gpu="h100"), dict(RDMA_LABEL, rdma=""),
                                   dict(RDMA_LABEL, gpu="h100", rdma="1")])
    r.check("custom label: each user term also requires an RDMA NIC label (NFD)",
            all(any(e["key"] in RDMA_NODE_LABELS for e in t["matchExpressions"])
                for ds in (shared, exclusive) for t in required_terms(ds)))
    stray = {"gpu": "a100", key: value}
    r.check("custom label: a node outside the user's terms runs neither",
            not schedulable_on(shared, stray) and not schedulable_on(exclusive, stray)
            and not schedulable_on(shared, {"gpu": "a100"}))


def check_overrides(r, helm):
    docs = helm.template({
        "resourceName": "example.com/hca", "sharedDevices": 64, "healthInterval": "2s",
        "logLevel": "debug", "gpuResources": ["nvidia.com/gpu", "example.com/gpu"],
        "extraArgs": ["--topology-xml=/etc/rdp/node.xml"],
        "nodeSelector": {"feature.node.kubernetes.io/rdma.available": "true"},
        "image": {"repository": "registry.example/rdp", "tag": "1.2.3",
                  "pullPolicy": "Always"},
        "hostPaths": {"kubeletDevicePlugins": "/var/lib/k0s/kubelet/device-plugins",
                      "kubeletPodResources": "/var/lib/k0s/kubelet/pod-resources",
                      "sys": "/sys", "dev": "/dev", "procDriver": ""},
        "podAnnotations": {"a": "b"},
    })
    modes = by_mode(docs)
    shared, exclusive = modes["shared"], modes["exclusive"]
    f = flags(shared)
    r.check("overrides: values become flags",
            f.get("--resource-name") == ["example.com/hca"] and f.get("--shared-devices") == ["64"]
            and f.get("--health-interval") == ["2s"] and f.get("--log-level") == ["debug"]
            and f.get("--gpu-resources") == ["nvidia.com/gpu,example.com/gpu"], str(f))
    r.check("overrides: extraArgs last", container(exclusive)["args"][-1]
            == "--topology-xml=/etc/rdp/node.xml", str(container(exclusive)["args"]))
    r.check("overrides: nodeSelector on both",
            all(pod_spec(d).get("nodeSelector") == {"feature.node.kubernetes.io/rdma.available":
                                                    "true"} for d in (shared, exclusive)))
    r.check("overrides: image", container(shared)["image"] == "registry.example/rdp:1.2.3"
            and container(shared)["imagePullPolicy"] == "Always")
    r.check("overrides: kubelet dir follows hostPaths",
            flag(shared, "--kubelet-dir") == "/var/lib/k0s/kubelet/device-plugins"
            and "/var/lib/k0s/kubelet/device-plugins" in host_mounts(shared)
            and flag(shared, "--pod-resources-socket")
            == "/var/lib/k0s/kubelet/pod-resources/kubelet.sock")
    r.check("overrides: probes GET the metrics port", probe_gets(shared)["livenessProbe"]
            == ("/livez", "metrics"), str(probe_gets(shared)))
    r.check("overrides: procDriver \"\" drops the mount and --proc-root",
            "/proc/driver" not in host_mounts(shared) and "--proc-root" not in f)
    annotations = shared["spec"]["template"]["metadata"].get("annotations", {})
    r.check("overrides: podAnnotations beside the scrape annotations",
            annotations.get("a") == "b" and annotations.get("prometheus.io/scrape") == "true",
            str(annotations))
    pods = test_pods(docs)
    r.check("overrides: test pod asks for the custom resource",
            len(pods) == 1 and str(pods[0]["spec"]["containers"][0]["resources"]["limits"]
                                   .get("example.com/hca")) == "1"
            and "rdma/hca" not in pods[0]["spec"]["containers"][0]["resources"]["limits"])


def check_rejections(r, helm):
    """Each of these must make `helm template` fail; the schema ones with the schema's message."""
    schema_cases = [
        ("unknown mode", {"modes": ["shared", "turbo"]}),
        ("modes as a string", {"modes": "exclusive"}),
        ("duplicate mode", {"modes": ["shared", "shared"]}),
        ("no mode", {"modes": []}),
        ("sharedDevices as a string", {"sharedDevices": "1000"}),
        ("sharedDevices 0", {"sharedDevices": 0}),
        ("sharedDevices over 100000", {"sharedDevices": 100001}),
        ("exclusive label value as a boolean", {"exclusiveLabel": {"key": DEFAULT_KEY,
                                                                   "value": True}}),
        ("exclusive label key with spaces", {"exclusiveLabel": {"key": "bad key",
                                                                "value": "true"}}),
        ("resourceName without a domain", {"resourceName": "hca"}),
        ("healthInterval as a number", {"healthInterval": 5}),
        ("healthInterval without a unit", {"healthInterval": "5"}),
        ("unknown logLevel", {"logLevel": "verbose"}),
        ("gpuResources as a string", {"gpuResources": "nvidia.com/gpu"}),
        ("tolerations as a map", {"tolerations": {"operator": "Exists"}}),
        ("an RDMA node requirement with an unknown operator",
         {"rdmaNodeRequirements": [{"key": "x", "operator": "Maybe"}]}),
        ("an RDMA node requirement without a key", {"rdmaNodeRequirements": [{"operator": "Exists"}]}),
        ("rdmaNodeLabels as a string", {"rdmaNodeLabels": "feature.node.kubernetes.io/rdma.capable"}),
        ("an RDMA node label with a space", {"rdmaNodeLabels": ["bad label"]}),
        ("an RDMA node label given twice", {"rdmaNodeLabels": ["a", "a"]}),
        ("unknown pullPolicy", {"image": {"repository": "localhost/x", "pullPolicy": "Sometimes"}}),
        ("relative host path", {"hostPaths": {"kubeletDevicePlugins": "var/lib/kubelet"}}),
        ("misspelt top-level key", {"tolerration": []}),
        ("extraArgs not a flag", {"extraArgs": ["serve"]}),
        ("test.enabled as a string", {"test": {"enabled": "yes"}}),
        ("an unknown test.mode", {"test": {"mode": "both"}}),
        ("test.activeDeadlineSeconds 0", {"test": {"activeDeadlineSeconds": 0}}),
        ("podSecurityCheck as a string", {"podSecurityCheck": "no"}),
    ]
    for label, values in schema_cases:
        rc, _, err = helm.run(["template", RELEASE], values)
        r.check(f"schema rejects {label}", rc != 0 and SCHEMA_ERROR in err,
                f"rc={rc} {err.strip()[:300]}")
    rc, _, err = helm.run(["template", RELEASE],
                          {"updateStrategy": {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1}}})
    r.check("template rejects maxSurge", rc != 0 and "maxSurge must be 0" in err, err.strip()[:300])
    rc, _, err = helm.run(["template", RELEASE],
                          {"updateStrategy": {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": "10%",
                                                                "maxSurge": "0%"}}})
    r.check("template accepts maxSurge 0%", rc == 0, err.strip()[:300])
    # The DRA driver hands the node over (docs/dra.md, "Upgrades"): maxSurge is its choice.
    surge = {"updateStrategy": {"type": "RollingUpdate",
                                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}
    rc, out, err = helm.run(["template", RELEASE], dict(DRA_VALUES, **surge))
    r.check("DRA: template accepts maxSurge 1", rc == 0 and "maxSurge: 1" in out, err.strip()[:300])


def check_dra(r, helm):
    """driver: dra: the DaemonSets run the DRA driver with the kubelet's plugin directories and
    the CDI directory (and nothing of device-plugin mode), a ServiceAccount with exactly the API
    access the driver needs, and the DeviceClass with the extended resource."""
    docs = helm.template(DRA_VALUES)
    modes = by_mode(docs)
    r.check("DRA: two DaemonSets, shared and exclusive", sorted(modes) == ["exclusive", "shared"],
            str(sorted(modes)))
    accounts = [d for d in docs if d.get("kind") == "ServiceAccount"]
    r.check("DRA: one ServiceAccount", len(accounts) == 1, str(len(accounts)))
    account = accounts[0]["metadata"]["name"] if accounts else None
    for mode, ds in sorted(modes.items()):
        name = f"DRA/{mode}: "
        spec = pod_spec(ds)
        c = container(ds)
        args = c.get("args", [])
        f = flags(ds)
        r.check(name + "runs dra", args[:1] == ["dra"], str(args))
        r.check(name + "only flags the dra command knows", not set(f) - KNOWN_DRA_FLAGS,
                str(sorted(set(f) - KNOWN_DRA_FLAGS)))
        r.check(name + f"--mode={mode}", flag(ds, "--mode") == mode)
        r.check(name + "--driver-name", flag(ds, "--driver-name") == DRA_DRIVER)
        r.check(name + "runs as the ServiceAccount, with its token",
                spec.get("serviceAccountName") == account
                and spec.get("automountServiceAccountToken") is True, str(spec.get("serviceAccountName")))
        hm = host_mounts(ds)
        root = flag(ds, "--kubelet-dir")
        for sub in ("plugins_registry", "plugins"):
            m = hm.get(f"/var/lib/kubelet/{sub}")
            r.check(name + f"{sub} mounted read-write at <--kubelet-dir>/{sub}",
                    m is not None and m["mountPath"] == f"{root}/{sub}" and not m.get("readOnly"),
                    str(m))
        state = hm.get("/var/lib/kubelet/dra_manager_state")
        state_types = [v["hostPath"].get("type") for v in volumes_by_name(ds).values()
                       if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/dra_manager_state"]
        r.check(name + "the kubelet's DRA checkpoint mounted read-only at "
                "<--kubelet-dir>/dra_manager_state (--kubelet-state-file's default), never created",
                state is not None and state["mountPath"] == f"{root}/dra_manager_state"
                and state.get("readOnly") is True and state_types == ["File"],
                f"{state} {state_types}")
        cdi = hm.get("/var/run/cdi")
        r.check(name + "/var/run/cdi mounted read-write at --cdi-root",
                cdi is not None and cdi["mountPath"] == flag(ds, "--cdi-root")
                and not cdi.get("readOnly"), str(cdi))
        r.check(name + "/sys and /dev read-only under the roots (not /dev/infiniband)",
                hm.get("/sys", {}).get("mountPath") == "/host/sys"
                and hm["/sys"].get("readOnly") is True
                and hm.get("/dev", {}).get("mountPath") == "/host/dev"
                and hm["/dev"].get("readOnly") is True
                and "/dev/infiniband" not in hm, str(sorted(hm)))
        pd = hm.get("/proc/driver")
        r.check(name + "/proc/driver read-only at <--proc-root>/proc/driver (GPUDirect RDMA)",
                pd is not None and pd.get("readOnly") is True and flag(ds, "--proc-root")
                and pd["mountPath"] == os.path.join(flag(ds, "--proc-root"), "proc/driver"),
                f"{pd} {flag(ds, '--proc-root')}")
        r.check(name + "nothing of device-plugin mode mounted",
                not ({"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"}
                     & set(hm)), str(sorted(hm)))
        writable = sorted(m["mountPath"] for m in mounts_by_name(ds).values()
                          if not m.get("readOnly"))
        r.check(name + "only the plugin directories, the CDI directory and the allocation "
                "files' directory are writable",
                writable == sorted([f"{root}/plugins", f"{root}/plugins_registry",
                                    flag(ds, "--cdi-root"), ALLOCATIONS]), str(writable))
        check_probe_gets(r, ds, name)
        sc = c.get("securityContext", {})
        r.check(name + "not privileged, no escalation, drops ALL",
                sc.get("privileged") is False and sc.get("allowPrivilegeEscalation") is False
                and sc.get("capabilities", {}).get("drop") == ["ALL"], str(sc))
    roles = [d for d in docs if d.get("kind") == "ClusterRole"]
    rules = sorted((tuple(rule["apiGroups"]), tuple(rule["resources"]), tuple(sorted(rule["verbs"])),
                    tuple(rule.get("resourceNames", ())))
                   for role in roles for rule in role.get("rules", []))
    r.check("DRA: the ClusterRole grants exactly slices CRUD and watch, claims get, claims' status "
            "update (our driver's status.devices entries, on the caller's node only), nodes get, "
            "pods get",
            rules == sorted([(("resource.k8s.io",), ("resourceslices",),
                              ("create", "delete", "get", "list", "update", "watch"), ()),
                             (("resource.k8s.io",), ("resourceclaims",), ("get",), ()),
                             (("resource.k8s.io",), ("resourceclaims/status",), ("update",), ()),
                             (("resource.k8s.io",), ("resourceclaims/driver",),
                              ("associated-node:update",), (DRA_DRIVER,)),
                             (("",), ("nodes",), ("get",), ()),
                             (("",), ("pods",), ("get",), ())]), str(rules))
    bindings = [d for d in docs if d.get("kind") == "ClusterRoleBinding"]
    r.check("DRA: the ClusterRoleBinding binds the role to the ServiceAccount",
            len(bindings) == 1 and len(roles) == 1
            and bindings[0]["roleRef"]["name"] == roles[0]["metadata"]["name"]
            and bindings[0]["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                             "namespace": NAMESPACE}], str(bindings))
    classes = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "DeviceClass"}
    every = classes.get("hca." + DRA_DRIVER, {})
    r.check("DRA: a DeviceClass selecting the driver's physical NICs, for claims, no extended "
            "resource", every.get("apiVersion") == "resource.k8s.io/v1"
            and every.get("spec", {}).get("selectors") == [
                {"cel": {"expression": f'device.driver == "{DRA_DRIVER}" && {NOT_VF}'}}]
            and "extendedResourceName" not in every.get("spec", {}), str(classes))
    # A device-plugin shared unit gives every HCA, one DRA device one HCA: rdma/hca is served by
    # exclusive-mode devices only (docs/dra.md, "Shared mode").
    exclusive = classes.get("hca-exclusive." + DRA_DRIVER, {})
    r.check("DRA: the extended resource's DeviceClass selects exclusive-mode devices only",
            len(classes) == 2 and exclusive.get("apiVersion") == "resource.k8s.io/v1"
            and exclusive.get("spec", {}).get("selectors") == [
                {"cel": {"expression": f'device.driver == "{DRA_DRIVER}" && {NOT_VF} && '
                                       f'device.attributes["{DRA_DRIVER}"].mode == "exclusive"'}}]
            and exclusive["spec"].get("extendedResourceName") == "rdma/hca", str(classes))
    r.check("DRA: the helm test pod (rdma/hca through the DeviceClass)", len(test_pods(docs)) == 1)
    docs = helm.template(dict(DRA_VALUES, test={"mode": "shared"}))
    r.check("DRA: no helm test pod on shared-mode nodes (rdma/hca is not served there)",
            not test_pods(docs))

    docs = helm.template(dict(DRA_VALUES, dra={"driverName": DRA_DRIVER, "deviceClass": {
        "create": True, "extendedResource": False}}))
    classes = [d for d in docs if d.get("kind") == "DeviceClass"]
    r.check("DRA: extendedResource false: one class, without extendedResourceName, no test pod",
            len(classes) == 1 and "extendedResourceName" not in classes[0]["spec"]
            and not test_pods(docs), str(classes))
    docs = helm.template()
    r.check("DRA: device-plugin mode renders no ServiceAccount, RBAC or DeviceClass",
            not [d for d in docs if d.get("kind") in ("ServiceAccount", "ClusterRole",
                                                      "ClusterRoleBinding", "DeviceClass")])
    for label, values in [("an unknown driver", {"driver": "csi"}),
                          ("a driver name that is not a DNS subdomain",
                           dict(DRA_VALUES, dra={"driverName": "RDMA_hca",
                                                 "deviceClass": {"create": True,
                                                                 "extendedResource": True}}))]:
        rc, _, err = helm.run(["template", RELEASE], values)
        r.check(f"DRA: schema rejects {label}", rc != 0 and SCHEMA_ERROR in err,
                f"rc={rc} {err.strip()[:300]}")
    rc, out, err = helm.run(["lint", "--strict"], DRA_VALUES)
    r.check("DRA: lint --strict", rc == 0, (out + err).strip()[-800:])
    notes = helm.notes(DRA_VALUES)
    r.check("DRA: NOTES say how to see the slices",
            f"kubectl get resourceslices --field-selector spec.driver={DRA_DRIVER}" in notes, notes)


def check_metrics(r, helm):
    """metrics (on by default): every mode's pods serve /metrics on the port, declare it and
    carry the scrape annotations; off: none of it; serviceMonitor: a Service over the pods'
    metrics port and a ServiceMonitor selecting it."""
    for label, values in [("default", None), ("DRA", DRA_VALUES)]:
        for mode, ds in sorted(by_mode(helm.template(values)).items()):
            name = f"metrics/{label}/{mode}: "
            c = container(ds)
            annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
            r.check(name + "--metrics-address=0.0.0.0:9478",
                    flag(ds, "--metrics-address") == "0.0.0.0:9478", str(c.get("args")))
            r.check(name + "container port metrics 9478/TCP",
                    c.get("ports") == [{"name": "metrics", "containerPort": 9478,
                                        "protocol": "TCP"}], str(c.get("ports")))
            r.check(name + "prometheus.io scrape annotations",
                    annotations.get("prometheus.io/scrape") == "true"
                    and annotations.get("prometheus.io/port") == "9478"
                    and annotations.get("prometheus.io/path") == "/metrics", str(annotations))
    docs = helm.template({"metrics": {"enabled": False, "port": 9478,
                                      "serviceMonitor": {"enabled": True}},
                          "podAnnotations": {"a": "b"}})
    for mode, ds in sorted(by_mode(docs).items()):
        c = container(ds)
        annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
        r.check(f"metrics/off/{mode}: no flag, port or scrape annotation; podAnnotations kept",
                "--metrics-address" not in flags(ds) and not c.get("ports")
                and annotations == {"a": "b"}, f"{c.get('args')} {c.get('ports')} {annotations}")
    r.check("metrics/off: no Service or ServiceMonitor even when serviceMonitor is on",
            not [d for d in docs if d.get("kind") in ("Service", "ServiceMonitor")])
    r.check("metrics: no ServiceMonitor by default",
            not [d for d in helm.template() if d.get("kind") in ("Service", "ServiceMonitor")])
    docs = helm.template({"metrics": {"enabled": True, "port": 9100, "serviceMonitor": {
        "enabled": True, "interval": "15s", "labels": {"release": "prom"}}}})
    services = [d for d in docs if d.get("kind") == "Service"]
    monitors = [d for d in docs if d.get("kind") == "ServiceMonitor"]
    pods = [ds["spec"]["template"]["metadata"]["labels"] for ds in by_mode(docs).values()]
    ok = len(services) == 1 and len(monitors) == 1
    r.check("metrics/serviceMonitor: one Service and one ServiceMonitor", ok,
            f"{len(services)} {len(monitors)}")
    if ok:
        svc, mon = services[0], monitors[0]
        r.check("metrics/serviceMonitor: the Service selects every mode's pods on the plugin's "
                "and the NRI container's ports",
                all(all(p.get(k) == v for k, v in svc["spec"]["selector"].items()) for p in pods)
                and svc["spec"]["ports"] == [{"name": "metrics", "port": 9100,
                                              "targetPort": "metrics", "protocol": "TCP"},
                                             {"name": "nri-metrics", "port": 9479,
                                              "targetPort": "nri-metrics", "protocol": "TCP"}],
                str(svc["spec"]))
        r.check("metrics/serviceMonitor: selects the Service, both ports, interval and labels "
                "as given",
                all(svc["metadata"]["labels"].get(k) == v
                    for k, v in mon["spec"]["selector"]["matchLabels"].items())
                and [e["port"] for e in mon["spec"]["endpoints"]] == ["metrics", "nri-metrics"]
                and all(e["interval"] == "15s" for e in mon["spec"]["endpoints"])
                and mon["metadata"]["labels"].get("release") == "prom", str(mon))
    docs = helm.template({"metrics": {"enabled": True, "port": 9100, "serviceMonitor": {
        "enabled": True}}, "nri": {"enabled": False}})
    services = [d for d in docs if d.get("kind") == "Service"]
    monitors = [d for d in docs if d.get("kind") == "ServiceMonitor"]
    r.check("metrics/serviceMonitor without NRI: the plugin's port only",
            len(services) == 1 and len(monitors) == 1
            and [p["name"] for p in services[0]["spec"]["ports"]] == ["metrics"]
            and [e["port"] for e in monitors[0]["spec"]["endpoints"]] == ["metrics"],
            f"{services} {monitors}")
    for label, values in [("metrics.port 0", {"metrics": {"enabled": True, "port": 0,
                                                          "serviceMonitor": {"enabled": False}}}),
                          ("metrics.port as a string",
                           {"metrics": {"enabled": True, "port": "9478",
                                        "serviceMonitor": {"enabled": False}}})]:
        rc, _, err = helm.run(["template", RELEASE], values)
        r.check(f"schema rejects {label}", rc != 0 and SCHEMA_ERROR in err, err.strip()[:300])


def check_allocation_files(r, helm):
    """hostPaths.allocations: every mode and driver gets --allocation-dir=<it>, the directory
    mounted read-write at the same path from the host (DirectoryOrCreate); "" or another path
    follow; the NRI container does not mount it."""
    for label, values in [("default", None), ("DRA", DRA_VALUES)]:
        for mode, ds in sorted(by_mode(helm.template(values)).items()):
            name = f"allocation files/{label}/{mode}: "
            m = mounts_by_name(ds).get("allocations")
            r.check(name + "--allocation-dir and the same path mounted read-write",
                    flag(ds, "--allocation-dir") == ALLOCATIONS and m is not None
                    and m["mountPath"] == ALLOCATIONS and not m.get("readOnly"), f"{m}")
            r.check(name + "hostPath DirectoryOrCreate",
                    volumes_by_name(ds).get("allocations", {}).get("hostPath")
                    == {"path": ALLOCATIONS, "type": "DirectoryOrCreate"})
            nri = nri_container(ds)
            r.check(name + "not in the NRI container", nri is None or "allocations" not in
                    [x["name"] for x in nri.get("volumeMounts", [])])
    for label, values in [("default", {}), ("DRA", dict(DRA_VALUES))]:
        for path in ["", "/srv/rdp/alloc"]:
            v = dict(values, hostPaths={"allocations": path})
            for mode, ds in sorted(by_mode(helm.template(v)).items()):
                name = f"allocation files/{label}/{mode}/allocations={path!r}: "
                if path:
                    r.check(name + "flag and mount follow",
                            flag(ds, "--allocation-dir") == path
                            and host_mounts(ds).get(path, {}).get("mountPath") == path)
                else:
                    r.check(name + "no flag, no volume",
                            "--allocation-dir" not in flags(ds)
                            and "allocations" not in volumes_by_name(ds))


def check_metrics_guard(r, helm):
    """Who may read the metrics: a NetworkPolicy by default admitting only the scrape namespaces
    to the metrics port; --metrics-allow from metrics.allow; with metrics.proxy the plugin binds
    127.0.0.1 and a kube-rbac-proxy sidecar with exactly the RBAC it needs serves the port."""
    for label, values in [("default", None), ("DRA", DRA_VALUES)]:
        docs = helm.template(values)
        policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
        pods = [ds["spec"]["template"]["metadata"]["labels"] for ds in by_mode(docs).values()]
        ok = len(policies) == 1
        r.check(f"metrics/{label}: one NetworkPolicy by default", ok, str(len(policies)))
        if ok:
            spec = policies[0]["spec"]
            selects = spec["podSelector"]["matchLabels"]
            r.check(f"metrics/{label}: the NetworkPolicy selects every mode's pods",
                    all(all(p.get(k) == v for k, v in selects.items()) for p in pods), str(selects))
            r.check(f"metrics/{label}: only the monitoring namespace, only the metrics ports "
                    "(the plugin's and the NRI container's)",
                    spec["policyTypes"] == ["Ingress"] and spec["ingress"] == [{
                        "from": [{"namespaceSelector": {"matchExpressions": [{
                            "key": "kubernetes.io/metadata.name", "operator": "In",
                            "values": ["monitoring"]}]}}],
                        "ports": [{"port": "metrics", "protocol": "TCP"},
                                  {"port": "nri-metrics", "protocol": "TCP"}]}], str(spec))
    docs = helm.template({"nri": {"enabled": False}})
    policy = [d for d in docs if d.get("kind") == "NetworkPolicy"][0]
    r.check("metrics: without NRI only the plugin's metrics port",
            policy["spec"]["ingress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}],
            str(policy["spec"]))
    docs = helm.template({"metrics": {"enabled": True, "port": 9478,
                                      "serviceMonitor": {"enabled": False},
                                      "networkPolicy": {"enabled": True,
                                                        "scrapeNamespaces": ["prom", "ops"]}}})
    policy = [d for d in docs if d.get("kind") == "NetworkPolicy"][0]
    r.check("metrics: scrapeNamespaces are the admitted namespaces",
            policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchExpressions"][0]
            ["values"] == ["prom", "ops"], str(policy["spec"]))
    docs = helm.template({"metrics": {"enabled": True, "port": 9478,
                                      "serviceMonitor": {"enabled": False},
                                      "networkPolicy": {"enabled": False}}})
    r.check("metrics: networkPolicy.enabled=false renders none",
            not [d for d in docs if d.get("kind") == "NetworkPolicy"])
    docs = helm.template({"metrics": {"enabled": True, "port": 9478,
                                      "serviceMonitor": {"enabled": False},
                                      "allow": ["10.0.0.0/8", "192.168.0.7"]}})
    for mode, ds in sorted(by_mode(docs).items()):
        r.check(f"metrics/{mode}: metrics.allow is --metrics-allow",
                flag(ds, "--metrics-allow") == "10.0.0.0/8,192.168.0.7", str(flags(ds)))
    r.check("metrics: no --metrics-allow by default",
            all("--metrics-allow" not in flags(ds) for ds in by_mode(helm.template()).values()))
    rc, _, err = helm.run(["template", RELEASE], {"metrics": {
        "enabled": True, "port": 9478, "serviceMonitor": {"enabled": False}, "allow": ["pods"]}})
    r.check("schema rejects metrics.allow that is no CIDR", rc != 0 and SCHEMA_ERROR in err,
            err.strip()[:300])

    proxy = {"metrics": {"enabled": True, "port": 9478, "serviceMonitor": {"enabled": True},
                         "proxy": {"enabled": True, "image": "proxy.example/krp:v1",
                                   "upstreamPort": 9480}}}
    for label, values in [("proxy", proxy), ("proxy/DRA", dict(proxy, **DRA_VALUES))]:
        docs = helm.template(values)
        for mode, ds in sorted(by_mode(docs).items()):
            name = f"metrics/{label}/{mode}: "
            spec = pod_spec(ds)
            sidecars = [c for c in spec["containers"] if c["name"] == "metrics-proxy"]
            r.check(name + "the plugin binds 127.0.0.1:9480 and declares no port",
                    flag(ds, "--metrics-address") == "127.0.0.1:9480"
                    and not container(ds).get("ports"), str(flags(ds)))
            ok = len(sidecars) == 1
            r.check(name + "one kube-rbac-proxy sidecar", ok, str([c["name"] for c in
                                                                   spec["containers"]]))
            if ok:
                s = sidecars[0]
                r.check(name + "the sidecar serves metrics.port over TLS from the upstream",
                        s["image"] == "proxy.example/krp:v1"
                        and "--secure-listen-address=0.0.0.0:9478" in s["args"]
                        and "--upstream=http://127.0.0.1:9480/" in s["args"]
                        and s["ports"] == [{"name": "metrics", "containerPort": 9478,
                                            "protocol": "TCP"}]
                        and s["securityContext"]["allowPrivilegeEscalation"] is False, str(s))
            r.check(name + "a ServiceAccount with its token",
                    spec.get("serviceAccountName") == f"{RELEASE}-rdma-device-plugin"
                    or spec.get("serviceAccountName", "").endswith("rdma-device-plugin")
                    and spec.get("automountServiceAccountToken") is True, str(spec.get(
                        "serviceAccountName")))
        roles = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ClusterRole"}
        proxy_roles = [d for n, d in roles.items() if n.endswith("-metrics-proxy")]
        r.check(f"metrics/{label}: the proxy's ClusterRole creates token and access reviews only",
                len(proxy_roles) == 1 and proxy_roles[0]["rules"] == [
                    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
                     "verbs": ["create"]},
                    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
                     "verbs": ["create"]}], str(proxy_roles))
        accounts = [d for d in docs if d.get("kind") == "ServiceAccount"]
        r.check(f"metrics/{label}: exactly one ServiceAccount", len(accounts) == 1,
                str(len(accounts)))
        monitors = [d for d in docs if d.get("kind") == "ServiceMonitor"]
        r.check(f"metrics/{label}: the ServiceMonitor scrapes https with its token",
                len(monitors) == 1 and monitors[0]["spec"]["endpoints"][0].get("scheme") == "https"
                and "bearerTokenFile" in monitors[0]["spec"]["endpoints"][0], str(monitors))
    r.check("metrics: no proxy sidecar by default",
            all("metrics-proxy" not in [c["name"] for c in pod_spec(ds)["containers"]]
                for ds in by_mode(helm.template()).values()))


def documented_metrics():
    """The metric names of docs/metrics.md's table, and which of them are histograms."""
    names, histograms = set(), set()
    with open(os.path.join(REPO, "docs", "metrics.md")) as f:
        for line in f:
            m = re.match(r"^\| `([a-z_]+)` \| (\w+)", line)
            if m and not m.group(1).startswith("-"):
                names.add("rdma_device_plugin_" + m.group(1))
                if m.group(2) == "histogram":
                    histograms.add("rdma_device_plugin_" + m.group(1))
    return names, histograms


def source_metric_suffixes():
    """Every quoted metric name or Name("...") suffix in the product's C++ sources
    (every module with a CMakeLists.txt but the tests, the simulator and the benchmarks)."""
    found = set()
    product = [d for d in sorted(os.listdir(REPO))
               if os.path.isfile(os.path.join(REPO, d, "CMakeLists.txt"))
               and d not in ("test", "sim", "bench")]
    for d in product:
        for root, _, files in os.walk(os.path.join(REPO, d)):
            for name in files:
                if name.endswith((".cc", ".h")):
                    with open(os.path.join(root, name)) as f:
                        text = f.read()
                    found |= set(re.findall(r'"rdma_device_plugin_([a-z_]+)"', text))
                    found |= set(re.findall(r'Name\("([a-z_]+)"\)', text))
                    found |= set(re.findall(r'\{"[a-z_]+", "([a-z_]+)",', text))  # port counters
                    found |= set(re.findall(r'WriteCounter\(out, "([a-z_]+)"', text))
    return {"rdma_device_plugin_" + s for s in found}


def check_dashboard(r, helm):
    """The Grafana dashboard (dashboards/rdma-device-plugin.json) loads, every metric its queries
    name is one we export (documented in docs/metrics.md and written by the sources; a
    histogram's _bucket/_sum/_count of a documented histogram), it shows per-pod HCA traffic,
    health and alignment, and metrics.grafanaDashboard ships it as a ConfigMap unchanged."""
    path = os.path.join(helm.chart, "dashboards", "rdma-device-plugin.json")
    with open(path) as f:
        text = f.read()
    dash = json.loads(text)
    exprs = []
    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if "expr" in t)
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    r.check("dashboard: has queries", len(exprs) >= 10, str(len(exprs)))
    documented, histograms = documented_metrics()
    in_sources = source_metric_suffixes()
    used = set()
    for e in exprs:
        used |= set(re.findall(r"rdma_device_plugin_[a-z_]+", e))
    for name in sorted(used):
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in histograms:
                base = name[: -len(suffix)]
        r.check(f"dashboard: {name} is a documented metric", base in documented)
        r.check(f"dashboard: {name} is written by the sources", base in in_sources)
    titles = " ".join(p.get("title", "") for p in dash["panels"]).lower()
    r.check("dashboard: per-pod traffic, health and alignment",
            "rdma_device_plugin_hca_allocated" in used and "by pod" in titles
            and "rdma_device_plugin_hca_healthy" in used
            and "rdma_device_plugin_allocation_alignment_total" in used, titles)
    r.check("dashboard: every query reads the chosen data source",
            all(p.get("datasource", {}).get("uid") == "${datasource}"
                for p in dash["panels"] if p.get("type") != "row"))
    r.check("dashboard: no ConfigMap by default",
            not [d for d in helm.template() if d.get("kind") == "ConfigMap"])
    docs = helm.template({"metrics": {"enabled": True, "port": 9478,
                                      "serviceMonitor": {"enabled": False},
                                      "grafanaDashboard": {"enabled": True}}})
    maps = [d for d in docs if d.get("kind") == "ConfigMap"]
    r.check("dashboard: grafanaDashboard ships the JSON in a labelled ConfigMap",
            len(maps) == 1 and maps[0]["metadata"]["labels"].get("grafana_dashboard") == "1"
            and json.loads(maps[0]["data"]["rdma-device-plugin.json"]) == dash, str(len(maps)))


def check_nri(r, helm):
    """nri (on by default): every pod of every mode and driver has a second container running
    `rdma-device-plugin nri` with the runtime's NRI socket directory mounted from the host, as
    little privilege as the plugin's, its metrics port; values change its flags and mount; off:
    no container and no volume; the schema rejects bad values."""
    want_args = ["nri", "--nri-socket=/var/run/nri/nri.sock", "--memlock=unlimited",
                 "--nri-plugin-index=50", "--metrics-address=0.0.0.0:9479"]
    for label, values in [("default", None), ("DRA", DRA_VALUES)]:
        for mode, ds in sorted(by_mode(helm.template(values)).items()):
            name = f"nri/{label}/{mode}: "
            c = nri_container(ds)
            if not r.check(name + "a container named nri", c is not None,
                           str([x["name"] for x in pod_spec(ds)["containers"]])):
                continue
            r.check(name + "runs nri with the default flags", c.get("args") == want_args,
                    str(c.get("args")))
            r.check(name + "the plugin's image", c["image"] == container(ds)["image"])
            sc = c.get("securityContext", {})
            r.check(name + "least privilege: root, no capability, no escalation, read-only root",
                    sc.get("privileged") is False and sc.get("allowPrivilegeEscalation") is False
                    and sc.get("capabilities") == {"drop": ["ALL"]}
                    and sc.get("readOnlyRootFilesystem") is True and sc.get("runAsUser") == 0,
                    str(sc))
            volumes = volumes_by_name(ds)
            mounts = c.get("volumeMounts", [])
            r.check(name + "mounts only the socket's directory, /var/run/nri from the host "
                    "(DirectoryOrCreate)",
                    [(m["name"], m["mountPath"]) for m in mounts] == [("nri", "/var/run/nri")]
                    and volumes.get("nri", {}).get("hostPath")
                    == {"path": "/var/run/nri", "type": "DirectoryOrCreate"},
                    f"{mounts} {volumes.get('nri')}")
            r.check(name + "port nri-metrics 9479/TCP",
                    c.get("ports") == [{"name": "nri-metrics", "containerPort": 9479,
                                        "protocol": "TCP"}], str(c.get("ports")))
            resources = c.get("resources", {})
            r.check(name + "requests cpu and memory, limits memory",
                    {"cpu", "memory"} <= set(resources.get("requests", {}))
                    and "memory" in resources.get("limits", {}), str(resources))
            unknown = sorted({a.partition("=")[0] for a in c["args"][1:]} - KNOWN_NRI_FLAGS)
            r.check(name + "only flags nri knows", not unknown, str(unknown))
    docs = helm.template({"nri": {"enabled": True, "memlock": "64Gi",
                                  "socket": "/run/containerd/nri/nri.sock", "pluginIndex": "10",
                                  "metricsPort": 9500},
                          "logLevel": "debug"})
    for mode, ds in sorted(by_mode(docs).items()):
        c = nri_container(ds)
        r.check(f"nri/values/{mode}: flags follow the values",
                c is not None and c["args"] == [
                    "nri", "--nri-socket=/run/containerd/nri/nri.sock", "--memlock=64Gi",
                    "--nri-plugin-index=10", "--log-level=debug",
                    "--metrics-address=0.0.0.0:9500"],
                str(c and c["args"]))
        r.check(f"nri/values/{mode}: mounts the socket's directory",
                c is not None and c["volumeMounts"][0]["mountPath"] == "/run/containerd/nri"
                and volumes_by_name(ds)["nri"]["hostPath"]["path"] == "/run/containerd/nri")
    docs = helm.template({"nri": {"enabled": True, "memlock": "unlimited",
                                  "socket": "/var/run/nri/nri.sock", "pluginIndex": "50",
                                  "metricsPort": 9479},
                          "metrics": {"enabled": False, "port": 9478,
                                      "serviceMonitor": {"enabled": False}}})
    for mode, ds in sorted(by_mode(docs).items()):
        c = nri_container(ds)
        r.check(f"nri/metrics off/{mode}: no --metrics-address, no port",
                c is not None and "--metrics-address=0.0.0.0:9479" not in c["args"]
                and not c.get("ports"), str(c))
    for mode, ds in sorted(by_mode(helm.template({"nri": {"enabled": False, "memlock": "unlimited",
                                                          "socket": "/var/run/nri/nri.sock",
                                                          "pluginIndex": "50",
                                                          "metricsPort": 9479}})).items()):
        r.check(f"nri.enabled=false/{mode}: one container, no nri volume",
                [c["name"] for c in pod_spec(ds)["containers"]] == ["rdma-device-plugin"]
                and "nri" not in volumes_by_name(ds))
    for label, nri in [("nri.memlock 0", {"memlock": "0"}),
                       ("nri.memlock lots", {"memlock": "lots"}),
                       ("nri.memlock 8M", {"memlock": "8M"}),
                       ("nri.pluginIndex 5", {"pluginIndex": "5"}),
                       ("nri.pluginIndex as a number", {"pluginIndex": 50}),
                       ("a relative nri.socket", {"socket": "run/nri/nri.sock"}),
                       ("nri.enabled as a string", {"enabled": "yes"})]:
        values = {"nri": dict({"enabled": True, "memlock": "unlimited",
                               "socket": "/var/run/nri/nri.sock", "pluginIndex": "50",
                               "metricsPort": 9479}, **nri)}
        rc, _, err = helm.run(["template", RELEASE], values)
        r.check(f"schema rejects {label}", rc != 0 and SCHEMA_ERROR in err,
                f"rc={rc} {err.strip()[:300]}")


def check_notes(r, helm):
    notes = helm.notes()
    r.check("NOTES: how to label a node",
            f'kubectl label node <node> {DEFAULT_KEY}="true"' in notes, notes[:400])
    r.check("NOTES: kubelet policies",
            "cpuManagerPolicy: static" in notes and "topologyManagerPolicy: best-effort" in notes)
    r.check("NOTES: how to verify", "kubectl describe node <node> | grep rdma/hca" in notes)
    r.check("NOTES: the MOFED hazard", "MOFED" in notes)
    r.check("NOTES: Pod Security (privileged, and how a refusal shows)",
            "pod-security.kubernetes.io/enforce=privileged" in notes
            and "violates PodSecurity" in notes)
    r.check("NOTES: the log lines of both modes",
            all(line in notes for line in ['"hca-exclusive mode"', '"hca-shared mode"',
                                           '"Registered device plugin with Kubelet"']))
    r.check("NOTES: the mode-switch hazard", "Switch a node's mode only when" in notes)
    r.check("NOTES: only nodes with RDMA NICs, and how to list them",
            "They run only on nodes with RDMA NICs" in notes
            and "kubectl get nodes -l feature.node.kubernetes.io/pci-15b3.present=true" in notes,
            notes[:600])
    r.check("NOTES: rdmaNodeLabels=[] says nothing of it",
            "They run only on nodes with RDMA NICs" not in helm.notes({"rdmaNodeLabels": []}))
    r.check("NOTES: every RDMA NIC label, with how to list its nodes",
            all(f"kubectl get nodes -l {label}=true" in notes for label in RDMA_NODE_LABELS))
    shared_only = helm.notes({"modes": ["shared"]})
    r.check("NOTES: shared-only does not tell to label nodes",
            "kubectl label node" not in shared_only)
    exclusive_only = helm.notes({"modes": ["exclusive"]})
    r.check("NOTES: exclusive-only says unlabelled nodes run no plugin",
            "nodes without the label run no plugin" in exclusive_only)


# Two resources in the config file's format (docs/config.md): compute rails and storage NICs.
TWO_RESOURCES = [
    {"name": "rdma/hca", "selector": {"linkLayers": ["infiniband"], "numaNodes": [0, 1]}},
    {"name": "rdma/storage", "sharedDevices": 64,
     "selector": {"vendors": ["15B3"], "deviceIDs": ["1021"], "drivers": ["mlx5_core"],
                  "linkLayers": ["Ethernet"], "hcaNames": ["mlx5_*"], "netdevs": ["ens*np?"],
                  "pciAddresses": ["0000:2B:00.0", "2c:00.0"],
                  "virtualFunctions": "include"}},
]
CONFIG_PATH = "/etc/rdma-device-plugin/config.json"


def config_maps(docs):
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}


def check_config_mount(r, ds, name, path, config_map):
    """--config=<path>, the volume `config` of ConfigMap `config_map` mounted read-only there."""
    mount = mounts_by_name(ds).get("config", {})
    volume = volumes_by_name(ds).get("config", {})
    r.check(name + f"--config={path}", flag(ds, "--config") == path, str(flags(ds)))
    r.check(name + "the config's directory is mounted read-only",
            mount.get("mountPath") == os.path.dirname(path) and mount.get("readOnly") is True,
            str(mount))
    r.check(name + f"from the ConfigMap {config_map}",
            volume.get("configMap", {}).get("name") == config_map, str(volume))


def check_resources(r, helm):
    """rdmaResources: the ConfigMap holds them as the config file, each DaemonSet mounts it,
    passes --config and rolls when it changes; rdmaConfigMap mounts a ConfigMap of one's own;
    nothing of it without them; the template's own checks and the schema refuse bad values."""
    fullname = f"{RELEASE}-rdma-device-plugin"
    docs = helm.template({"rdmaResources": TWO_RESOURCES})
    cm = config_maps(docs).get(f"{fullname}-config", {})
    text = cm.get("data", {}).get("config.json", "")
    try:
        parsed = json.loads(text)
    except ValueError as e:
        parsed = f"not JSON: {e}"
    r.check("resources: the ConfigMap holds the config file as JSON (every build reads it), "
            "resources as given", parsed == {"resources": TWO_RESOURCES}, text)
    checksum = hashlib.sha256(text.rstrip("\n").encode()).hexdigest()
    for mode, ds in sorted(by_mode(docs).items()):
        name = f"resources/{mode}: "
        check_config_mount(r, ds, name, CONFIG_PATH, f"{fullname}-config")
        annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
        r.check(name + "the pods carry the config's sha256",
                annotations.get("checksum/config") == checksum, str(annotations))
        r.check(name + "--resource-name is still given (the default the config replaces)",
                flag(ds, "--resource-name") == "rdma/hca", str(flags(ds)))
    for mode, ds in sorted(by_mode(helm.template(dict(NO_METRICS,
                                                      rdmaResources=TWO_RESOURCES))).items()):
        command = probe_commands(ds)["livenessProbe"] or []
        r.check(f"resources/{mode}: the exec'd probe reads the same file (every resource's "
                "socket)", f"--config={CONFIG_PATH}" in command, str(command))
    changed = [dict(TWO_RESOURCES[0]), dict(TWO_RESOURCES[1], sharedDevices=32)]
    other = {ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
             for ds in by_mode(helm.template({"rdmaResources": changed})).values()}
    r.check("resources: another config, another checksum (the DaemonSets roll)",
            len(other) == 1 and checksum not in other, str(other))

    docs = helm.template()
    r.check("resources: none given: no ConfigMap of the config",
            f"{fullname}-config" not in config_maps(docs), str(sorted(config_maps(docs))))
    for mode, ds in sorted(by_mode(docs).items()):
        annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
        r.check(f"resources/default/{mode}: no --config, config volume or checksum",
                "--config" not in flags(ds) and "config" not in volumes_by_name(ds)
                and "checksum/config" not in annotations, str(flags(ds)))

    docs = helm.template({"rdmaConfigMap": {"name": "rdma-devices"}})
    r.check("resources: rdmaConfigMap renders no ConfigMap of its own",
            f"{fullname}-config" not in config_maps(docs), str(sorted(config_maps(docs))))
    for mode, ds in sorted(by_mode(docs).items()):
        check_config_mount(r, ds, f"resources/rdmaConfigMap/{mode}: ",
                           "/etc/rdma-device-plugin/config.json", "rdma-devices")

    for label, values, message in [
            ("both rdmaResources and rdmaConfigMap",
             {"rdmaResources": TWO_RESOURCES, "rdmaConfigMap": {"name": "rdma-devices"}},
             "rdmaResources and rdmaConfigMap.name are both set"),
            ("rdmaConfigMap with driver: dra",
             dict(DRA_VALUES, rdmaConfigMap={"name": "rdma-devices"}),
             "rdmaConfigMap is for driver: deviceplugin"),
            ("a resource name twice",
             {"rdmaResources": [{"name": "rdma/hca"}, {"name": "rdma/x"}, {"name": "rdma/hca"}]},
             "rdmaResources[2].name rdma/hca: rdmaResources[0] has the same name"),
            ("two names with one DeviceClass name",
             {"rdmaResources": [{"name": "rdma/a.b"}, {"name": "rdma/a_b"}]},
             "(or the same DeviceClass name, rdma-a-b)")]:
        rc, _, err = helm.run(["template", RELEASE], values)
        r.check(f"resources: refuses {label}", rc != 0 and message in err,
                f"rc={rc} {err.strip()[:300]}")
    for label, resource in [
            ("an unknown selector key", {"name": "rdma/a", "selector": {"linkLayer": ["IB"]}}),
            ("an unknown link layer", {"name": "rdma/a", "selector": {"linkLayers": ["IB"]}}),
            ("a vendor with 0x", {"name": "rdma/a", "selector": {"vendors": ["0x15b3"]}}),
            ("virtualFunctions: all", {"name": "rdma/a", "selector": {"virtualFunctions": "all"}}),
            ("a PCI address without a function", {"name": "rdma/a",
                                                  "selector": {"pciAddresses": ["1a:00"]}}),
            ("a negative NUMA node", {"name": "rdma/a", "selector": {"numaNodes": [-1]}}),
            ("sharedDevices 0", {"name": "rdma/a", "sharedDevices": 0}),
            ("a name without a domain", {"name": "hca"}),
            ("a scalar where a list is expected", {"name": "rdma/a",
                                                   "selector": {"drivers": "mlx5_core"}})]:
        rc, _, err = helm.run(["template", RELEASE], {"rdmaResources": [resource]})
        r.check(f"resources: schema rejects {label}", rc != 0 and SCHEMA_ERROR in err,
                f"rc={rc} {err.strip()[:300]}")


def cel_regexes(expression, attribute):
    """The regexes of `<attribute>.matches("...")` in a CEL expression, as Python strings."""
    return [json.loads(m) for m in
            re.findall(re.escape(attribute) + r'\.matches\(("(?:[^"\\]|\\.)*")\)', expression)]


def check_resource_device_classes(r, helm):
    """driver: dra with rdmaResources: one DeviceClass per resource (and one extended-resource
    class each), whose CEL is the resource's selector over the driver's attributes; globs become
    anchored regexes that match what fnmatch matches, never across a netdevs comma."""
    docs = helm.template(dict(DRA_VALUES, rdmaResources=TWO_RESOURCES))
    classes = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "DeviceClass"}
    r.check("resources/DRA: the default class, and two classes and two extended classes",
            sorted(classes) == sorted(f"{c}.{DRA_DRIVER}" for c in [
                "hca", "rdma-hca", "rdma-storage", "rdma-hca-exclusive",
                "rdma-storage-exclusive"]), str(sorted(classes)))
    r.check("resources/DRA: no config file in DRA mode (the classes carry the selectors)",
            not config_maps(docs) and all("--config" not in flags(ds)
                                          for ds in by_mode(docs).values()))

    def expression(name):
        spec = classes.get(f"{name}.{DRA_DRIVER}", {}).get("spec", {})
        return spec.get("selectors", [{}])[0].get("cel", {}).get("expression", "")

    hca = (f'device.driver == "{DRA_DRIVER}" && {NOT_VF} && '
           f'(has({OWN}.linkLayer) && {OWN}.linkLayer in ["InfiniBand"]) && '
           f'(has({STD}.numaNode) && {STD}.numaNode in [0, 1])')
    r.check("resources/DRA: rdma/hca's CEL: physical, InfiniBand (canonical case), NUMA 0 or 1",
            expression("rdma-hca") == hca, expression("rdma-hca"))
    storage = expression("rdma-storage")
    for term in [f'device.driver == "{DRA_DRIVER}"',
                 f'(has({OWN}.pciVendorID) && {OWN}.pciVendorID in ["15b3"])',
                 f'(has({OWN}.pciDeviceID) && {OWN}.pciDeviceID in ["1021"])',
                 f'(has({OWN}.driver) && {OWN}.driver in ["mlx5_core"])',
                 f'(has({OWN}.linkLayer) && {OWN}.linkLayer in ["Ethernet"])',
                 f'(has({OWN}.hcaName) && {OWN}.hcaName.matches("^(?:mlx5_[^,]*)$"))',
                 f'(has({OWN}.netdevs) && '
                 f'{OWN}.netdevs.matches("(?:^|,)(?:ens[^,]*np[^,])(?:,|$)"))',
                 f'(has({STD}.pciBusID) && ({STD}.pciBusID == "0000:2b:00.0" || '
                 f'{STD}.pciBusID.endsWith(":2c:00.0")))']:
        r.check(f"resources/DRA: rdma/storage's CEL has {term[:60]}...", term in storage, storage)
    r.check("resources/DRA: rdma/storage includes VFs (no virtualFunction term)",
            "virtualFunction" not in storage, storage)
    for res in ("rdma/hca", "rdma/storage"):
        slug = res.replace("/", "-")
        spec = classes.get(f"{slug}-exclusive.{DRA_DRIVER}", {}).get("spec", {})
        r.check(f"resources/DRA: {res}'s extended class: its selector, exclusive mode only",
                spec.get("extendedResourceName") == res
                and expression(f"{slug}-exclusive") == expression(slug) + " && "
                f'{OWN}.mode == "exclusive"', str(spec))

    only = helm.template(dict(DRA_VALUES, rdmaResources=[
        {"name": "rdma/vf", "selector": {"virtualFunctions": "only"}}]))
    vf = [d["spec"]["selectors"][0]["cel"]["expression"] for d in only
          if d.get("kind") == "DeviceClass" and d["metadata"]["name"] == f"rdma-vf.{DRA_DRIVER}"]
    r.check("resources/DRA: virtualFunctions only: VFs only",
            vf == [f'device.driver == "{DRA_DRIVER}" && '
                   f'(has({OWN}.virtualFunction) && {OWN}.virtualFunction)'], str(vf))

    # Globs as the template translates them, evaluated as RE2 would (Python's re agrees on
    # these constructs) against fnmatch, the device plugin's own matcher.
    globs = ["mlx5_*", "ens?f*np*", "ib[0-3]", "ib[!0]", "a.b*", "x+y(z)", "*"]
    names = ["mlx5_0", "mlx5_10", "mlx4_0", "ens1f0np0", "ens10f0np0", "ensXf1np1", "ib0", "ib3",
             "ib4", "ib10", "a.bc", "axbc", "x+y(z)", "xxy(z)", "",
             # Two that no glob above matches, but "ens?f*np*" would across their comma.
             "ens1f0", "xnp0"]
    values = dict(DRA_VALUES, rdmaResources=[{"name": f"rdma/g{i}", "selector": {
        "hcaNames": [g], "netdevs": [g]}} for i, g in enumerate(globs)])
    docs = helm.template(values)
    by_name = {d["metadata"]["name"]: d["spec"]["selectors"][0]["cel"]["expression"]
               for d in docs if d.get("kind") == "DeviceClass"}
    for i, glob in enumerate(globs):
        expr = by_name.get(f"rdma-g{i}.{DRA_DRIVER}", "")
        hca_re = cel_regexes(expr, f"{OWN}.hcaName")
        netdev_re = cel_regexes(expr, f"{OWN}.netdevs")
        if not r.check(f"resources/DRA: glob {glob!r} becomes one regex per attribute",
                       len(hca_re) == 1 and len(netdev_re) == 1, expr):
            continue
        wrong = [n for n in names
                 if bool(re.search(hca_re[0], n)) != fnmatch.fnmatchcase(n, glob)]
        r.check(f"resources/DRA: hcaName regex {hca_re[0]!r} matches as fnmatch {glob!r}",
                not wrong, str(wrong))
        wrong = [(a, b) for a in names for b in names if a and b
                 if bool(re.search(netdev_re[0], f"{a},{b}"))
                 != (fnmatch.fnmatchcase(a, glob) or fnmatch.fnmatchcase(b, glob))]
        r.check(f"resources/DRA: netdevs regex {netdev_re[0]!r} matches an item, not across ','",
                not wrong, str(wrong[:5]))


def policies(docs):
    """{name: (ValidatingAdmissionPolicy, its binding or None)}."""
    bindings = {d["spec"]["policyName"]: d for d in docs
                if d.get("kind") == "ValidatingAdmissionPolicyBinding"}
    return {d["metadata"]["name"]: (d, bindings.get(d["metadata"]["name"]))
            for d in docs if d.get("kind") == "ValidatingAdmissionPolicy"}


def pod_rules(docs):
    return [rule for d in docs if d.get("kind") == "ClusterRole" for rule in d.get("rules", [])
            if "pods" in rule.get("resources", ())]


def check_dra_least_privilege(r, helm):
    """DRA mode's least privilege (docs/dra.md, "Least privilege"): the ValidatingAdmissionPolicies
    that bind the driver's ResourceSlice and claim-status writes to its token's node, each with
    a Deny binding, on by default and off by value; pod reads (RBAC get pods and the driver's
    --read-pods) on by default, off by value, and on when the values lack the keys (a release's
    values from before the chart had them, reused by helm upgrade --reuse-values)."""
    fullname = f"{RELEASE}-rdma-device-plugin"
    username = f"system:serviceaccount:{NAMESPACE}:{fullname}"
    docs = helm.template(DRA_VALUES)
    got = policies(docs)
    slices_name, claims_name = f"{fullname}-dra-slices", f"{fullname}-dra-claim-status"
    r.check("DRA: two policies by default, the slices' and the claims' status",
            sorted(got) == sorted([slices_name, claims_name]), str(sorted(got)))
    for name, (policy, binding) in sorted(got.items()):
        spec = policy["spec"]
        r.check(f"DRA/{name}: fails closed, matches the driver's ServiceAccount only, bound with Deny",
                spec.get("failurePolicy") == "Fail"
                and [c["expression"].strip() for c in spec.get("matchConditions", [])]
                == [f'request.userInfo.username == "{username}"']
                and binding is not None and binding["spec"].get("validationActions") == ["Deny"],
                json.dumps(spec.get("matchConditions")) + " " + str(binding))
    policy = got.get(claims_name, ({}, None))[0].get("spec", {})
    rules = policy.get("matchConstraints", {}).get("resourceRules", [])
    r.check("DRA/claim status: matches UPDATE of resourceclaims/status, every version",
            rules == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                       "operations": ["UPDATE"], "resources": ["resourceclaims/status"]}],
            str(rules))
    text = json.dumps(policy)
    r.check("DRA/claim status: the token's node against the allocation's node selector "
            "(metadata.name In [node]), before and after the write, and only our driver's entries",
            "authentication.kubernetes.io/node-name" in text and "oldObject" in text
            and "nodeSelectorTerms" in text and "metadata.name" in text
            and f"d.driver != '{DRA_DRIVER}'" in text and "reservedFor" in text, text[:400])
    for mode, ds in sorted(by_mode(docs).items()):
        r.check(f"DRA/{mode}: pods read by default (no --read-pods flag)",
                flag(ds, "--read-pods") is None, str(container(ds).get("args")))
    r.check("DRA: get pods granted by default", len(pod_rules(docs)) == 1, str(pod_rules(docs)))

    docs = helm.template(dict(DRA_VALUES, dra={"readPods": False}))
    r.check("DRA/readPods=false: no RBAC on pods", not pod_rules(docs), str(pod_rules(docs)))
    for mode, ds in sorted(by_mode(docs).items()):
        r.check(f"DRA/{mode}/readPods=false: the driver runs with --read-pods=false",
                flag(ds, "--read-pods") == "false", str(container(ds).get("args")))
    docs = helm.template(dict(DRA_VALUES, dra={"restrictSliceWrites": False,
                                               "restrictClaimStatusWrites": False}))
    r.check("DRA: both policies off by value: no policy, no binding",
            not [d for d in docs if d.get("kind", "").startswith("ValidatingAdmissionPolicy")])
    docs = helm.template(dict(DRA_VALUES, dra={"readPods": None, "restrictClaimStatusWrites": None}))
    r.check("DRA: values without readPods and restrictClaimStatusWrites: pods read, claim policy on",
            len(pod_rules(docs)) == 1 and claims_name in policies(docs)
            and all(flag(ds, "--read-pods") is None for ds in by_mode(docs).values()),
            str(sorted(policies(docs))))
    for key in ("readPods", "restrictClaimStatusWrites"):
        rc, _, err = helm.run(["template", RELEASE], dict(DRA_VALUES, dra={key: "yes"}))
        r.check(f"DRA: schema rejects a dra.{key} that is not a boolean",
                rc != 0 and SCHEMA_ERROR in err, f"rc={rc} {err.strip()[:300]}")


def check_against_binary(r, helm, binary):
    """The rendered command lines parse with the real binary: every serve flag is one it lists
    in `serve --help`, the probe command reaches the probe (exit 1: nothing serves its socket
    here) rather than a usage error (exit 2), and the test hook's `check` subcommand exists."""
    def run(argv):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return proc.returncode, proc.stdout + proc.stderr

    rc, out = run([binary, "serve", "--help"])
    accepted = set(re.findall(r"(--[a-z][a-z0-9-]*)", out))
    r.check("binary: serve --help lists its flags", rc == 0 and "--mode" in accepted, out[:300])
    docs = helm.template()
    for mode, ds in sorted(by_mode(docs).items()):
        unknown = sorted(set(flags(ds)) - accepted)
        ds = by_mode(helm.template(NO_METRICS))[mode]  # the exec'd probe command
        r.check(f"binary/{mode}: every rendered flag is one serve accepts", not unknown,
                str(unknown))
        command = probe_commands(ds)["livenessProbe"]
        rc, out = run([binary] + command[1:])
        r.check(f"binary/{mode}: the probe command parses (exit 1 without a plugin, not 2)",
                rc == 1, f"rc={rc} {out.strip()[:300]}")
    rc, out = run([binary, "dra", "--help"])
    dra_accepted = set(re.findall(r"(--[a-z][a-z0-9-]*)", out))
    r.check("binary: dra --help lists its flags", rc == 0 and "--driver-name" in dra_accepted,
            out[:300])
    for mode, ds in sorted(by_mode(helm.template(DRA_VALUES)).items()):
        unknown = sorted(set(flags(ds)) - dra_accepted)
        ds = by_mode(helm.template(dict(NO_METRICS, **DRA_VALUES)))[mode]
        r.check(f"binary/DRA/{mode}: every rendered flag is one dra accepts", not unknown,
                str(unknown))
        # The rendered command with its kubelet directory moved to an empty one: what answers
        # under this machine's /var/lib/kubelet is not the test's business.
        command = [f"--kubelet-dir={helm.tmp}/no-kubelet" if c.startswith("--kubelet-dir=") else c
                   for c in probe_commands(ds)["livenessProbe"]]
        rc, out = run([binary] + command[1:])
        r.check(f"binary/DRA/{mode}: the probe command parses (exit 1 without a driver, not 2)",
                rc == 1, f"rc={rc} {out.strip()[:300]}")
    rc, out = run([binary, "nri", "--help"])
    nri_accepted = set(re.findall(r"(--[a-z][a-z0-9-]*)", out))
    r.check("binary: nri --help lists its flags", rc == 0 and "--memlock" in nri_accepted,
            out[:300])
    for mode, ds in sorted(by_mode(docs).items()):
        c = nri_container(ds)
        rendered = {a.partition("=")[0] for a in (c["args"][1:] if c else [])}
        r.check(f"binary/{mode}: every rendered nri flag is one nri accepts",
                c is not None and c["args"][0] == "nri" and rendered <= nri_accepted,
                str(sorted(rendered - nri_accepted)))
    pods = test_pods(docs)
    if pods:
        command = pods[0]["spec"]["containers"][0]["command"]
        rc, out = run([binary] + command[1:] + ["--help"])
        usage = "Usage: rdma-device-plugin " + " ".join(command[1:])
        r.check("binary: the test hook's subcommand exists", rc == 0 and usage in out,
                f"rc={rc}, no '{usage}' in: {out.strip()[:200]}")


def find_helm(given):
    if given and os.access(given, os.X_OK):
        return given
    return shutil.which("helm")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--helm", help="helm binary; used when it exists, else helm on PATH")
    parser.add_argument("--chart", default=DEFAULT_CHART)
    parser.add_argument("--binary", help="the built rdma-device-plugin: also check that the "
                        "rendered command lines parse with it")
    args = parser.parse_args()
    binary = find_helm(args.helm)
    if not binary:
        print(f"test_chart: no helm at {args.helm or '(none given)'} nor on PATH; "
              "run scripts/get-helm.sh build/tools/bin")
        print("0 passed, 1 failed")
        return 1

    helm = Helm(binary, args.chart)
    r = Results()
    try:
        checks = [check_lint, check_default, check_rdma_node_requirements, check_single_mode,
                  check_custom_label, check_overrides, check_probe_fallback, check_rejections,
                  check_notes, check_test_pod_modes, check_image_required, check_dra,
                  check_resources, check_resource_device_classes,
                  check_dra_least_privilege, check_metrics,
                  check_metrics_guard, check_dashboard, check_nri, check_allocation_files,
                  check_no_architecture]
        if args.binary:
            if r.check(f"binary exists: {args.binary}", os.access(args.binary, os.X_OK)):
                def check_binary(r, helm):
                    check_against_binary(r, helm, args.binary)
                checks.append(check_binary)
        for check in checks:
            try:
                check(r, helm)
            except Exception as e:  # a render that fails is a failure, not a crash
                r.check(f"{check.__name__} ran", False, f"{type(e).__name__}: {e}")
    finally:
        helm.close()
    print(f"{r.passed} passed, {r.failed} failed")
    return 0 if r.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
