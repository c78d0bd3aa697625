package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// allSourcesReady: the kubelet's pod sources, all seen (there is one: the test).
type allSourcesReady struct{}

func (allSourcesReady) AddSource(string) {}
func (allSourcesReady) AllReady() bool   { return true }

// draKubelet is the part of a kubelet that DRA uses, from k8s.io/kubernetes itself: the DRA
// manager (claim cache and checkpoint in stateDir, the DRA plugin manager that wipes the node's
// slices at start and talks to drivers) and the plugin manager whose watcher registers drivers
// from <root>/plugins_registry.
type draKubelet struct {
	manager *dra.Manager
	cancel  context.CancelFunc
	done    chan struct{}
}

func startDRAKubelet(t *testing.T, cp *ControlPlane, node, root, stateDir string, pods func() []*v1.Pod) *draKubelet {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	m, err := dra.NewManager(klog.Background(), cp.Client, stateDir)
	if err != nil {
		t.Fatalf("DRA manager: %v", err)
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	}
	if err := m.Start(ctx, pods, getNode, allSourcesReady{}); err != nil {
		t.Fatalf("DRA manager start: %v", err)
	}
	pm := pluginmanager.NewPluginManager(filepath.Join(root, "plugins_registry"), &record.FakeRecorder{})
	pm.AddHandler(registerapi.DRAPlugin, m.GetWatcherHandler())
	k := &draKubelet{manager: m, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		pm.Run(ctx, allSourcesReady{}, ctx.Done())
	}()
	return k
}

func (k *draKubelet) stop() {
	k.cancel()
	<-k.done
	k.manager.Stop()
}

// draDriver runs `rdma-device-plugin dra` against the control plane.
type draProcess struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan error
}

func startDRADriver(t *testing.T, kubeconfig, node, root, cdiRoot string, discovery []string) *draProcess {
	t.Helper()
	return startDRADriverMode(t, "exclusive", kubeconfig, node, root, cdiRoot, discovery)
}

// startDRADriverMode: startDRADriver in `mode`; `args` are the discovery flags and any others.
func startDRADriverMode(t *testing.T, mode, kubeconfig, node, root, cdiRoot string, args []string) *draProcess {
	t.Helper()
	return startDRAProcess(t, append([]string{"dra", "--mode", mode, "--node-name", node, "--kubeconfig", kubeconfig,
		"--kubelet-dir", root, "--cdi-root", cdiRoot, "--log-level", "debug", "--metrics-address", "127.0.0.1:0", "--health-interval", "200ms"}, args...))
}

// startDRAProcess runs the plugin binary with args, its output in a log file; it is stopped at
// the end of the test (and its log shown when the test failed).
func startDRAProcess(t *testing.T, args []string) *draProcess {
	t.Helper()
	logFile, err := os.CreateTemp(t.TempDir(), "dra-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(draBinary(t), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &draProcess{cmd: cmd, log: logFile, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("driver %v log:\n%s", args, p.output())
		}
	})
	return p
}

// stop sends SIGTERM and waits for the exit (bounded); a driver that does not stop fails the test.
func (p *draProcess) stop(t *testing.T) {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("the DRA driver did not exit within 20 s of SIGTERM")
	}
}

func (p *draProcess) output() string {
	b, _ := os.ReadFile(p.log.Name())
	return string(b)
}

func nodeSlices(ctx context.Context, cp *ControlPlane, node string) ([]resourcev1.ResourceSlice, error) {
	list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{resourcev1.ResourceSliceSelectorNodeName: node, resourcev1.ResourceSliceSelectorDriver: draDriver}.String()})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// cdiSpecs: the CDI spec files in dir, by file name, decoded.
func cdiSpecs(t *testing.T, dir string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var spec map[string]any
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		out[e.Name()] = spec
	}
	return out
}

// TestDRAKubeletPrepare: our binary as a DRA driver, end to end with Kubernetes' own pieces: it
// publishes its slices to the real API server; the real scheduler allocates a claim on them
// and binds the pod; the kubelet's plugin manager registers the driver from its registration
// socket, and the kubelet's DRA manager prepares and unprepares the pod's claim through it. Then
// the restarts: a plugin restart (with the API server unreachable for it) keeps the prepared
// claim, a kubelet restart (which wipes the node's slices) re-registers the driver, which
// publishes again, and unprepare removes the claim's CDI spec. The claim's status.devices names
// the HCA and its netdev once the kubelet prepared it, and has no entry of ours after unprepare.
func TestDRAKubeletPrepare(t *testing.T) {
	const node = "dra-node"
	cp := draControlPlane(t, node)
	c := cp.Client
	ctx := context.Background()
	discovery := draFixtureNode(t, "dgx-h100-like.xml")
	root := t.TempDir()
	cdiRoot := filepath.Join(t.TempDir(), "cdi")
	stateDir := t.TempDir()

	var pods []*v1.Pod
	activePods := func() []*v1.Pod { return pods }
	kubelet := startDRAKubelet(t, cp, node, root, stateDir, activePods)
	defer func() { kubelet.stop() }()
	// The driver as the chart runs it: a service account with only the DRA rights, its token in
	// a file, in a JSON kubeconfig (the C++ client reads JSON).
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"tokenFile": draServiceAccount(t, cp)})
	driver := startDRADriver(t, kubeconfig, node, root, cdiRoot, discovery)

	want := draNodeSlices(t, node, "exclusive", discovery)
	waitFor(t, settle, "the driver's slices in the API server", func(ctx context.Context) (bool, string, error) {
		got, err := nodeSlices(ctx, cp, node)
		if err != nil {
			return false, "", err
		}
		n := 0
		for _, s := range got {
			n += len(s.Spec.Devices)
		}
		return len(got) == len(want) && n == len(want[0].Spec.Devices), fmt.Sprintf("%d slices, %d devices", len(got), n), nil
	})

	// The same metrics as device-plugin mode (docs/metrics.md), from the driver's snapshot.
	var scrape string
	waitFor(t, settle, "the driver's /metrics", func(ctx context.Context) (bool, string, error) {
		m := regexp.MustCompile(`metrics: serving on (127\.0\.0\.1:\d+)`).FindStringSubmatch(driver.output())
		if m == nil {
			return false, "no 'metrics: serving on' line yet", nil
		}
		resp, err := http.Get("http://" + m[1] + "/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		scrape = string(b)
		return err == nil && resp.StatusCode == http.StatusOK, resp.Status, err
	})
	for _, line := range []string{
		`rdma_device_plugin_hca_healthy{hca="mlx5_0",pci="0000:1a:00.0"} 1`,
		`rdma_device_plugin_hca_healthy{hca="mlx5_bond_0",pci="0000:c9:00.0"} 1`,
	} {
		if !strings.Contains(scrape, line+"\n") {
			t.Errorf("scrape has no line %q:\n%s", line, scrape)
		}
	}
	if !strings.Contains(scrape, `rdma_device_plugin_port_data_received_bytes_total{hca="mlx5_0",port="1"} `) {
		t.Errorf("scrape has no port counters of mlx5_0:\n%s", scrape)
	}

	// Health as a device taint: a port going down taints that HCA's device in the published
	// slice (the driver's health poll), and coming back lifts it.
	state := filepath.Join(discovery[3], "sys", "class", "infiniband", "mlx5_0", "ports", "1", "state")
	taintOf := func(ctx context.Context, device string) (string, error) {
		return deviceTaint(ctx, cp, node, device)
	}
	for _, step := range []struct{ state, taint string }{
		{"1: DOWN", draDriver + "/unhealthy=PortNotActive:NoSchedule"},
		{"4: ACTIVE", ""},
	} {
		if err := os.WriteFile(state, []byte(step.state+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		waitFor(t, settle, "mlx5_0's taint after its port went "+step.state, func(ctx context.Context) (bool, string, error) {
			taint, err := taintOf(ctx, "hca-0000-1a-00-0")
			return err == nil && taint == step.taint, fmt.Sprintf("taint %q (want %q) %v", taint, step.taint, err), nil
		})
	}

	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "hca", Namespace: "default"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "hca", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "hca." + draDriver}}}}},
	}
	if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "default"},
		Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: "hca", ResourceClaimName: &claim.Name}},
			Containers: []v1.Container{{Name: "c", Image: "localhost/x",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "hca"}}}}},
		},
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "the pod bound", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		pod = p
		return p.Spec.NodeName == node, "node " + p.Spec.NodeName, nil
	})
	pods = []*v1.Pod{pod}
	allocated, err := c.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil || allocated.Status.Allocation == nil || len(allocated.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim after scheduling: %v %+v", err, allocated.Status)
	}
	device := allocated.Status.Allocation.Devices.Results[0].Device

	// The kubelet's DRA manager prepares the claim through our driver (it waits for the
	// registration itself, within its own deadline, and errors when the driver is not there).
	prepare := func(what string) []string {
		t.Helper()
		var lastErr error
		waitFor(t, settle, what, func(ctx context.Context) (bool, string, error) {
			lastErr = kubelet.manager.PrepareResources(ctx, pod)
			if lastErr != nil {
				return false, lastErr.Error(), nil
			}
			return true, "", nil
		})
		info, err := kubelet.manager.GetResources(pod, &pod.Spec.Containers[0])
		if err != nil {
			t.Fatalf("GetResources: %v", err)
		}
		var ids []string
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		return ids
	}
	ids := prepare("PrepareResources through the driver")
	// The request's device and the one that mounts its metadata file.
	wantIDs := []string{draDriver + "/hca=" + string(allocated.UID) + "-hca", draDriver + "/hca=" + string(allocated.UID) + "_hca"}
	if strings.Join(ids, ",") != strings.Join(wantIDs, ",") {
		t.Fatalf("CDI devices %v, want %v", ids, wantIDs)
	}
	wantID := wantIDs[0] // the device's own: the kubelet names its health by the first
	specs := cdiSpecs(t, cdiRoot)
	if len(specs) != 1 {
		t.Fatalf("CDI specs after prepare: %v", specs)
	}
	// What the pod got, in the claim's status.devices (written by the driver after the prepare).
	ourStatus := func(ctx context.Context) ([]resourcev1.AllocatedDeviceStatus, error) {
		rc, err := c.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		var out []resourcev1.AllocatedDeviceStatus
		for _, d := range rc.Status.Devices {
			if d.Driver == draDriver {
				out = append(out, d)
			}
		}
		return out, nil
	}
	waitFor(t, settle, "the claim's status.devices after the kubelet's prepare", func(ctx context.Context) (bool, string, error) {
		got, err := ourStatus(ctx)
		if err != nil || len(got) != 1 {
			return false, fmt.Sprintf("%+v", got), err
		}
		return got[0].Device == device && got[0].Pool == node && got[0].Data != nil &&
			strings.Contains(string(got[0].Data.Raw), `"hcaName"`) && got[0].NetworkData != nil &&
			got[0].NetworkData.InterfaceName != "" && got[0].NetworkData.HardwareAddress != "", fmt.Sprintf("%+v", got), nil
	})

	// Health in the pod's status: the kubelet's DRA manager opened our health stream when it
	// registered the driver (ResourceHealthStatus, on by default); the allocated HCA's port going
	// DOWN reaches it as Unhealthy, it asks for the pod's status to be updated (Updates), and
	// the container's allocatedResourcesStatus says so; the port coming back says Healthy.
	hcaName := ""
	if got, err := nodeSlices(ctx, cp, node); err == nil {
		for _, s := range got {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes[resourcev1.QualifiedName(draDriver+"/hcaName")]; ok && d.Name == device && a.StringValue != nil {
					hcaName = *a.StringValue
				}
			}
		}
	}
	if hcaName == "" {
		t.Fatalf("no hcaName attribute of the allocated device %s in the node's slices", device)
	}
	portStates, err := filepath.Glob(filepath.Join(discovery[3], "sys", "class", "infiniband", hcaName, "ports", "*", "state"))
	if err != nil || len(portStates) == 0 {
		t.Fatalf("no port state files of %s: %v", hcaName, err)
	}
	healthOf := func() (v1.ResourceHealthStatus, string) {
		status := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "c"}}}
		kubelet.manager.UpdateAllocatedResourcesStatus(klog.Background(), pod, status)
		var out []string
		var health v1.ResourceHealthStatus
		for _, rs := range status.ContainerStatuses[0].AllocatedResourcesStatus {
			for _, r := range rs.Resources {
				message := ""
				if r.Message != nil {
					message = *r.Message
				}
				out = append(out, fmt.Sprintf("%s %s %s %q", rs.Name, r.ResourceID, r.Health, message))
				if rs.Name == "claim:hca" && r.ResourceID == v1.ResourceID(wantID) { // the kubelet names a device by its CDI ID
					health = r.Health
				}
			}
		}
		return health, strings.Join(out, "; ")
	}
	for _, step := range []struct {
		state, message string // message: a part of the device's health message
		health         v1.ResourceHealthStatus
	}{
		{"1: DOWN", hcaName + ": port 1 is DOWN", v1.ResourceHealthStatusUnhealthy},
		{"4: ACTIVE", "", v1.ResourceHealthStatusHealthy},
	} {
		for _, f := range portStates {
			if err := os.WriteFile(f, []byte(step.state+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		notified := false
		waitFor(t, settle, fmt.Sprintf("%s %s in the pod's allocatedResourcesStatus", hcaName, step.health), func(ctx context.Context) (bool, string, error) {
			for drained := false; !drained; {
				select {
				case u := <-kubelet.manager.Updates():
					notified = notified || slices.Contains(u.PodUIDs, string(pod.UID))
				default:
					drained = true
				}
			}
			health, all := healthOf()
			return health == step.health && notified && strings.Contains(all, step.message), fmt.Sprintf("%s (update for the pod: %v)", all, notified), nil
		})
	}

	t.Logf("prepared %s (device %s): CDI %v", claim.Name, device, ids)

	// Kubelet restart: a new manager on the same state directory (its own checkpoint says the
	// claim is prepared) and a new plugin watcher, which must find and register the driver again:
	// the manager refuses a claim whose driver is not registered.
	kubelet.stop()
	kubelet = startDRAKubelet(t, cp, node, root, stateDir, activePods)
	if got := prepare("PrepareResources after a kubelet restart"); strings.Join(got, ",") != strings.Join(wantIDs, ",") {
		t.Fatalf("after a kubelet restart: CDI devices %v, want %v", got, wantIDs)
	}

	// Plugin restart with the API server unreachable for the driver, and a kubelet that has
	// lost its own state (a fresh state directory), so that it does call NodePrepareResources:
	// the driver answers from its checkpoint, the same CDI device, without the API server.
	driver.stop(t)
	deadKubeconfig := filepath.Join(t.TempDir(), "dead.kubeconfig")
	deadConfig := `{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":"https://127.0.0.1:1","insecure-skip-tls-verify":true}}],"users":[{"name":"u","user":{"token":"x"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`
	if err := os.WriteFile(deadKubeconfig, []byte(deadConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	driver = startDRADriver(t, deadKubeconfig, node, root, cdiRoot, discovery)
	kubelet.stop()
	kubelet = startDRAKubelet(t, cp, node, root, t.TempDir(), activePods)
	if got := prepare("PrepareResources from the driver's checkpoint, API server unreachable"); strings.Join(got, ",") != strings.Join(wantIDs, ",") {
		t.Fatalf("after a plugin restart: CDI devices %v, want %v\ndriver log:\n%s", got, wantIDs, driver.output())
	}
	if len(cdiSpecs(t, cdiRoot)) != 1 {
		t.Fatalf("CDI specs after restarts: %v", cdiSpecs(t, cdiRoot))
	}

	// Back to a reachable API server; the kubelet restarts wiped the node's slices (the DRA
	// plugin manager does at start), and the driver publishes them again.
	driver.stop(t)
	driver = startDRADriver(t, kubeconfig, node, root, cdiRoot, discovery)
	waitFor(t, settle, "the slices published again after the kubelet's wipe", func(ctx context.Context) (bool, string, error) {
		got, err := nodeSlices(ctx, cp, node)
		if err != nil {
			return false, "", err
		}
		return len(got) == len(want), fmt.Sprintf("%d slices", len(got)), nil
	})

	// Unprepare: the kubelet's manager calls NodeUnprepareResources; the CDI spec goes.
	pods = nil
	waitFor(t, settle, "UnprepareResources through the driver", func(ctx context.Context) (bool, string, error) {
		if err := kubelet.manager.UnprepareResources(ctx, pod); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
	if specs := cdiSpecs(t, cdiRoot); len(specs) != 0 {
		t.Errorf("CDI specs after unprepare: %v\ndriver log:\n%s", specs, driver.output())
	}
	// ... and our entries of the claim's status.devices (the driver that wrote them was restarted
	// twice since: what it removes is what the claim holds, not what it remembers).
	waitFor(t, settle, "the claim's status.devices after unprepare", func(ctx context.Context) (bool, string, error) {
		got, err := ourStatus(ctx)
		return err == nil && len(got) == 0, fmt.Sprintf("%+v", got), err
	})
}

// deviceTaint: the first taint of `device` in the node's published slices as "key=value:effect",
// "" when it has none.
func deviceTaint(ctx context.Context, cp *ControlPlane, node, device string) (string, error) {
	got, err := nodeSlices(ctx, cp, node)
	if err != nil {
		return "", err
	}
	for _, s := range got {
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				for _, taint := range d.Taints {
					return taint.Key + "=" + taint.Value + ":" + string(taint.Effect), nil
				}
				return "", nil
			}
		}
	}
	return "", fmt.Errorf("no device %s", device)
}

// TestDRAEarlyWarningTaints: early-warning health (docs/server.md) as device taints in the
// slices the driver publishes, each step awaited through the API server: with --flap-count 1,
// mlx5_0's port goes DOWN and back twice, and it stays tainted unhealthy=Flapping while its port
// is ACTIVE; mlx5_1's symbol_error counter grows by 50 within a poll, and it is tainted
// degraded=SymbolErrors with effect None (still usable: not unhealthy).
func TestDRAEarlyWarningTaints(t *testing.T) {
	const node = "dra-node"
	cp := draControlPlane(t, node)
	discovery := draFixtureNode(t, "dgx-h100-like.xml")
	root := shortDir(t) // the sockets' paths: t.TempDir() has the test's name in it
	kubelet := startDRAKubelet(t, cp, node, root, t.TempDir(), func() []*v1.Pod { return nil })
	defer func() { kubelet.stop() }()
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"tokenFile": draServiceAccount(t, cp)})
	startDRAProcess(t, append([]string{"dra", "--mode", "exclusive", "--node-name", node,
		"--kubeconfig", kubeconfig, "--kubelet-dir", root, "--cdi-root", filepath.Join(t.TempDir(), "cdi"),
		"--health-interval", "200ms", "--flap-count", "1"}, discovery...))
	sys := filepath.Join(discovery[3], "sys", "class", "infiniband")
	deviceOf := func(hca string) string {
		pci, err := filepath.EvalSymlinks(filepath.Join(sys, hca, "device"))
		if err != nil {
			t.Fatal(err)
		}
		return "hca-" + strings.NewReplacer(":", "-", ".", "-").Replace(filepath.Base(pci))
	}
	step := func(what, device, want string) {
		t.Helper()
		waitFor(t, settle, what, func(ctx context.Context) (bool, string, error) {
			taint, err := deviceTaint(ctx, cp, node, device)
			return err == nil && taint == want, fmt.Sprintf("%s: taint %q (want %q) %v", device, taint, want, err), nil
		})
	}
	write := func(path, text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flapping, degraded := deviceOf("mlx5_0"), deviceOf("mlx5_1")
	step("published", flapping, "")
	state := filepath.Join(sys, "mlx5_0", "ports", "1", "state")
	for i, s := range []struct{ state, taint string }{
		{"1: DOWN", draDriver + "/unhealthy=PortNotActive:NoSchedule"},
		{"4: ACTIVE", ""}, // one flap: not more than 1
		{"1: DOWN", draDriver + "/unhealthy=PortNotActive:NoSchedule"},
		{"4: ACTIVE", draDriver + "/unhealthy=Flapping:NoSchedule"},
	} {
		write(state, s.state)
		step(fmt.Sprintf("step %d: mlx5_0 %s", i, s.state), flapping, s.taint)
	}
	step("mlx5_1 before", degraded, "")
	write(filepath.Join(sys, "mlx5_1", "ports", "1", "counters", "symbol_error"), "50")
	step("mlx5_1's symbol errors", degraded, draDriver+"/degraded=SymbolErrors:None")
}
