package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

const podTimeout = 60 * time.Second

// TestRealNodeDevicePlugin: the chart's device-plugin DaemonSets on a real kubelet and containerd
// with NRI, one cluster through shared mode, the relabel to exclusive, exclusive mode, what a
// container holds besides its devices (locked memory, variables, allocation.json), GPU
// alignment, `check`, and restarts of every piece.
func TestRealNodeDevicePlugin(t *testing.T) {
	c := up(t, "--driver", "deviceplugin", "--mode", "shared", "--nri")
	usable := c.usableHCAs()
	t.Logf("node: %d usable HCAs %v", len(usable), usable)

	t.Run("SecondUpSaysSo", func(t *testing.T) {
		out, code := script("up")
		if code != 1 || !strings.Contains(out, "already up") {
			t.Errorf("a second up: exit %d, %q; want exit 1 saying it is already up", code, out)
		}
	})

	// Shared: 1000 units, every pod sees every usable HCA.
	c.waitAllocatable(hcaResource, 1000, podTimeout)
	shared := []string{"shared-0", "shared-1", "shared-2"}
	for _, n := range shared {
		c.create(workloadPod(n, nil, ctr{name: "c", limits: hca(1)}))
	}
	c.waitRunning(podTimeout, shared...)
	for _, n := range shared {
		c.checkExactly("shared "+n, c.inside(n, "c"), usable)
	}

	// One uverbs node vanishes from the node's /dev: a new pod still starts, without it.
	gone := "uverbs3"
	goneHCA := c.hcaOfNode(gone)
	c.inNS("rm", "/dev/infiniband/"+gone)
	c.waitPluginLog("HCA "+goneHCA+" ", "unhealthy")
	c.create(workloadPod("shared-after-vanish", nil, ctr{name: "c", limits: hca(1)}))
	c.waitRunning(podTimeout, "shared-after-vanish")
	in := c.inside("shared-after-vanish", "c")
	t.Logf("after %s vanished, a new shared pod: %s; NCCL_IB_HCA=%s", gone, describe(in), in.env["NCCL_IB_HCA"])
	if _, ok := in.devs[gone]; ok {
		t.Errorf("the pod started after %s vanished has it", gone)
	}
	for _, h := range c.hcasSeen(in) {
		if h == goneHCA {
			t.Errorf("the pod started after %s vanished has %s's other nodes", gone, goneHCA)
		}
	}
	mm := c.sysfs("class", "infiniband_verbs", gone, "dev")
	c.inNS("mknod", "-m", "0666", "/dev/infiniband/"+gone, "c", strings.Split(mm, ":")[0], strings.Split(mm, ":")[1])
	c.waitPluginLog("HCA "+goneHCA+" ", "is now healthy")
	c.deletePods(podTimeout, "shared-1", "shared-2", "shared-after-vanish")

	// Relabel to exclusive while shared-0 runs: the exclusive plugin withholds every HCA it sees.
	c.kubectl("label", "node", nodeName, exclusiveLabel+"=true")
	eventually(t, podTimeout, "the exclusive plugin registered, withholding shared-0's HCAs", func() (bool, string) {
		n, err := c.client.CoreV1().Nodes().Get(c.ctx(), nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		capacity, alloc := n.Status.Capacity[hcaResource], n.Status.Allocatable[hcaResource]
		return capacity.Value() == int64(len(usable)) && alloc.Value() == 0, fmt.Sprintf("capacity %v allocatable %v", capacity.Value(), alloc.Value())
	})
	c.create(workloadPod("after-relabel", nil, ctr{name: "c", limits: hca(1)}))
	eventually(t, podTimeout, "after-relabel Pending, Insufficient rdma/hca", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(testNS).Get(c.ctx(), "after-relabel", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == v1.PodPending && strings.Contains(podState(p), "Insufficient rdma/hca"), podState(p)
	})
	t.Logf("relabelled to exclusive with shared-0 running: allocatable 0 of %d, a new exclusive pod Pending", len(usable))
	c.deletePods(podTimeout, "shared-0")
	c.waitAllocatable(hcaResource, int64(len(usable)), podTimeout)
	c.waitRunning(podTimeout, "after-relabel")

	// Exclusive: exactly their HCAs.
	c.create(
		workloadPod("one", nil, ctr{name: "c", limits: hca(1)}),
		workloadPod("two", nil, ctr{name: "c", limits: hca(2)}),
		workloadPod("pair", nil, ctr{name: "a", limits: hca(1)}, ctr{name: "b", limits: hca(1)}),
		workloadPod("init", []ctr{{name: "setup", limits: hca(1)}}, ctr{name: "app", limits: hca(1)}))
	c.waitRunning(podTimeout, "one", "two", "pair", "init")
	owner := map[string]string{} // HCA -> pod/container holding it
	hold := func(what string, in inside, n int) []string {
		got := ncclHCAs(in.env["NCCL_IB_HCA"])
		if len(got) != n {
			t.Errorf("%s: NCCL_IB_HCA=%q, want %d HCAs", what, in.env["NCCL_IB_HCA"], n)
		}
		c.checkExactly(what, in, got)
		return got
	}
	for _, x := range []struct {
		pod, ctr string
		n        int
	}{{"after-relabel", "c", 1}, {"one", "c", 1}, {"two", "c", 2}, {"pair", "a", 1}, {"pair", "b", 1}, {"init", "app", 1}} {
		what := x.pod + "/" + x.ctr
		got := hold(what, c.inside(x.pod, x.ctr), x.n)
		for _, h := range got {
			if prev, ok := owner[h]; ok {
				t.Errorf("%s and %s both hold %s in exclusive mode", prev, what, h)
			}
			owner[h] = what
		}
		if others := kubelet.Minus(usable, got); len(others) > 0 {
			c.checkMknodDenied(what, x.pod, x.ctr, others[0])
		}
	}
	initHCAs := hold("init/setup (init container)", c.inside("init", "setup"), 1)
	if prev := owner[initHCAs[0]]; prev != "" && prev != "init/app" {
		t.Errorf("the init container's HCA %s is held by %s", initHCAs[0], prev)
	}
	free := len(usable) - len(owner)
	c.create(workloadPod("too-many", nil, ctr{name: "c", limits: hca(int64(free + 1))}))
	eventually(t, podTimeout, "too-many Pending with Insufficient rdma/hca", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(testNS).Get(c.ctx(), "too-many", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == v1.PodPending && strings.Contains(podState(p), "Insufficient rdma/hca"), podState(p)
	})
	t.Logf("a pod asking %d HCAs with %d free: Pending, Insufficient rdma/hca", free+1, free)
	c.deletePods(podTimeout, "too-many", "two", "pair", "init")

	t.Run("InsideThePod", func(t *testing.T) { insideThePod(t, c.with(t)) })
	t.Run("Check", func(t *testing.T) { checkSubcommand(t, c.with(t)) })
	t.Run("GPUAndHCA", func(t *testing.T) { gpuAndHCA(t, c.with(t)) })
	t.Run("DriverReload", func(t *testing.T) {
		c := c.with(t)
		driverReload(t, c, "one", func() string { return c.heldSeries("one", "after-relabel") })
	})
	t.Run("Restarts", func(t *testing.T) { deviceplugInRestarts(t, c.with(t), usable) })
}

// checkSubcommand: `rdma-device-plugin check` in a pod of our image holding one HCA reports
// clean isolation (exit 0); in a privileged pod that also mounts the host's /dev/infiniband by
// hostPath (as a GPU plugin with MOFED_ENABLED effectively does) it reports the leak (exit 1).
func checkSubcommand(t *testing.T, c *cluster) {
	image := imageOfPlugin(t, c)
	mk := func(name string, leak bool) *v1.Pod {
		p := workloadPod(name, nil, ctr{name: "check", limits: hca(1)})
		ct := &p.Spec.Containers[0]
		ct.Image = image
		ct.Command = []string{"/usr/bin/rdma-device-plugin", "check", "--sysfs-root=/host", "--json"}
		p.Spec.Volumes = []v1.Volume{{Name: "sys", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: filepath.Join(c.run, "node", "sys")}}}}
		ct.VolumeMounts = []v1.VolumeMount{{Name: "sys", MountPath: "/host/sys", ReadOnly: true}}
		if leak {
			privileged := true
			ct.SecurityContext = &v1.SecurityContext{Privileged: &privileged}
			p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "ib", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/dev/infiniband"}}})
			ct.VolumeMounts = append(ct.VolumeMounts, v1.VolumeMount{Name: "ib", MountPath: "/dev/infiniband"})
		}
		return p
	}
	c.create(mk("check-clean", false), mk("check-leak", true))
	for _, x := range []struct {
		pod     string
		code    int32
		verdict string
	}{{"check-clean", 0, `"verdict":"match"`}, {"check-leak", 1, `"verdict":"more"`}} {
		var term *v1.ContainerStateTerminated
		eventually(t, podTimeout, x.pod+" finished", func() (bool, string) {
			p, err := c.client.CoreV1().Pods(testNS).Get(c.ctx(), x.pod, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Terminated != nil {
				term = p.Status.ContainerStatuses[0].State.Terminated
				return true, ""
			}
			return false, podState(p)
		})
		raw, err := c.client.CoreV1().Pods(testNS).GetLogs(x.pod, &v1.PodLogOptions{}).Do(c.ctx()).Raw()
		if err != nil {
			t.Fatal(err)
		}
		report := strings.ReplaceAll(string(raw), " ", "")
		t.Logf("%s: exit %d, %s", x.pod, term.ExitCode, strings.TrimSpace(string(raw)))
		if term.ExitCode != x.code || !strings.Contains(report, x.verdict) {
			t.Errorf("%s: exit %d with %s, want exit %d with %s", x.pod, term.ExitCode, raw, x.code, x.verdict)
		}
	}
	c.deletePods(podTimeout, "check-clean", "check-leak")
}

// waitPluginLog waits until a line of the running plugin pod's log holds both parts (the plugin
// polls the node every second, --health-interval=1s).
func (c *cluster) waitPluginLog(part1, part2 string) {
	c.t.Helper()
	c.waitContainerLog("rdma-device-plugin", part1, part2)
}

// waitContainerLog waits until a running plugin pod's container logged a line with part1 and
// part2.
func (c *cluster) waitContainerLog(container, part1, part2 string) {
	c.t.Helper()
	c.waitContainerLogMore(container, 0, part1, part2)
}

// waitContainerLogMore waits until a running plugin pod's container logged more than `than` lines
// with part1 and part2 (than: containerLogLines before what should log them).
func (c *cluster) waitContainerLogMore(container string, than int, part1, part2 string) {
	c.t.Helper()
	eventually(c.t, podTimeout, container+" logging "+part1+"... "+part2, func() (bool, string) {
		lines, err := c.containerLogLines(container, part1, part2)
		if err != nil {
			return false, err.Error()
		}
		if len(lines) > than {
			c.t.Logf("%s: %s", container, lines[len(lines)-1])
			return true, ""
		}
		return false, fmt.Sprintf("%d such lines logged", len(lines))
	})
}

// containerLogLines: the lines of the running plugin pods' container's log with part1 and part2.
func (c *cluster) containerLogLines(container, part1, part2 string) ([]string, error) {
	pods, err := c.client.CoreV1().Pods(pluginNS).List(c.ctx(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods.Items {
		if p.Status.Phase != v1.PodRunning {
			continue
		}
		raw, err := c.client.CoreV1().Pods(pluginNS).GetLogs(p.Name, &v1.PodLogOptions{Container: container}).Do(c.ctx()).Raw()
		if err != nil {
			return nil, err
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if strings.Contains(l, part1) && strings.Contains(l, part2) {
				out = append(out, l)
			}
		}
	}
	return out, nil
}

// pluginRestarts: the restart count of the running plugin pod's container (-1: none running).
func pluginRestarts(t *testing.T, c *cluster) int32 {
	pods, err := c.client.CoreV1().Pods(pluginNS).List(c.ctx(), metav1.ListOptions{})
	if err != nil {
		return -1
	}
	for _, p := range pods.Items {
		if p.Status.Phase != v1.PodRunning {
			continue
		}
		// The plugin's own container (the pod has the NRI container too).
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == "rdma-device-plugin" && s.Ready {
				return s.RestartCount
			}
		}
	}
	return -1
}

// imageOfPlugin: the image the chart's DaemonSet runs.
func imageOfPlugin(t *testing.T, c *cluster) string {
	pods, err := c.client.CoreV1().Pods(pluginNS).List(c.ctx(), metav1.ListOptions{})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the plugin's pods: %v", err)
	}
	return pods.Items[0].Spec.Containers[0].Image
}

// gpuAndHCA: the harness's GPU plugin registered on this kubelet; pods with one GPU and one HCA.
// When the kubelet allocated the GPU before the HCA (its own log says in which order), our
// plugin knows the GPU (pod-resources) and gives an HCA under the GPU's PCIe switch.
func gpuAndHCA(t *testing.T, c *cluster) {
	kubelet.PluginDir = filepath.Join(c.run, "kubelet", "device-plugins")
	gpu := kubelet.NewGPUPlugin(c.node)
	if err := gpu.Start(); err != nil {
		t.Fatalf("GPU plugin: %v", err)
	}
	t.Cleanup(gpu.Stop)
	c.waitAllocatable(kubelet.GPUResource, int64(len(c.node.GPUs)), podTimeout)
	// HCAs held by the pods still running (one, after-relabel), then by each pair pod.
	held := map[string]bool{}
	for _, p := range []string{"one", "after-relabel"} {
		for _, h := range c.hcasSeen(c.inside(p, "c")) {
			held[h] = true
		}
	}
	gpuFirst := 0
	var pods []string
	for i := 0; i < len(c.node.GPUs) && len(held) < len(c.node.HCAs) && gpuFirst < 2; i++ {
		name := fmt.Sprintf("gpu-hca-%d", i)
		c.create(workloadPod(name, nil, ctr{name: "c", limits: map[string]int64{hcaResource: 1, kubelet.GPUResource: 1}}))
		pods = append(pods, name)
		c.waitRunning(podTimeout, name)
		p, err := c.client.CoreV1().Pods(testNS).Get(c.ctx(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		in := c.inside(name, "c")
		hcas := ncclHCAs(in.env["NCCL_IB_HCA"])
		c.checkExactly(name, in, hcas)
		allocs := gpu.Allocations(0) // the pods start one after the other: the last is this one's
		if len(allocs) != i+1 || len(allocs[i].IDs) != 1 {
			t.Fatalf("%s: the GPU plugin's Allocate calls: %+v", name, allocs)
		}
		g, _ := c.node.GPUByPCI(allocs[i].IDs[0])
		order := allocationOrder(t, c, string(p.UID))
		var h kubelet.HCA
		for _, x := range c.node.HCAs {
			if len(hcas) == 1 && x.Name == hcas[0] {
				h = x
			}
		}
		var near []string // free HCAs under the GPU's switch when this pod came
		for _, x := range c.node.HCAs {
			if kubelet.SameSwitch(g, x) && !held[x.Name] {
				near = append(near, x.Name)
			}
		}
		held[h.Name] = true
		if len(order) != 2 || order[0] != kubelet.GPUResource {
			t.Logf("%s: the kubelet allocated %v in that order: no GPU known to us; GPU %s, HCA %s", name, order, g.PCI, h.Name)
			continue
		}
		gpuFirst++
		t.Logf("%s: GPU %s allocated first; free HCAs under its switch %v; got %s (%s), same switch: %v", name, g.PCI, near, h.Name, h.PCI, kubelet.SameSwitch(g, h))
		if len(near) > 0 && !kubelet.SameSwitch(g, h) {
			t.Errorf("%s: GPU %s was allocated first and HCAs %v share its switch, but the pod got %s (%s)", name, g.PCI, near, h.Name, h.PCI)
		}
	}
	if gpuFirst == 0 {
		t.Errorf("the kubelet never allocated the GPU before the HCA in %d pods", len(pods))
	}
	c.deletePods(podTimeout, pods...)
}

// allocationOrder: the resources the kubelet's device manager allocated for the pod, in order,
// from its log ("Need devices to allocate for pod", -v 3).
func allocationOrder(t *testing.T, c *cluster, uid string) []string {
	data, err := os.ReadFile(filepath.Join(c.run, "logs", "kubelet.log"))
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.Contains(l, "Need devices to allocate for pod") || !strings.Contains(l, uid) {
			continue
		}
		if i := strings.Index(l, `resourceName="`); i >= 0 {
			r := l[i+len(`resourceName="`):]
			order = append(order, r[:strings.Index(r, `"`)])
		}
	}
	return order
}

// deviceplugInRestarts: with pods running, the kubelet and containerd restart, the plugin's pod is
// deleted, and the node reboots; running pods keep their devices, new pods start.
func deviceplugInRestarts(t *testing.T, c *cluster, usable []string) {
	before := c.inside("one", "c")
	still := func(what string) {
		out := c.execSoon("one", "c", probe)
		now := parseProbe(t, out)
		if describe(now) != describe(before) {
			t.Errorf("after %s, pod one sees %s, before %s", what, describe(now), describe(before))
		}
		t.Logf("after %s: pod one still sees %s", what, describe(now))
	}
	newPod := func(name string) {
		c.create(workloadPod(name, nil, ctr{name: "c", limits: hca(1)}))
		c.waitRunning(podTimeout, name)
		in := c.inside(name, "c")
		c.checkExactly(name, in, ncclHCAs(in.env["NCCL_IB_HCA"]))
		c.deletePods(podTimeout, name)
	}

	out, code := script("restart", "kubelet")
	if code != 0 {
		t.Fatalf("restart kubelet: %s", out)
	}
	c.waitAllocatable(hcaResource, int64(len(usable)), podTimeout)
	still("a kubelet restart")
	newPod("after-kubelet-restart")

	if out, code := script("restart", "containerd"); code != 0 {
		t.Fatalf("restart containerd: %s", out)
	}
	still("a containerd restart")
	newPod("after-containerd-restart")

	pods, err := c.client.CoreV1().Pods(pluginNS).List(c.ctx(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the plugin's pods: %v %v", err, pods)
	}
	old := pods.Items[0]
	if err := c.client.CoreV1().Pods(pluginNS).Delete(c.ctx(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, podTimeout, "the DaemonSet's new plugin pod running", func() (bool, string) {
		pods, err := c.client.CoreV1().Pods(pluginNS).List(c.ctx(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.UID != old.UID && p.Status.Phase == v1.PodRunning {
				return true, ""
			}
		}
		return false, fmt.Sprint(len(pods.Items), " pods")
	})
	c.waitAllocatable(hcaResource, int64(len(usable)), podTimeout)
	still("the plugin's pod was deleted")
	newPod("after-plugin-pod-deleted")

	restarts := pluginRestarts(t, c)
	if out, code := script("reboot"); code != 0 {
		t.Fatalf("reboot: %s", out)
	}
	// The plugin's container started again by the kubelet, registered with it again.
	eventually(t, 2*podTimeout, "the plugin's container restarted after the reboot", func() (bool, string) {
		n := pluginRestarts(t, c)
		return n > restarts, fmt.Sprintf("restarts %d", n)
	})
	c.waitPluginLog("Registered device plugin with Kubelet", "")
	c.waitAllocatable(hcaResource, int64(len(usable)), 2*podTimeout)
	newPod("after-reboot")
	t.Logf("after the reboot the plugin registered again (allocatable %d) and a new pod started", len(usable))
}
