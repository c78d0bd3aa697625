// Package realnode holds the real-node tests (TestRealNode*, docs/real-node.md): a cluster brought
// up by scripts/real-node.sh (the kubelet binary, containerd with Debian's runc, the harness's
// control plane, the chart's DaemonSet from our image), pods started on it and their containers
// looked into. Run with test/kubelet/run.sh --real-node (ctest real_node).
package realnode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

const (
	nodeName       = "rdp-real-node"
	workloadImage  = "localhost/rdp-workload:1"
	hcaResource    = "rdma/hca"
	exclusiveLabel = "rdma.network.alibabacloud.com/exclusive"
	pluginNS       = "kube-system"
	testNS         = "default"
)

func repoRoot() string {
	wd, _ := os.Getwd() // test/kubelet/realnode
	return filepath.Clean(filepath.Join(wd, "..", "..", ".."))
}

func buildDir() string {
	b := os.Getenv("BUILD_DIR")
	if b == "" {
		b = filepath.Join(repoRoot(), "build")
	}
	if !filepath.IsAbs(b) {
		b = filepath.Join(repoRoot(), b)
	}
	return b
}

// scriptTimeout bounds one call of the script (up is within 60 s once built; ctest
// real_node_build has built everything).
const scriptTimeout = 4 * time.Minute

// script runs scripts/real-node.sh with args; its combined output and exit code.
func script(args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(), "scripts", "real-node.sh"), args...)
	// Its own process group, killed whole at the deadline (the script's children with it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "BUILD_DIR="+buildDir())
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return string(out), code
}

// cluster is a node brought up by real-node.sh up, torn down at the end of the test.
type cluster struct {
	t      *testing.T
	client kubernetes.Interface
	run    string // build/real-node/run
	node   *kubelet.Node
	nri    bool // up --nri: containerd's NRI on, the chart's NRI plugin connected to it
	// With nri: `ulimit -l` in a container the NRI plugin adjusted (KiB or "unlimited"): the
	// chart's nri.memlock as real-node.sh set it (memlock_hard in run/config).
	memlock string
}

// up brings the cluster up; at the end of the test it is taken down, and the host is checked
// to be as it was before up (hostState) with nothing of the node left behind.
func up(t *testing.T, args ...string) *cluster {
	t.Helper()
	before := hostState(t)
	start := time.Now()
	out, code := script(append([]string{"up"}, args...)...)
	t.Logf("real-node.sh up %s: exit %d after %v\n%s", strings.Join(args, " "), code, time.Since(start).Round(time.Millisecond), out)
	c := &cluster{t: t, run: filepath.Join(buildDir(), "real-node", "run")}
	for _, a := range args {
		c.nri = c.nri || a == "--nri"
	}
	if c.nri {
		c.memlock = memlockOf(t, filepath.Join(c.run, "config"))
	}
	t.Cleanup(func() {
		start := time.Now()
		out, code := script("down")
		t.Logf("real-node.sh down: exit %d after %v\n%s", code, time.Since(start).Round(time.Millisecond), out)
		if code != 0 {
			t.Errorf("down exited %d", code)
		}
		checkNothingLeft(t, c.run)
		if after := hostState(t); after != before {
			t.Errorf("the host changed between up and down:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
	if code != 0 {
		t.Fatalf("up exited %d", code)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(buildDir(), "real-node", "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	c.client, err = kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.node, err = kubelet.LoadNode(filepath.Join(c.run, "node", "topology.xml"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// memlockOf: from real-node.sh's run/config, the limit the chart's NRI plugin sets
// (memlock_hard, bytes or "unlimited") as `ulimit -l` shows it.
func memlockOf(t *testing.T, config string) string {
	t.Helper()
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(kv, "memlock_hard="); ok {
			if v == "unlimited" {
				return v
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: memlock_hard=%q", config, v)
			}
			return strconv.FormatInt(n/1024, 10)
		}
	}
	t.Fatalf("%s has no memlock_hard: %s", config, b)
	return ""
}

// hostState is what the node must not change on the machine: its /var/lib/kubelet,
// /run/containerd, /etc/cdi, /var/run/cdi and /var/log/pods (listings) and the sysctls the
// kubelet sets. (Not /run/runc: podman's builds on the machine use it.)
func hostState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, d := range []string{"/var/lib/kubelet", "/run/containerd", "/etc/cdi", "/var/run/cdi", "/var/log/pods", "/var/log/containers"} {
		fmt.Fprintf(&b, "%s: %s\n", d, listing(d))
	}
	for _, s := range []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"} {
		v, _ := os.ReadFile("/proc/sys/" + s)
		fmt.Fprintf(&b, "%s = %s\n", s, strings.TrimSpace(string(v)))
	}
	return b.String()
}

// listing: the names under d with their sizes and modes, or "absent".
func listing(d string) string {
	var names []string
	err := filepath.Walk(d, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		names = append(names, fmt.Sprintf("%s(%v,%d)", strings.TrimPrefix(p, d), info.Mode(), info.Size()))
		if info.IsDir() && strings.Count(strings.TrimPrefix(p, d), "/") >= 2 {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil || len(names) == 0 {
		return "absent"
	}
	return strings.Join(names, " ")
}

// checkNothingLeft: after down, no process runs whose executable is one of the node's binaries
// or whose mount namespace was the node's, no mount of the build directory's, no cgroup of the
// node's cgroup root, no socket left under the run directory.
func checkNothingLeft(t *testing.T, run string) {
	t.Helper()
	bin := filepath.Join(buildDir(), "real-node", "bin")
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		exe, err := os.Readlink(p + "/exe")
		if err == nil && strings.HasPrefix(exe, bin+"/") {
			t.Errorf("process %s (%s) still runs after down", filepath.Base(p), exe)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mounts), "\n") {
		if strings.Contains(l, buildDir()+"/real-node") {
			t.Errorf("a mount of the node is left: %s", l)
		}
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/rdp-real-node-*")
	unified, _ := filepath.Glob("/sys/fs/cgroup/rdp-real-node-*")
	for _, c := range append(cgroups, unified...) {
		t.Errorf("a cgroup of the node is left: %s", c)
	}
	_ = filepath.Walk(run, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode()&os.ModeSocket != 0 {
			t.Errorf("a socket is left: %s", p)
		}
		return nil
	})
}

func (c *cluster) ctx() context.Context { return context.Background() }

// kubectl runs the script's kubectl; its output, failing the test on an error.
func (c *cluster) kubectl(args ...string) string {
	c.t.Helper()
	out, code := script(append([]string{"kubectl"}, args...)...)
	if code != 0 {
		c.t.Fatalf("kubectl %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return out
}

// inNS runs a command in the node's mount namespace.
func (c *cluster) inNS(args ...string) string {
	c.t.Helper()
	out, code := script(append([]string{"ns"}, args...)...)
	if code != 0 {
		c.t.Fatalf("in the node's namespace: %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return out
}

// eventually polls cond every 200 ms until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last: %s)", timeout, what, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *cluster) allocatable(name v1.ResourceName) int64 {
	n, err := c.client.CoreV1().Nodes().Get(c.ctx(), nodeName, metav1.GetOptions{})
	if err != nil {
		return -1
	}
	q := n.Status.Allocatable[name]
	return q.Value()
}

func (c *cluster) waitAllocatable(name v1.ResourceName, want int64, timeout time.Duration) {
	c.t.Helper()
	eventually(c.t, timeout, fmt.Sprintf("allocatable %s = %d", name, want), func() (bool, string) {
		got := c.allocatable(name)
		return got == want, fmt.Sprint(got)
	})
}

// probe is what every workload container runs first: each /dev/infiniband node with its
// major:minor (hex, as stat prints it) and what open() said (busybox prints strerror), then the
// RDMA/NCCL environment. ENXIO ("No such device or address") means the device cgroup let the
// open through to a device without a driver; EPERM ("Operation not permitted") means it denied it.
const probe = `for f in /dev/infiniband/*; do
  [ -e "$f" ] || continue
  mm=$(stat -c '%t:%T' "$f")
  if out=$(cat "$f" 2>&1 </dev/null); then r=opened; else r=${out##*: }; fi
  echo "dev ${f##*/} $mm $r"
done
env | grep -E '^(NCCL_|RDMA_|UCX_)' | sed 's/^/env /'
echo "memlock $(ulimit -l)"
if [ -e /etc/rdma/allocation.json ]; then echo "allocation $(tr -d '\n' </etc/rdma/allocation.json)"; fi
echo probe-done`

// mknodProbe makes a node for major:minor inside the container and opens it.
func mknodProbe(major, minor int) string {
	return fmt.Sprintf(`rm -f /tmp/probe-node
if out=$(mknod /tmp/probe-node c %d %d 2>&1); then
  if out=$(cat /tmp/probe-node 2>&1 </dev/null); then echo "mknod opened"; else echo "mknod open: ${out##*: }"; fi
else echo "mknod: ${out##*: }"; fi`, major, minor)
}

// ctr is a workload container: its name and resource limits.
type ctr struct {
	name   string
	limits map[string]int64
	claims []v1.ResourceClaim // container.resources.claims (DRA)
	env    []v1.EnvVar        // set in the pod spec
}

func hca(n int64) map[string]int64 { return map[string]int64{hcaResource: n} }

// workloadPod: containers running the probe, then sleeping; init containers run the probe
// and exit. hostNetwork (the node has no pod network).
func workloadPod(name string, inits []ctr, ctrs ...ctr) *v1.Pod {
	mk := func(c ctr, init bool) v1.Container {
		cmd := probe + "\nexec sleep 100000"
		if init {
			cmd = probe
		}
		limits := v1.ResourceList{}
		for r, n := range c.limits {
			limits[v1.ResourceName(r)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
		return v1.Container{Name: c.name, Image: workloadImage, ImagePullPolicy: v1.PullNever,
			Command: []string{"/bin/sh", "-c", cmd}, Env: c.env,
			Resources: v1.ResourceRequirements{Limits: limits, Claims: c.claims}}
	}
	zero := int64(0)
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: v1.PodSpec{HostNetwork: true, NodeName: "", TerminationGracePeriodSeconds: &zero,
			RestartPolicy: v1.RestartPolicyNever}}
	for _, c := range inits {
		p.Spec.InitContainers = append(p.Spec.InitContainers, mk(c, true))
	}
	for _, c := range ctrs {
		p.Spec.Containers = append(p.Spec.Containers, mk(c, false))
	}
	return p
}

func (c *cluster) create(pods ...*v1.Pod) {
	c.t.Helper()
	for _, p := range pods {
		if _, err := c.client.CoreV1().Pods(p.Namespace).Create(c.ctx(), p, metav1.CreateOptions{}); err != nil {
			c.t.Fatalf("creating pod %s: %v", p.Name, err)
		}
	}
}

// waitRunning waits until every pod runs with all its containers started.
func (c *cluster) waitRunning(timeout time.Duration, names ...string) {
	c.t.Helper()
	var wg sync.WaitGroup
	errs := make([]string, len(names))
	for i, name := range names {
		wg.Add(1)
		go func(i int, name string) {
			defer wg.Done()
			deadline := time.Now().Add(timeout)
			for {
				p, err := c.client.CoreV1().Pods(testNS).Get(c.ctx(), name, metav1.GetOptions{})
				if err == nil && p.Status.Phase == v1.PodRunning && allStarted(p) {
					return
				}
				if err == nil && (p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded) {
					errs[i] = fmt.Sprintf("pod %s ended %s: %s", name, p.Status.Phase, podState(p))
					return
				}
				if time.Now().After(deadline) {
					state := fmt.Sprint(err)
					if err == nil {
						state = podState(p)
					}
					errs[i] = fmt.Sprintf("pod %s not running after %v: %s", name, timeout, state)
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}(i, name)
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			c.t.Fatal(e)
		}
	}
}

func allStarted(p *v1.Pod) bool {
	if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running == nil {
			return false
		}
	}
	return true
}

func podState(p *v1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, cnd := range p.Status.Conditions {
		if cnd.Status != v1.ConditionTrue && cnd.Message != "" {
			fmt.Fprintf(&b, "; %s: %s %s", cnd.Type, cnd.Reason, cnd.Message)
		}
	}
	for _, s := range append(append([]v1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if s.State.Waiting != nil {
			fmt.Fprintf(&b, "; %s waiting: %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
		}
		if s.State.Terminated != nil {
			fmt.Fprintf(&b, "; %s terminated: %s %d", s.Name, s.State.Terminated.Reason, s.State.Terminated.ExitCode)
		}
	}
	return b.String()
}

// deletePods deletes the pods and waits until they are gone (the kubelet stopped them).
func (c *cluster) deletePods(timeout time.Duration, names ...string) {
	c.t.Helper()
	for _, n := range names {
		err := c.client.CoreV1().Pods(testNS).Delete(c.ctx(), n, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			c.t.Fatalf("deleting %s: %v", n, err)
		}
	}
	for _, n := range names {
		eventually(c.t, timeout, "pod "+n+" gone", func() (bool, string) {
			_, err := c.client.CoreV1().Pods(testNS).Get(c.ctx(), n, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	}
}

// inside is what the probe saw in one container.
type inside struct {
	devs       map[string]devNode // by name: uverbs0, umad0, issm0, rdma_cm
	env        map[string]string
	memlock    string // `ulimit -l`: KiB or "unlimited"
	allocation string // /etc/rdma/allocation.json on one line, "" when there is none
	raw        string
}

type devNode struct {
	major, minor int
	open         string // "No such device or address", "Operation not permitted", ...
}

const (
	allowed = "No such device or address" // ENXIO: the device cgroup let open() through
	denied  = "Operation not permitted"   // EPERM: the device cgroup denied it
	noDev   = "No such device"            // ENODEV: rdma_cm without a driver
)

// logs reads a container's log (through the API server and the kubelet) once the probe is done.
func (c *cluster) inside(pod, container string) inside {
	c.t.Helper()
	var text string
	eventually(c.t, 30*time.Second, "the probe of "+pod+"/"+container, func() (bool, string) {
		raw, err := c.client.CoreV1().Pods(testNS).GetLogs(pod, &v1.PodLogOptions{Container: container}).Do(c.ctx()).Raw()
		text = string(raw)
		return err == nil && strings.Contains(text, "probe-done"), fmt.Sprint(err, text)
	})
	return parseProbe(c.t, text)
}

func parseProbe(t *testing.T, text string) inside {
	t.Helper()
	in := inside{devs: map[string]devNode{}, env: map[string]string{}, raw: text}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		switch {
		case f[0] == "dev" && len(f) == 4:
			mm := strings.SplitN(f[2], ":", 2)
			major, err1 := strconv.ParseInt(mm[0], 16, 32)
			minor, err2 := strconv.ParseInt(mm[len(mm)-1], 16, 32)
			if err1 != nil || err2 != nil {
				t.Fatalf("probe line %q", sc.Text())
			}
			in.devs[f[1]] = devNode{int(major), int(minor), f[3]}
		case f[0] == "memlock" && len(f) == 2:
			in.memlock = f[1]
		case f[0] == "allocation" && len(f) >= 2:
			in.allocation = strings.TrimPrefix(sc.Text(), "allocation ")
		case f[0] == "env" && len(f) >= 2:
			kv := strings.SplitN(strings.TrimPrefix(sc.Text(), "env "), "=", 2)
			if len(kv) == 2 {
				in.env[kv[0]] = kv[1]
			}
		}
	}
	return in
}

func (in inside) names() []string {
	var n []string
	for k := range in.devs {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// with: the cluster for a subtest (failures go to t).
func (c *cluster) with(t *testing.T) *cluster {
	cc := *c
	cc.t = t
	return &cc
}

// execSoon: exec, retried until the kubelet knows the pod again (after its restart) or the
// timeout passes.
func (c *cluster) execSoon(pod, container, cmd string) string {
	c.t.Helper()
	var out string
	eventually(c.t, podTimeout, "exec in "+pod+"/"+container, func() (bool, string) {
		var code int
		out, code = script("kubectl", "exec", "-n", testNS, pod, "-c", container, "--", "/bin/sh", "-c", cmd)
		return code == 0, out
	})
	return out
}

// exec runs a shell command in a running container (through the API server's exec to the
// kubelet's streaming endpoint, then containerd's).
func (c *cluster) exec(pod, container, cmd string) string {
	c.t.Helper()
	return c.kubectl("exec", "-n", testNS, pod, "-c", container, "--", "/bin/sh", "-c", cmd)
}

// sysfs of the node the cluster runs (its copy under the run directory).
func (c *cluster) sysfs(path ...string) string {
	b, err := os.ReadFile(filepath.Join(append([]string{c.run, "node", "sys"}, path...)...))
	if err != nil {
		c.t.Fatal(err)
	}
	return string(bytes.TrimSpace(b))
}

// hcaNodes: the /dev/infiniband names that belong to HCA name (uverbs, umad, issm), from sysfs.
func (c *cluster) hcaNodes(name string) []string {
	c.t.Helper()
	var out []string
	for _, class := range []string{"infiniband_verbs", "infiniband_mad"} {
		entries, _ := os.ReadDir(filepath.Join(c.run, "node", "sys", "class", class))
		for _, e := range entries {
			if _, err := os.Stat(filepath.Join(c.run, "node", "sys", "class", class, e.Name(), "ibdev")); err != nil {
				continue // abi_version
			}
			if c.sysfs("class", class, e.Name(), "ibdev") == name {
				out = append(out, e.Name())
			}
		}
	}
	sort.Strings(out)
	return out
}

// hcaOfNode: the HCA a /dev/infiniband node belongs to ("" for rdma_cm).
func (c *cluster) hcaOfNode(node string) string {
	for _, class := range []string{"infiniband_verbs", "infiniband_mad"} {
		if b, err := os.ReadFile(filepath.Join(c.run, "node", "sys", "class", class, node, "ibdev")); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

// hcasSeen: the HCAs whose nodes a container has.
func (c *cluster) hcasSeen(in inside) []string {
	set := map[string]bool{}
	for n := range in.devs {
		if h := c.hcaOfNode(n); h != "" {
			set[h] = true
		}
	}
	return sortedKeys(set)
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ucxHCAs: the HCAs UCX_NET_DEVICES names ("mlx5_0:1,mlx5_3:1"), each once, in its order.
func ucxHCAs(v string) []string {
	var names []string
	seen := map[string]bool{}
	for _, d := range splitList(v) {
		name, _, _ := strings.Cut(d, ":")
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names
}

// ncclHCAs parses NCCL_IB_HCA ("=mlx5_0,mlx5_3").
func ncclHCAs(v string) []string {
	v = strings.TrimPrefix(v, "=")
	if v == "" {
		return nil
	}
	out := strings.Split(v, ",")
	sort.Strings(out)
	return out
}

// usableHCAs: the node's HCAs with a uverbs node (from sysfs), sorted.
func (c *cluster) usableHCAs() []string {
	entries, _ := os.ReadDir(filepath.Join(c.run, "node", "sys", "class", "infiniband_verbs"))
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(c.run, "node", "dev", "infiniband", e.Name())); err == nil {
			out = append(out, c.sysfs("class", "infiniband_verbs", e.Name(), "ibdev"))
		}
	}
	sort.Strings(out)
	return out
}

// checkExactly: the container has exactly the device nodes of hcas (checkDevices), and
// NCCL_IB_HCA, UCX_NET_DEVICES and /etc/rdma/allocation.json name exactly hcas. It logs what it
// saw.
func (c *cluster) checkExactly(what string, in inside, hcas []string) {
	c.t.Helper()
	c.checkDevices(what, in, hcas)
	if got := ncclHCAs(in.env["NCCL_IB_HCA"]); strings.Join(got, ",") != strings.Join(hcas, ",") {
		c.t.Errorf("%s: NCCL_IB_HCA=%q names %v, want %v", what, in.env["NCCL_IB_HCA"], got, hcas)
	}
	if got := ucxHCAs(in.env["UCX_NET_DEVICES"]); strings.Join(got, ",") != strings.Join(hcas, ",") {
		c.t.Errorf("%s: UCX_NET_DEVICES=%q names %v, want %v", what, in.env["UCX_NET_DEVICES"], got, hcas)
	}
	c.checkAllocationFile(what, in, hcas)
	if c.nri && in.memlock != c.memlock {
		c.t.Errorf("%s: ulimit -l is %s, want %s (the NRI plugin's nri.memlock)", what, in.memlock, c.memlock)
	}
	c.t.Logf("%s: inside: %s; NCCL_IB_HCA=%s; ulimit -l %s", what, describe(in), in.env["NCCL_IB_HCA"], in.memlock)
}

// checkDevices: the container has exactly the device nodes of hcas plus rdma_cm, each allowed
// by the device cgroup (ENXIO; rdma_cm ENODEV).
func (c *cluster) checkDevices(what string, in inside, hcas []string) {
	c.t.Helper()
	want := []string{"rdma_cm"}
	for _, h := range hcas {
		want = append(want, c.hcaNodes(h)...)
	}
	sort.Strings(want)
	if got := in.names(); strings.Join(got, " ") != strings.Join(want, " ") {
		c.t.Errorf("%s: /dev/infiniband holds %v, want %v (HCAs %v)", what, got, want, hcas)
	}
	for name, d := range in.devs {
		wantOpen := allowed
		if name == "rdma_cm" {
			wantOpen = noDev
		}
		if d.open != wantOpen {
			c.t.Errorf("%s: open(/dev/infiniband/%s) said %q, want %q (the device cgroup must allow it)", what, name, d.open, wantOpen)
		}
	}
}

// allocationFile is what the probe reads of /etc/rdma/allocation.json (docs/server.md).
type allocationFile struct {
	HCAs []struct {
		Name    string   `json:"name"`
		PCI     string   `json:"pci"`
		Netdevs []string `json:"netdevs"`
		Uverbs  string   `json:"uverbs"`
		Ports   []struct {
			Port      int    `json:"port"`
			State     string `json:"state"`
			LinkLayer string `json:"link_layer"`
			Netdev    string `json:"netdev"`
		} `json:"ports"`
	} `json:"hcas"`
	Env map[string]string `json:"env"`
}

// checkAllocationFile: the container's /etc/rdma/allocation.json lists exactly hcas, each with
// its PCI address (as the node's sysfs has it) and uverbs node, and the variables the container
// got from us.
func (c *cluster) checkAllocationFile(what string, in inside, hcas []string) {
	c.t.Helper()
	if in.allocation == "" {
		c.t.Errorf("%s: no /etc/rdma/allocation.json in the container", what)
		return
	}
	var f allocationFile
	if err := json.Unmarshal([]byte(in.allocation), &f); err != nil {
		c.t.Errorf("%s: /etc/rdma/allocation.json: %v: %s", what, err, in.allocation)
		return
	}
	var names []string
	for _, h := range f.HCAs {
		names = append(names, h.Name)
		dev, err := filepath.EvalSymlinks(filepath.Join(c.run, "node", "sys", "class", "infiniband", h.Name, "device"))
		if pci := filepath.Base(dev); err != nil || pci != h.PCI {
			c.t.Errorf("%s: allocation.json gives %s PCI %q, the node's sysfs %q (%v)", what, h.Name, h.PCI, pci, err)
		}
		if h.Uverbs == "" || len(h.Ports) == 0 {
			c.t.Errorf("%s: allocation.json's %s has no uverbs node or no port: %s", what, h.Name, in.allocation)
		}
	}
	if strings.Join(names, ",") != strings.Join(hcas, ",") {
		c.t.Errorf("%s: allocation.json lists %v, want %v", what, names, hcas)
	}
	if got := ncclHCAs(f.Env["NCCL_IB_HCA"]); strings.Join(got, ",") != strings.Join(hcas, ",") {
		c.t.Errorf("%s: allocation.json's NCCL_IB_HCA=%q, want %v", what, f.Env["NCCL_IB_HCA"], hcas)
	}
}

func describe(in inside) string {
	var parts []string
	for _, n := range in.names() {
		d := in.devs[n]
		parts = append(parts, fmt.Sprintf("%s(%d:%d %s)", n, d.major, d.minor, short(d.open)))
	}
	return strings.Join(parts, " ")
}

func short(errText string) string {
	switch errText {
	case allowed:
		return "ENXIO"
	case denied:
		return "EPERM"
	case noDev:
		return "ENODEV"
	}
	return errText
}

// checkMknodDenied: a node made inside the container for another HCA's uverbs major:minor
// cannot be used (EPERM at mknod or at open).
func (c *cluster) checkMknodDenied(what, pod, container, otherHCA string) {
	c.t.Helper()
	var uverbs string
	for _, n := range c.hcaNodes(otherHCA) {
		if strings.HasPrefix(n, "uverbs") {
			uverbs = n
		}
	}
	mm := strings.SplitN(c.sysfs("class", "infiniband_verbs", uverbs, "dev"), ":", 2)
	major, _ := strconv.Atoi(mm[0])
	minor, _ := strconv.Atoi(mm[1])
	out := strings.TrimSpace(c.exec(pod, container, mknodProbe(major, minor)))
	c.t.Logf("%s: mknod of %s's %s (%d:%d) inside: %s", what, otherHCA, uverbs, major, minor, out)
	if !strings.HasSuffix(out, denied) {
		c.t.Errorf("%s: a node for %s's %s (%d:%d) made inside: %q, want %q", what, otherHCA, uverbs, major, minor, out, denied)
	}
}

func sortStrings(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

// splitList: "a,b" -> [a b]; "" -> none.
func splitList(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}
