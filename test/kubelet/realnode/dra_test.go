package realnode

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

const (
	draDriver = "rdma.network.alibabacloud.com"
	hcaClass  = "hca." + draDriver
	gpuDriver = "gpu.example.com" // the test's fake GPU driver and its DeviceClass
)

// TestRealNodeDRA: the chart's DRA driver on a real kubelet, claims prepared by the kubelet through
// our driver and injected by containerd through CDI; the fake GPU driver beside it; restarts.
func TestRealNodeDRA(t *testing.T) {
	c := up(t, "--driver", "dra", "--mode", "exclusive", "--nri")
	usable := c.usableHCAs()

	// One claim from the chart's DeviceClass.
	c.claim("one", request("hca", hcaClass, 1))
	c.create(claimPod("claim-one", map[string][]string{"c": {"one"}}))
	c.waitRunning(podTimeout, "claim-one")
	got := c.allocated("one", "hca")
	c.checkExactly("claim one", c.inside("claim-one", "c"), got)
	c.checkMknodDenied("claim one", "claim-one", "c", kubelet.Minus(usable, got)[0])
	c.checkDeviceMetadata("claim one", "claim-one", "c", "one", "hca", got)
	specs := c.cdiSpecs()
	t.Logf("CDI specs with claim-one running: %v", specs)
	if !containsClaim(specs, c.claimUID("one")) {
		t.Errorf("no CDI spec for claim one (uid %s) in %v", c.claimUID("one"), specs)
	}

	// A plain rdma/hca: 1 pod, through the DeviceClass's extended resource.
	c.create(workloadPod("extended", nil, ctr{name: "c", limits: hca(1)}))
	c.waitRunning(podTimeout, "extended")
	in := c.inside("extended", "c")
	ext := ncclHCAs(in.env["NCCL_IB_HCA"])
	if len(ext) != 1 {
		t.Errorf("extended: NCCL_IB_HCA=%q, want one HCA", in.env["NCCL_IB_HCA"])
	}
	c.checkExactly("extended resource", in, ext)

	// A variable the pod spec sets is the container's, not the CDI spec's.
	c.claim("user", request("hca", hcaClass, 1))
	user := claimPod("user-env", map[string][]string{"c": {"user"}})
	user.Spec.Containers[0].Env = []v1.EnvVar{{Name: "NCCL_IB_HCA", Value: "=mlx5_chosen_by_the_user"}}
	c.create(user)
	c.waitRunning(podTimeout, "user-env")
	c.checkPodSpecWins("user-env (DRA)", c.inside("user-env", "c"), "=mlx5_chosen_by_the_user", 1)
	c.deletePods(podTimeout, "user-env")

	// Deleting the pod removes its claim's CDI spec.
	uid := c.claimUID("one")
	c.deletePods(podTimeout, "claim-one")
	eventually(t, podTimeout, "claim one's CDI spec removed", func() (bool, string) {
		s := c.cdiSpecs()
		return !containsClaim(s, uid), fmt.Sprint(s)
	})
	t.Logf("claim-one deleted: its CDI spec is gone (%v left)", c.cdiSpecs())

	t.Run("GPUAndHCA", func(t *testing.T) { draGPUAndHCA(t, c.with(t)) })
	t.Run("PerContainer", func(t *testing.T) { draPerContainer(t, c.with(t)) })
	t.Run("Rollout", func(t *testing.T) { draRollout(t, c.with(t)) })
	t.Run("DriverReload", func(t *testing.T) {
		c := c.with(t)
		c.heldClaim("through-reload")
		uid := c.claimUID("through-reload")
		driverReload(t, c, "through-reload", func() string {
			return fmt.Sprintf("claim through-reload allocated %v, its CDI spec written: %v",
				c.allocated("through-reload", "hca"), containsClaim(c.cdiSpecs(), uid))
		})
		c.deletePods(podTimeout, "through-reload")
	})
	t.Run("Restarts", func(t *testing.T) { draRestarts(t, c.with(t)) })
}

// request: an exactly-count request for class.
func request(name, class string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
}

func (c *cluster) claim(name string, requests ...resourceapi.DeviceRequest) {
	c.claimWith(name, nil, requests...)
}

func (c *cluster) claimWith(name string, constraints []resourceapi.DeviceConstraint, requests ...resourceapi.DeviceRequest) {
	c.t.Helper()
	_, err := c.client.ResourceV1().ResourceClaims(testNS).Create(c.ctx(), &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests, Constraints: constraints}},
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("claim %s: %v", name, err)
	}
}

// claimPod: one container per key of uses, each using the claims listed ("claim" or
// "claim/request").
func claimPod(name string, uses map[string][]string) *v1.Pod {
	var names []string
	for k := range uses {
		names = append(names, k)
	}
	sort.Strings(names)
	podClaims := map[string]bool{}
	var ctrs []ctr
	for _, n := range names {
		x := ctr{name: n}
		for _, u := range uses[n] {
			claim, req, _ := strings.Cut(u, "/")
			podClaims[claim] = true
			x.claims = append(x.claims, v1.ResourceClaim{Name: claim, Request: req})
		}
		ctrs = append(ctrs, x)
	}
	p := workloadPod(name, nil, ctrs...)
	for _, claim := range sortedKeys(podClaims) {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: claim, ResourceClaimName: ptr.To(claim)})
	}
	return p
}

// allocated: the HCAs the scheduler allocated to the claim's request, by name.
func (c *cluster) allocated(claim, request string) []string {
	c.t.Helper()
	rc, err := c.client.ResourceV1().ResourceClaims(testNS).Get(c.ctx(), claim, metav1.GetOptions{})
	if err != nil || rc.Status.Allocation == nil {
		c.t.Fatalf("claim %s not allocated: %v", claim, err)
	}
	var out []string
	for _, r := range rc.Status.Allocation.Devices.Results {
		if r.Driver != draDriver || (request != "" && r.Request != request) {
			continue
		}
		found := false
		for _, h := range c.node.HCAs {
			if kubelet.DRADeviceName(h) == r.Device {
				out = append(out, h.Name)
				found = true
			}
		}
		if !found {
			c.t.Fatalf("claim %s: allocated device %s is not one of the node's HCAs", claim, r.Device)
		}
	}
	sort.Strings(out)
	return out
}

func (c *cluster) claimUID(name string) string {
	rc, err := c.client.ResourceV1().ResourceClaims(testNS).Get(c.ctx(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatalf("claim %s: %v", name, err)
	}
	return string(rc.UID)
}

// cdiSpecs: the files in the node's CDI directory (/var/run/cdi in its namespace).
func (c *cluster) cdiSpecs() []string {
	out, code := script("ns", "ls", "/var/run/cdi")
	if code != 0 {
		c.t.Fatalf("listing /var/run/cdi: %s", out)
	}
	return strings.Fields(out)
}

func containsClaim(specs []string, uid string) bool {
	for _, s := range specs {
		if strings.Contains(s, uid) {
			return true
		}
	}
	return false
}

// gpuDRA is the fake GPU DRA driver: a kubelet plugin (k8s.io/dynamic-resource-allocation's
// helper) registered with this node's kubelet through its plugin directories, publishing one
// device per GPU of the node with its PCIe root, and preparing claims without CDI devices.
type gpuDRA struct {
	mu       sync.Mutex
	prepared map[types.UID]bool
}

func (g *gpuDRA) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, rc := range claims {
		var devs []kubeletplugin.Device
		for _, r := range rc.Status.Allocation.Devices.Results {
			if r.Driver == gpuDriver {
				devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
			}
		}
		g.prepared[rc.UID] = true
		out[rc.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (g *gpuDRA) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, rc := range claims {
		out[rc.UID] = nil
	}
	return out, nil
}

func (g *gpuDRA) HandleError(ctx context.Context, err error, msg string) {}

func (g *gpuDRA) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (g *gpuDRA) wasPrepared(uid types.UID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.prepared[uid]
}

// startGPUDRA runs the fake GPU driver against the node: the kubelet sees its sockets at
// /var/lib/kubelet/... in the node's namespace, which is the build's run/kubelet here.
func startGPUDRA(t *testing.T, c *cluster) *gpuDRA {
	g := &gpuDRA{prepared: map[types.UID]bool{}}
	outside := func(p string) string {
		return filepath.Join(c.run, "kubelet", strings.TrimPrefix(p, "/var/lib/kubelet"))
	}
	listen := func(ctx context.Context, p string) (net.Listener, error) {
		if err := os.MkdirAll(filepath.Dir(outside(p)), 0o750); err != nil {
			return nil, err
		}
		_ = os.Remove(outside(p))
		return net.Listen("unix", outside(p))
	}
	ctx, cancel := context.WithCancel(context.Background())
	helper, err := kubeletplugin.Start(ctx, g, kubeletplugin.KubeClient(c.client), kubeletplugin.NodeName(nodeName),
		kubeletplugin.DriverName(gpuDriver),
		kubeletplugin.RegistrarDirectoryPath("/var/lib/kubelet/plugins_registry"), kubeletplugin.RegistrarListener(listen),
		kubeletplugin.PluginDataDirectoryPath("/var/lib/kubelet/plugins/"+gpuDriver), kubeletplugin.PluginListener(listen))
	if err != nil {
		cancel()
		t.Fatalf("fake GPU driver: %v", err)
	}
	t.Cleanup(func() { helper.Stop(); cancel() })
	var devices []resourceapi.Device
	for i, gpu := range c.node.GPUs {
		devices = append(devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"resource.kubernetes.io/pcieRoot": {StringValue: ptr.To(gpu.PCIeRoot)},
			"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(gpu.PCI)},
		}})
	}
	err = helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{{Devices: devices}}}}})
	if err != nil {
		t.Fatalf("fake GPU driver's slices: %v", err)
	}
	_, err = c.client.ResourceV1().DeviceClasses().Create(c.ctx(), &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: gpuDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", gpuDriver)}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("GPU DeviceClass: %v", err)
	}
	return g
}

// draGPUAndHCA: a claim pairing a GPU of the fake driver and an HCA under matchAttribute
// resource.kubernetes.io/pcieRoot; both drivers prepare it on this kubelet, and the container
// gets exactly the HCA the scheduler put under the GPU's PCIe root.
func draGPUAndHCA(t *testing.T, c *cluster) {
	g := startGPUDRA(t, c)
	root := resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot")
	c.claimWith("pair", []resourceapi.DeviceConstraint{{Requests: []string{"gpu", "hca"}, MatchAttribute: &root}},
		request("gpu", gpuDriver, 1), request("hca", hcaClass, 1))
	c.create(claimPod("gpu-hca", map[string][]string{"c": {"pair"}}))
	c.waitRunning(podTimeout, "gpu-hca")
	rc, err := c.client.ResourceV1().ResourceClaims(testNS).Get(c.ctx(), "pair", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !g.wasPrepared(rc.UID) {
		t.Errorf("the fake GPU driver was not asked to prepare claim pair")
	}
	var gpuRoot string
	for _, r := range rc.Status.Allocation.Devices.Results {
		if r.Driver == gpuDriver {
			var i int
			fmt.Sscanf(r.Device, "gpu-%d", &i)
			gpuRoot = c.node.GPUs[i].PCIeRoot
		}
	}
	hcas := c.allocated("pair", "hca")
	in := c.inside("gpu-hca", "c")
	c.checkExactly("GPU + HCA claim", in, hcas)
	for _, h := range c.node.HCAs {
		if len(hcas) == 1 && h.Name == hcas[0] {
			t.Logf("GPU + HCA claim: GPU under %s, HCA %s under %s; both drivers prepared it", gpuRoot, h.Name, h.PCIeRoot)
			if h.PCIeRoot != gpuRoot {
				t.Errorf("the HCA %s is under %s, the GPU under %s", h.Name, h.PCIeRoot, gpuRoot)
			}
		}
	}
	c.deletePods(podTimeout, "gpu-hca")
}

// draRestarts: a pod holding a claim (restartPolicy Always) through a kubelet restart (it keeps
// its devices; a new pod starts) and a node reboot (the driver registers again, the claim is
// prepared again for the restarted container, and the CDI directory holds exactly the specs of
// the claims in use).
func draRestarts(t *testing.T, c *cluster) {
	want, before := c.heldClaim("kept")

	if out, code := script("restart", "kubelet"); code != 0 {
		t.Fatalf("restart kubelet: %s", out)
	}
	now := parseProbe(t, c.execSoon("kept", "c", probe))
	if describe(now) != describe(before) {
		t.Errorf("after a kubelet restart kept sees %s, before %s", describe(now), describe(before))
	}
	t.Logf("after a kubelet restart: kept still sees %s", describe(now))
	c.create(workloadPod("after-kubelet-restart", nil, ctr{name: "c", limits: hca(1)}))
	c.waitRunning(podTimeout, "after-kubelet-restart")
	in := c.inside("after-kubelet-restart", "c")
	c.checkExactly("new pod after a kubelet restart", in, ncclHCAs(in.env["NCCL_IB_HCA"]))
	c.deletePods(podTimeout, "after-kubelet-restart", "extended")

	if out, code := script("reboot"); code != 0 {
		t.Fatalf("reboot: %s", out)
	}
	eventually(t, 2*podTimeout, "kept's container started again after the reboot", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(testNS).Get(c.ctx(), "kept", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return allStarted(p) && p.Status.ContainerStatuses[0].RestartCount > 0, podState(p)
	})
	after := c.inside("kept", "c")
	c.checkExactly("kept after the reboot", after, want)
	specs := c.cdiSpecs()
	t.Logf("after the reboot: CDI specs %v", specs)
	var ours []string
	for _, s := range specs {
		if strings.HasPrefix(s, draDriver) || strings.Contains(s, "rdma") {
			ours = append(ours, s)
		}
	}
	if len(ours) != 1 || !containsClaim(ours, c.claimUID("kept")) {
		t.Errorf("after the reboot the CDI directory holds %v, want only kept's claim %s", specs, c.claimUID("kept"))
	}
	c.deletePods(podTimeout, "kept")
}

// checkDeviceMetadata reads the standard device metadata file (KEP-5304) inside a running
// container, at the path a workload knows from its claim and request, and decodes it with the
// upstream package: both versions valid, naming the claim, the request and exactly the HCAs
// `want` (by name), each device of our driver with its attributes.
func (c *cluster) checkDeviceMetadata(what, pod, container, claim, request string, want []string) {
	c.t.Helper()
	path := fmt.Sprintf("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/%s/%s/%s-metadata.json",
		claim, request, draDriver)
	text := c.exec(pod, container, "cat "+path)
	beta, alpha, err := kubelet.DecodeDRAMetadata([]byte(text))
	if err != nil {
		c.t.Errorf("%s: %s inside %s/%s: %v\n%s", what, path, pod, container, err, text)
		return
	}
	if beta.Name != claim || len(beta.Requests) != 1 || beta.Requests[0].Name != request {
		c.t.Errorf("%s: metadata names claim %q, requests %+v; want claim %q, request %q", what, beta.Name, beta.Requests, claim, request)
		return
	}
	var got []string
	for _, d := range beta.Requests[0].Devices {
		if d.Driver != draDriver || len(d.Attributes) == 0 {
			c.t.Errorf("%s: metadata device %s: driver %q, %d attributes", what, d.Name, d.Driver, len(d.Attributes))
		}
		for _, h := range c.node.HCAs {
			if kubelet.DRADeviceName(h) == d.Name {
				got = append(got, h.Name)
			}
		}
	}
	sort.Strings(got)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		c.t.Errorf("%s: the metadata file inside the container names %v, the scheduler allocated %v", what, got, want)
	}
	if alpha.Name != claim || len(alpha.Requests) != 1 || len(alpha.Requests[0].Devices) != len(want) {
		c.t.Errorf("%s: the v1alpha1 object says otherwise: %+v", what, alpha)
	}
	c.t.Logf("%s: %s inside the container names %v", what, path, got)
}
