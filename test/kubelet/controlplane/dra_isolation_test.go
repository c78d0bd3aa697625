package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// shortDir: a temporary directory with a short path (a unix socket's path has at most 107
// bytes, and t.TempDir() has the test's name in it), removed at the end of the test.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// draNodeEnv is one DRA node of the harness: the control plane with the chart's DeviceClass, the
// kubelet's DRA and plugin managers, and the driver binary publishing the fixture's HCAs as the
// least-privilege service account.
type draNodeEnv struct {
	t       *testing.T
	cp      *ControlPlane
	node    string
	kubelet *draKubelet
	driver  *draProcess
	cdiRoot string
	root    string // the kubelet's directory: plugins/<driver>/ holds the driver's checkpoint
	// By device name: the HCA's kernel name and uverbs node, from the slices the node publishes.
	hcaName map[string]string
	uverbs  map[string]string
	pods    []*v1.Pod
}

func startDRANodeEnv(t *testing.T, xml string) *draNodeEnv {
	t.Helper()
	return startDRANodeEnvMode(t, xml, "exclusive")
}

// startDRANodeEnvMode: startDRANodeEnv with the driver in `mode` (exclusive or shared) and its
// further flags.
func startDRANodeEnvMode(t *testing.T, xml, mode string, flags ...string) *draNodeEnv {
	t.Helper()
	const node = "dra-node"
	cp := draControlPlane(t, node)
	discovery := draFixtureNode(t, xml)
	e := &draNodeEnv{t: t, cp: cp, node: node, cdiRoot: filepath.Join(t.TempDir(), "cdi"),
		hcaName: map[string]string{}, uverbs: map[string]string{}}
	root := shortDir(t)
	e.root = root
	e.kubelet = startDRAKubelet(t, cp, node, root, t.TempDir(), func() []*v1.Pod { return e.pods })
	t.Cleanup(func() { e.kubelet.stop() })
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"tokenFile": draServiceAccount(t, cp)})
	e.driver = startDRADriverMode(t, mode, kubeconfig, node, root, e.cdiRoot, append(discovery, flags...))
	want := draNodeSlices(t, node, mode, discovery)
	for _, s := range want {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[resourcev1.QualifiedName(draDriver+"/hcaName")]; ok && a.StringValue != nil {
				e.hcaName[d.Name] = *a.StringValue
			}
			if a, ok := d.Attributes[resourcev1.QualifiedName(draDriver+"/uverbs")]; ok && a.StringValue != nil {
				e.uverbs[d.Name] = "/dev/infiniband/" + *a.StringValue
			}
		}
	}
	waitFor(t, settle, "the driver's slices in the API server", func(ctx context.Context) (bool, string, error) {
		got, err := nodeSlices(ctx, cp, node)
		if err != nil {
			return false, "", err
		}
		return len(got) == len(want), fmt.Sprintf("%d slices", len(got)), nil
	})
	return e
}

// run creates the pod, waits until the scheduler bound it, and has the kubelet's DRA manager
// prepare its claims through the driver. Returns the pod as bound (its status names the
// extended-resource claim).
func (e *draNodeEnv) run(pod *v1.Pod) *v1.Pod {
	e.t.Helper()
	c := e.cp.Client
	if _, err := c.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	waitFor(e.t, settle, pod.Name+" bound", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		pod = p
		return p.Spec.NodeName == e.node, "node " + p.Spec.NodeName, nil
	})
	e.pods = append(e.pods, pod)
	waitFor(e.t, settle, "PrepareResources of "+pod.Name, func(ctx context.Context) (bool, string, error) {
		if err := e.kubelet.manager.PrepareResources(ctx, pod); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
	return pod
}

// allocated: the devices of ours the claim's request got ("" = every request).
func (e *draNodeEnv) allocated(ns, claim, request string) []string {
	e.t.Helper()
	rc, err := e.cp.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), claim, metav1.GetOptions{})
	if err != nil || rc.Status.Allocation == nil {
		e.t.Fatalf("claim %s/%s: %v, allocation %v", ns, claim, err, rc.Status.Allocation)
	}
	var out []string
	for _, r := range rc.Status.Allocation.Devices.Results {
		if r.Driver == draDriver && (request == "" || r.Request == request) {
			out = append(out, r.Device)
		}
	}
	return out
}

// inside is what a container gets from the runtime: the CDI devices the kubelet's DRA manager
// hands it (GetResources), injected into an empty OCI spec by the CDI library over the driver's
// CDI directory, as containerd and CRI-O do.
type inside struct {
	ids     []string
	devices map[string]bool      // device node paths
	env     map[string]string    // KEY -> value
	mounts  map[string]oci.Mount // by path in the container
}

func (e *draNodeEnv) inside(pod *v1.Pod, container string) inside {
	e.t.Helper()
	var ctr *v1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container {
			ctr = &pod.Spec.Containers[i]
		}
	}
	if ctr == nil {
		e.t.Fatalf("pod %s has no container %s", pod.Name, container)
	}
	info, err := e.kubelet.manager.GetResources(pod, ctr)
	if err != nil {
		e.t.Fatalf("GetResources(%s/%s): %v", pod.Name, container, err)
	}
	in := inside{devices: map[string]bool{}, env: map[string]string{}, mounts: map[string]oci.Mount{}}
	for _, d := range info.CDIDevices {
		in.ids = append(in.ids, d.Name)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(e.cdiRoot), cdi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	for path, errs := range cache.GetErrors() {
		e.t.Errorf("CDI cache: %s: %v", path, errs)
	}
	// As the runtime builds it: the container's env from the pod spec first, then the CDI
	// devices' edits (containerd's CRI plugin), which replace a name already set.
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	for _, ev := range ctr.Env {
		spec.Process.Env = append(spec.Process.Env, ev.Name+"="+ev.Value)
	}
	if unresolved, err := cache.InjectDevices(spec, in.ids...); err != nil {
		e.t.Fatalf("%s/%s: InjectDevices(%v): unresolved %v: %v", pod.Name, container, in.ids, unresolved, err)
	}
	for _, d := range spec.Linux.Devices {
		in.devices[d.Path] = true
	}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		in.env[k] = v
	}
	for _, m := range spec.Mounts {
		in.mounts[m.Destination] = m
	}
	return in
}

// ncclNames: the HCA names NCCL_IB_HCA lists ("=mlx5_0,mlx5_3", ports "mlx5_0:1" stripped), sorted.
func ncclNames(v string) []string {
	var out []string
	for _, h := range strings.Split(strings.TrimPrefix(v, "="), ",") {
		if h = strings.TrimSpace(h); h != "" {
			name, _, _ := strings.Cut(h, ":")
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// checkHolds: the container's uverbs nodes are exactly those of `devices`, and NCCL_IB_HCA names
// exactly their HCAs.
func (e *draNodeEnv) checkHolds(what string, in inside, devices []string) {
	e.t.Helper()
	var wantNodes, wantNames, gotNodes []string
	for _, d := range devices {
		wantNodes = append(wantNodes, e.uverbs[d])
		wantNames = append(wantNames, e.hcaName[d])
	}
	for p := range in.devices {
		if strings.HasPrefix(p, "/dev/infiniband/uverbs") {
			gotNodes = append(gotNodes, p)
		}
	}
	sort.Strings(wantNodes)
	sort.Strings(wantNames)
	sort.Strings(gotNodes)
	if strings.Join(gotNodes, ",") != strings.Join(wantNodes, ",") {
		e.t.Errorf("%s: uverbs nodes %v (CDI %v), want %v (devices %v)", what, gotNodes, in.ids, wantNodes, devices)
	}
	if !in.devices["/dev/infiniband/rdma_cm"] {
		e.t.Errorf("%s: no rdma_cm", what)
	}
	if got := ncclNames(in.env["NCCL_IB_HCA"]); strings.Join(got, ",") != strings.Join(wantNames, ",") {
		e.t.Errorf("%s: NCCL_IB_HCA=%q names %v, want %v (env %v)", what, in.env["NCCL_IB_HCA"], got, wantNames, in.env)
	}
	if got := strings.Split(in.env["RDMA_HCA_NAMES"], ","); len(devices) > 0 {
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(wantNames, ",") {
			e.t.Errorf("%s: RDMA_HCA_NAMES=%q, want %v", what, in.env["RDMA_HCA_NAMES"], wantNames)
		}
	}
	e.t.Logf("%s: CDI %v, uverbs %v, NCCL_IB_HCA=%s", what, in.ids, gotNodes, in.env["NCCL_IB_HCA"])
}

func hcaClaim(name string, requests ...string) *resourcev1.ResourceClaim {
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	for _, r := range requests {
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourcev1.DeviceRequest{
			Name: r, Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "hca." + draDriver}})
	}
	return claim
}

// claimPod: a pod whose containers use the claims listed per container ("claim" or
// "claim/request"), every claim named in the pod's resourceClaims.
func claimPod(name string, containers map[string][]string) *v1.Pod {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	seen := map[string]bool{}
	var names []string
	for c := range containers {
		names = append(names, c)
	}
	sort.Strings(names)
	for _, c := range names {
		ctr := v1.Container{Name: c, Image: "localhost/x"}
		for _, use := range containers[c] {
			claim, request, _ := strings.Cut(use, "/")
			ctr.Resources.Claims = append(ctr.Resources.Claims, v1.ResourceClaim{Name: claim, Request: request})
			if !seen[claim] {
				seen[claim] = true
				pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, v1.PodResourceClaim{Name: claim, ResourceClaimName: ptr.To(claim)})
			}
		}
		pod.Spec.Containers = append(pod.Spec.Containers, ctr)
	}
	return pod
}

// TestDRAPerContainerIsolation: the kubelet hands CDI devices to containers per request
// (cdiDevicesAsList, and for the extended resource through the pod's request mappings); each
// container must get exactly the HCAs of the requests it uses, and an environment that names
// every HCA it holds. Three pods, prepared by the kubelet's DRA manager through the driver, each
// container's CDI devices injected by the CDI library:
//   - two containers asking rdma/hca: 1 each (one scheduler-made claim, two requests);
//   - one claim with two requests, one per container;
//   - one container using two claims;
//   - a container whose pod spec sets NCCL_IB_HCA itself: its value wins over the CDI spec's.
func TestDRAPerContainerIsolation(t *testing.T) {
	e := startDRANodeEnv(t, "dgx-h100-like.xml")
	c := e.cp.Client
	ctx := context.Background()

	t.Run("TwoContainersExtendedResource", func(t *testing.T) {
		e.t = t
		one := resource.MustParse("1")
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "two-ext", Namespace: "default"}}
		for _, name := range []string{"a", "b"} {
			pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: name, Image: "localhost/x",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"rdma/hca": one}, Requests: v1.ResourceList{"rdma/hca": one}}})
		}
		pod = e.run(pod)
		st := pod.Status.ExtendedResourceClaimStatus
		if st == nil {
			t.Fatalf("pod has no extended-resource claim status")
		}
		seen := map[string]string{}
		for _, m := range st.RequestMappings {
			devices := e.allocated("default", st.ResourceClaimName, m.RequestName)
			if len(devices) != 1 {
				t.Fatalf("container %s request %s: devices %v, want 1", m.ContainerName, m.RequestName, devices)
			}
			if other, dup := seen[devices[0]]; dup {
				t.Fatalf("containers %s and %s both got %s", other, m.ContainerName, devices[0])
			}
			seen[devices[0]] = m.ContainerName
			e.checkHolds("container "+m.ContainerName, e.inside(pod, m.ContainerName), devices)
		}
		if len(seen) != 2 {
			t.Errorf("request mappings %+v: want one per container", st.RequestMappings)
		}
	})

	t.Run("OneClaimTwoRequestsTwoContainers", func(t *testing.T) {
		e.t = t
		if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, hcaClaim("pair", "left", "right"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := e.run(claimPod("two-requests", map[string][]string{"l": {"pair/left"}, "r": {"pair/right"}}))
		e.checkHolds("container l", e.inside(pod, "l"), e.allocated("default", "pair", "left"))
		e.checkHolds("container r", e.inside(pod, "r"), e.allocated("default", "pair", "right"))
	})

	t.Run("OneContainerTwoClaims", func(t *testing.T) {
		e.t = t
		for _, name := range []string{"gpu0-hca", "gpu1-hca"} {
			if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, hcaClaim(name, "hca"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		pod := e.run(claimPod("two-claims", map[string][]string{"trainer": {"gpu0-hca", "gpu1-hca"}}))
		both := append(e.allocated("default", "gpu0-hca", ""), e.allocated("default", "gpu1-hca", "")...)
		in := e.inside(pod, "trainer")
		e.checkHolds("container trainer", in, both)
		// Each set also in its own variables, none dropped.
		sets := 0
		for k := range in.env {
			if strings.HasPrefix(k, "RDMA_HCA_NAMES_") {
				sets++
			}
		}
		if sets != 2 {
			t.Errorf("%d RDMA_HCA_NAMES_* variables, want one per claim: %v", sets, in.env)
		}
	})

	t.Run("PodSpecValueWins", func(t *testing.T) {
		e.t = t
		if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, hcaClaim("own-env", "hca"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := claimPod("own-env", map[string][]string{"c": {"own-env"}})
		const mine = "=mlx5_99:1"
		pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "NCCL_IB_HCA", Value: mine}}
		pod = e.run(pod)
		devices := e.allocated("default", "own-env", "")
		in := e.inside(pod, "c")
		if in.env["NCCL_IB_HCA"] != mine {
			t.Errorf("NCCL_IB_HCA=%q, want the pod spec's %q (env %v)", in.env["NCCL_IB_HCA"], mine, in.env)
		}
		// The rest as usual: the device nodes, and RDMA_HCA_NAMES naming the claim's HCAs.
		var want []string
		for _, d := range devices {
			want = append(want, e.hcaName[d])
		}
		sort.Strings(want)
		if got := strings.Split(in.env["RDMA_HCA_NAMES"], ","); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("RDMA_HCA_NAMES=%q, want %v", in.env["RDMA_HCA_NAMES"], want)
		}
		for _, d := range devices {
			if !in.devices[e.uverbs[d]] {
				t.Errorf("no %s (device %s) in %v", e.uverbs[d], d, in.devices)
			}
		}
	})
}
