package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/utils/ptr"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

const (
	benchGPUDriver = "gpu.example.com" // the GPU driver stand-in and its DeviceClass
	benchLabel     = "rdp-sched-bench" // on every claim and pod of the benchmark: its class
	benchWorkers   = 8                 // concurrent API calls when creating objects
	classGPUOnly   = "gpu-only"
	classGPUAndHCA = "gpu-and-hca"
)

// schedulerFigures is scheduler.json (docs/benchmarks.md, bench/scheduler_summary.py): pods_per_s,
// ratio, misses and allocate_x_root_only are the figures; the rest says what was measured.
type schedulerFigures struct {
	PodsPerS struct {
		GPUOnly   float64 `json:"gpu_only"`
		GPUAndHCA float64 `json:"gpu_and_hca"`
	} `json:"pods_per_s"`
	// Ratio is pods_per_s.gpu_and_hca / pods_per_s.gpu_only.
	Ratio float64 `json:"ratio"`
	// Misses counts the gpu+hca pods whose HCA is not on their GPU's PCIe root, or whose claim
	// is not allocated on the pod's node.
	Misses  int `json:"misses"`
	Nodes   int `json:"nodes"`
	Pods    int `json:"pods"` // per class
	Seconds struct {
		GPUOnly   float64 `json:"gpu_only"`
		GPUAndHCA float64 `json:"gpu_and_hca"`
	} `json:"seconds"`
	// AllocateXRootOnly is what our attributes cost the scheduler (allocateXRootOnly).
	AllocateXRootOnly float64 `json:"allocate_x_root_only"`
	// PeakRSSMiB is the test process's (API server, etcd, scheduler, controllers) VmHWM.
	PeakRSSMiB float64 `json:"harness_peak_rss_mib"`
}

// TestSchedulerBench measures the real kube-scheduler allocating DRA claims on a large cluster of
// DGX-H100-like nodes (docs/benchmarks.md, "Scheduler"). scripts/bench.sh --scheduler runs it:
//
//	RDP_SCHED_BENCH_OUT=<file> test/kubelet/run.sh --scheduler-bench <file>
//
// RDP_SCHED_BENCH_NODES (1000) Ready Nodes without kubelets, each with our driver's slices as
// `rdma-device-plugin dra slices` prints them for test/data/dgx-h100-like.xml (exclusive mode)
// and a GPU driver stand-in's slice of the node's 8 GPUs, both carrying
// resource.kubernetes.io/pcieRoot; the chart's DeviceClasses. Then, per class, one after the
// other on the same cluster, RDP_SCHED_BENCH_PODS (500) pods each with a ResourceClaim of its own
// (created first, not timed): gpu-only asks one GPU, gpu-and-hca one GPU and one HCA under
// matchAttribute pcieRoot. pods/s is the class's pods over the time from its first pod created
// to its last pod bound. Between classes every pod and claim is deleted and deallocated (the
// resource-claim controller runs) so that both classes see the same free devices; a small
// untimed round of each class comes first, so that neither pays the caches' first fill.
// Every gpu-and-hca claim is then checked: its HCA's pcieRoot is its GPU's (misses: there must
// be none). Last, in process, what our attributes cost the scheduler's allocator
// (allocateXRootOnly). The figures go to $RDP_SCHED_BENCH_OUT as JSON.
func TestSchedulerBench(t *testing.T) {
	out := os.Getenv("RDP_SCHED_BENCH_OUT")
	if out == "" {
		t.Skip("a benchmark: RDP_SCHED_BENCH_OUT=<file> (scripts/bench.sh --scheduler)")
	}
	nodes := kubelet.EnvInt(t, "RDP_SCHED_BENCH_NODES", 1000)
	pods := kubelet.EnvInt(t, "RDP_SCHED_BENCH_PODS", 500)
	setup := time.Now()
	b := newSchedBench(t, nodes)
	t.Logf("%d nodes, %d ResourceSlices set up in %v", nodes, 2*nodes, time.Since(setup).Round(time.Second))

	warm := min(pods, 10)
	for _, class := range []string{classGPUOnly, classGPUAndHCA} {
		b.round(class+"-warm", class, warm)
		b.clean(class + "-warm")
	}
	var f schedulerFigures
	f.Nodes, f.Pods = nodes, pods
	gpuOnly := b.round(classGPUOnly, classGPUOnly, pods)
	b.clean(classGPUOnly)
	gpuAndHCA := b.round(classGPUAndHCA, classGPUAndHCA, pods)
	f.Misses = b.misses(classGPUAndHCA)
	b.clean(classGPUAndHCA)

	f.Seconds.GPUOnly, f.Seconds.GPUAndHCA = round3(gpuOnly.Seconds()), round3(gpuAndHCA.Seconds())
	f.PodsPerS.GPUOnly = round3(float64(pods) / gpuOnly.Seconds())
	f.PodsPerS.GPUAndHCA = round3(float64(pods) / gpuAndHCA.Seconds())
	f.Ratio = round3(gpuOnly.Seconds() / gpuAndHCA.Seconds())
	f.AllocateXRootOnly = allocateXRootOnly(t, b.node, 250)
	f.PeakRSSMiB = peakRSSMiB(t)
	t.Logf("gpu-only %d pods in %v (%.1f pods/s); gpu-and-hca %d pods in %v (%.1f pods/s); ratio %.3f; misses %d; allocate_x_root_only %.3f; peak RSS %.0f MiB",
		pods, gpuOnly.Round(time.Millisecond), f.PodsPerS.GPUOnly, pods, gpuAndHCA.Round(time.Millisecond),
		f.PodsPerS.GPUAndHCA, f.Ratio, f.Misses, f.AllocateXRootOnly, f.PeakRSSMiB)
	doc, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, append(doc, '\n'), 0o644); err != nil {
		t.Fatalf("RDP_SCHED_BENCH_OUT: %v", err)
	}
	if f.Misses != 0 {
		t.Errorf("%d of %d gpu-and-hca pods got an HCA off their GPU's PCIe root", f.Misses, pods)
	}
}

// schedBench is the cluster the rounds run on.
type schedBench struct {
	t  *testing.T
	cp *ControlPlane
	// The first node's devices; the PCIe root of each device by name is the same on every node,
	// as on identical machines.
	node  *filterFixture
	bound *boundPods
}

func benchNodeName(i int) string { return fmt.Sprintf("sched-node-%04d", i) }

// newSchedBench starts the control plane with the resource-claim controller and creates the
// nodes, their slices and the DeviceClasses.
func newSchedBench(t *testing.T, nodes int) *schedBench {
	t.Helper()
	cp := draControlPlane(t)
	b := &schedBench{t: t, cp: cp}
	startClaimController(t, cp)
	b.bound = watchBound(t, cp)
	ctx := context.Background()
	if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, kubelet.DriverClass(benchGPUDriver, benchGPUDriver),
		metav1.CreateOptions{}); err != nil {
		t.Fatalf("DeviceClass %s: %v", benchGPUDriver, err)
	}

	first, last := benchNodeName(0), benchNodeName(nodes-1)
	f := newFilterFixture(t, first)
	b.node = f
	ours := f.published
	// What the binary prints for another node is the first node's output with the name changed:
	// so every node gets exactly what the driver would publish there.
	got, err := renameNode(ours, first, last)
	if err != nil {
		t.Fatal(err)
	}
	if want := draNodeSlices(t, last, "exclusive", f.discovery); !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("dra slices for %s is not the output for %s renamed:\n got %+v\nwant %+v", last, first, got, want)
	}
	t.Logf("per node: %d HCAs of ours on roots %v, %d GPUs on roots %v", len(f.hcaRoot), f.hcaRoot, len(f.gpuRoot), f.gpuRoot)

	c := cp.Client
	err = inParallel(nodes, func(i int) error {
		name := benchNodeName(i)
		if err := createReadyNode(ctx, c, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kubernetes.io/hostname": name}}}); err != nil {
			return err
		}
		slices, err := renameNode(ours, first, name)
		if err != nil {
			return err
		}
		slices = append(slices, *gpuStandIn(name, f.gpus, i))
		for i := range slices {
			if _, err := c.ResourceV1().ResourceSlices().Create(ctx, &slices[i], metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("slice %s: %w", slices[i].Name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const stdPrefix = "resource.kubernetes.io/"

// renameNode is slices with every occurrence of the node name from replaced by to (slice names,
// nodeName, pool).
func renameNode(slices []resourcev1.ResourceSlice, from, to string) ([]resourcev1.ResourceSlice, error) {
	raw, err := json.Marshal(slices)
	if err != nil {
		return nil, err
	}
	var out []resourcev1.ResourceSlice
	if err := json.Unmarshal(bytes.ReplaceAll(raw, []byte(strconv.Quote(from)), []byte(strconv.Quote(to))), &out); err != nil {
		return nil, fmt.Errorf("slices renamed to %s: %w", to, err)
	}
	for i := range out {
		out[i].Name = strings.Replace(slices[i].Name, from, to, 1)
	}
	return out, nil
}

// gpuStandIn is a GPU driver's slice for the node: one device per GPU of the topology (gpu-<i>
// for the i-th in PCI order), with the standard PCI attributes (the GPU's own pciBusID and
// pcieRoot) and what NVIDIA's DRA driver publishes besides for an H100, so that the scheduler
// evaluates a GPU driver's attributes. The list starts at GPU start and wraps around. The
// scheduler tries devices in slice order and ours are in PCI order, so with every list starting
// at GPU 0 the first free GPU and the first free HCA of a node would always share a root, as on
// a node whose first root is free, and a pair would land on one root even with no constraint.
// Starting at GPU <node index mod 8> stands for nodes whose first free GPU is on any root: on
// most nodes the allocator has to search our HCAs under matchAttribute, and an allocation that
// ignored it would show as misses.
func gpuStandIn(node string, gpus []kubelet.GPU, start int) *resourcev1.ResourceSlice {
	s := kubelet.NodeSlice(node+"-"+benchGPUDriver, node, benchGPUDriver)
	for k := range gpus {
		i := (start + k) % len(gpus)
		g := gpus[i]
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				stdPrefix + "pcieRoot":  {StringValue: ptr.To(g.PCIeRoot)},
				stdPrefix + "pciBusID":  {StringValue: ptr.To(g.PCI)},
				"type":                  {StringValue: ptr.To("gpu")},
				"uuid":                  {StringValue: ptr.To(fmt.Sprintf("GPU-%s-%d", node, i))},
				"productName":           {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
				"architecture":          {StringValue: ptr.To("Hopper")},
				"cudaComputeCapability": {VersionValue: ptr.To("9.0.0")},
				"driverVersion":         {VersionValue: ptr.To("570.124.6")},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				"memory": {Value: resource.MustParse("80Gi")}},
		})
	}
	return s
}

// inParallel runs do(0) ... do(n-1), benchWorkers at a time; the first error.
func inParallel(n int, do func(i int) error) error {
	var g errgroup.Group
	g.SetLimit(benchWorkers)
	for i := 0; i < n; i++ {
		g.Go(func() error { return do(i) })
	}
	return g.Wait()
}

// startClaimController runs the resource-claim controller as kube-controller-manager does: a
// deleted pod's claims are released, a deleted claim that nothing reserves is deallocated and
// its finalizer removed.
func startClaimController(t *testing.T, cp *ControlPlane) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactory(cp.Client, 0)
	claims, err := resourceclaim.NewController(klog.Background(), cp.Client, factory.Core().V1().Pods(),
		factory.Scheduling().V1beta1().PodGroups(), factory.Resource().V1().ResourceClaims(),
		factory.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		t.Fatalf("resource-claim controller: %v", err)
	}
	factory.Start(ctx.Done())
	go claims.Run(ctx, 2)
	t.Cleanup(func() { cancel(); factory.Shutdown() })
}

// boundPods records when the benchmark's pods are first seen bound (spec.nodeName set).
type boundPods struct {
	mu      sync.Mutex
	at      map[string]time.Time // pod name -> when it was seen bound
	node    map[string]string    // pod name -> its node
	changed chan struct{}        // receives (without blocking) at every new binding
}

func watchBound(t *testing.T, cp *ControlPlane) *boundPods {
	t.Helper()
	b := &boundPods{at: map[string]time.Time{}, node: map[string]string{}, changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactoryWithOptions(cp.Client, 0, informers.WithNamespace("default"),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = benchLabel }))
	seen := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, ok := b.at[p.Name]; !ok {
			b.at[p.Name], b.node[p.Name] = now, p.Spec.NodeName
			select {
			case b.changed <- struct{}{}:
			default:
			}
		}
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: seen, UpdateFunc: func(_, cur any) { seen(cur) }}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	return b
}

// last: the latest time one of names was seen bound, and how many of them were.
func (b *boundPods) last(names []string) (time.Time, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var last time.Time
	n := 0
	for _, name := range names {
		if at, ok := b.at[name]; ok {
			n++
			if at.After(last) {
				last = at
			}
		}
	}
	return last, n
}

func (b *boundPods) nodeOf(name string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.node[name]
}

// benchClaim is one pod's claim: a GPU, and for gpu-and-hca an HCA on the GPU's PCIe root.
func benchClaim(name, class, round string) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
		Labels: map[string]string{benchLabel: round}}}
	c.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "gpu",
		Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: benchGPUDriver}}}
	if class == classGPUAndHCA {
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourcev1.DeviceRequest{Name: "hca",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "hca." + draDriver}})
		c.Spec.Devices.Constraints = []resourcev1.DeviceConstraint{{Requests: []string{"gpu", "hca"},
			MatchAttribute: ptr.To(resourcev1.FullyQualifiedName(stdPrefix + "pcieRoot"))}}
	}
	return c
}

// round creates n claims of the class, then n pods using them as fast as the API server takes
// them, and returns the time from the first pod's creation to the last one seen bound.
func (b *schedBench) round(round, class string, n int) time.Duration {
	b.t.Helper()
	c := b.cp.Client
	ctx := context.Background()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%04d", round, i)
	}
	if err := inParallel(n, func(i int) error {
		_, err := c.ResourceV1().ResourceClaims("default").Create(ctx, benchClaim(names[i], class, round), metav1.CreateOptions{})
		return err
	}); err != nil {
		b.t.Fatalf("%s: claims: %v", round, err)
	}
	start := time.Now()
	if err := inParallel(n, func(i int) error {
		p := claimPod(names[i], map[string][]string{"c": {names[i]}})
		p.Labels = map[string]string{benchLabel: round}
		_, err := c.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		return err
	}); err != nil {
		b.t.Fatalf("%s: pods: %v", round, err)
	}
	deadline := time.NewTimer(5*time.Minute + time.Duration(n)*2*time.Second)
	defer deadline.Stop()
	for {
		last, bound := b.bound.last(names)
		if bound == n {
			return last.Sub(start)
		}
		select {
		case <-b.bound.changed:
		case <-deadline.C:
			b.t.Fatalf("%s: %d of %d pods bound after %v", round, bound, n, time.Since(start).Round(time.Second))
		}
	}
}

// misses counts the round's claims whose allocation is a miss (allocationMiss) on their pod's
// node.
func (b *schedBench) misses(round string) int {
	b.t.Helper()
	list, err := b.cp.Client.ResourceV1().ResourceClaims("default").List(context.Background(),
		metav1.ListOptions{LabelSelector: benchLabel + "=" + round})
	if err != nil {
		b.t.Fatal(err)
	}
	if len(list.Items) == 0 {
		b.t.Fatalf("%s: no claims to check", round)
	}
	misses := 0
	for _, claim := range list.Items {
		node := b.bound.nodeOf(claim.Name)
		if why := allocationMiss(claim.Status.Allocation, node, b.node.gpuRoot, b.node.hcaRoot); why != "" {
			misses++
			b.t.Logf("%s on %s: %s", claim.Name, node, why)
		}
	}
	return misses
}

// allocationMiss says why a gpu-and-hca claim's allocation is wrong for a pod on node: not
// allocated, no GPU of the stand-in or no HCA of ours from node's pools, or the HCA's PCIe root
// (hcaRoot, by device name) is not the GPU's (gpuRoot). "" when it is right.
func allocationMiss(a *resourcev1.AllocationResult, node string, gpuRoot, hcaRoot map[string]string) string {
	if a == nil {
		return "not allocated"
	}
	var gpu, hca string
	var got []string
	for _, r := range a.Devices.Results {
		got = append(got, r.Request+"="+r.Driver+"/"+r.Pool+"/"+r.Device)
		switch {
		case r.Pool != node:
		case r.Request == "gpu" && r.Driver == benchGPUDriver:
			gpu = gpuRoot[r.Device]
		case r.Request == "hca" && r.Driver == draDriver:
			hca = hcaRoot[r.Device]
		}
	}
	if gpu == "" || gpu != hca {
		return fmt.Sprintf("GPU on %q, HCA on %q (allocated %v)", gpu, hca, got)
	}
	return ""
}

// clean deletes the round's pods and claims and waits until the API server has none left: the
// claims deallocated, their devices free for the next round.
func (b *schedBench) clean(round string) {
	b.t.Helper()
	c := b.cp.Client
	sel := metav1.ListOptions{LabelSelector: benchLabel + "=" + round}
	ctx := context.Background()
	if err := c.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		b.t.Fatal(err)
	}
	if err := c.ResourceV1().ResourceClaims("default").DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		b.t.Fatal(err)
	}
	waitFor(b.t, 10*time.Minute, round+": pods and claims gone", func(ctx context.Context) (bool, string, error) {
		pods, err := c.CoreV1().Pods("default").List(ctx, sel)
		if err != nil {
			return false, "", err
		}
		claims, err := c.ResourceV1().ResourceClaims("default").List(ctx, sel)
		if err != nil {
			return false, "", err
		}
		return len(pods.Items)+len(claims.Items) == 0, fmt.Sprintf("%d pods, %d claims", len(pods.Items), len(claims.Items)), nil
	})
}

// peakRSSMiB is this process's VmHWM.
func peakRSSMiB(t *testing.T) float64 {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				t.Fatalf("VmHWM %q: %v", rest, err)
			}
			return round3(float64(kb) / 1024)
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// filterFixture is one node of TestSchedulerBench, and for the scheduler's structured allocator
// alone, without an API server: the allocator features, CEL cache and DeviceClasses the scheduler's
// DynamicResources plugin uses, our slices as the binary prints them for the node (published) and
// the same cut to pcieRoot alone (rootOnly: what our other attributes cost), and the roots of
// every device by name.
type filterFixture struct {
	node                string
	gpus                []kubelet.GPU
	discovery           []string // the flags that make the binary read the node's fixture
	published, rootOnly []resourcev1.ResourceSlice
	fts                 feature.Features
	celCache            *cel.Cache
	classes             kubelet.DeviceClasses
	gpuRoot, hcaRoot    map[string]string
}

func newFilterFixture(tb testing.TB, nodeName string) *filterFixture {
	tb.Helper()
	const xml = "dgx-h100-like.xml"
	node, err := kubelet.LoadNode(filepath.Join(repoRoot(), "test", "data", xml))
	if err != nil {
		tb.Fatal(err)
	}
	f := &filterFixture{node: nodeName, gpus: node.GPUs, discovery: draFixtureNode(tb, xml),
		gpuRoot: map[string]string{}, hcaRoot: map[string]string{}}
	f.published = draNodeSlices(tb, f.node, "exclusive", f.discovery)
	f.rootOnly = make([]resourcev1.ResourceSlice, len(f.published))
	for i := range f.published {
		f.published[i].DeepCopyInto(&f.rootOnly[i])
		for j := range f.rootOnly[i].Spec.Devices {
			d := &f.rootOnly[i].Spec.Devices[j]
			root := d.Attributes[stdPrefix+"pcieRoot"]
			if root.StringValue == nil {
				tb.Fatalf("dra slices: device %s has no pcieRoot", d.Name)
			}
			f.hcaRoot[d.Name] = *root.StringValue
			d.Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{stdPrefix + "pcieRoot": root}
		}
	}
	for _, d := range gpuStandIn(f.node, f.gpus, 0).Spec.Devices {
		f.gpuRoot[d.Name] = *d.Attributes[stdPrefix+"pcieRoot"].StringValue
	}
	f.fts = feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	f.celCache = cel.NewCache(10, cel.Features{EnableConsumableCapacity: f.fts.EnableDRAConsumableCapacity,
		EnableListTypeAttributes: f.fts.EnableDRAListTypeAttributes})
	// The DeviceClasses TestSchedulerBench creates: the GPU stand-in's, and the chart's for HCAs.
	f.classes = kubelet.DeviceClasses{benchGPUDriver: kubelet.DriverClass(benchGPUDriver, benchGPUDriver),
		"hca." + draDriver: kubelet.DriverClass("hca."+draDriver, draDriver)}
	return f
}

// slices is the node's: the GPU stand-in's list starting at GPU firstGPU, and ours.
func (f *filterFixture) slices(ours []resourcev1.ResourceSlice, firstGPU int) []*resourcev1.ResourceSlice {
	out := []*resourcev1.ResourceSlice{gpuStandIn(f.node, f.gpus, firstGPU)}
	for i := range ours {
		out = append(out, &ours[i])
	}
	return out
}

// allocator is the structured allocator over slices with nothing allocated, as the scheduler's
// Filter builds it for one pod.
func (f *filterFixture) allocator(tb testing.TB, slices []*resourcev1.ResourceSlice) structured.Allocator {
	tb.Helper()
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	a, err := structured.NewAllocator(context.Background(), dynamicresources.AllocatorFeatures(f.fts), state, f.classes, slices, f.celCache)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// filterClaim is benchClaim of the class as the API server stores it (one device per request),
// without the pcieRoot constraint when unconstrained.
func filterClaim(class string, unconstrained bool) *resourcev1.ResourceClaim {
	c := benchClaim("c", class, "")
	if unconstrained {
		c.Spec.Devices.Constraints = nil
	}
	for i := range c.Spec.Devices.Requests {
		c.Spec.Devices.Requests[i].Exactly.AllocationMode = resourcev1.DeviceAllocationModeExactCount
		c.Spec.Devices.Requests[i].Exactly.Count = 1
	}
	return c
}

// TestSchedulerBenchMisses: the benchmark's miss check accepts what the scheduler's allocator
// gives a gpu-and-hca claim on a node whose GPU list starts on the last root with GPUs, and
// counts the same claim without matchAttribute as a miss there (its first free HCA is on another
// root), so that misses: 0 in scheduler.json says the constraint held. Also a miss: an
// allocation from another node's pools, and none.
func TestSchedulerBenchMisses(t *testing.T) {
	f := newFilterFixture(t, "bench-node")
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.node}}
	slices := f.slices(f.published, 6)
	for _, tc := range []struct {
		unconstrained bool
		miss          bool
	}{{false, false}, {true, true}} {
		results, err := f.allocator(t, slices).Allocate(context.Background(), node,
			[]*resourcev1.ResourceClaim{filterClaim(classGPUAndHCA, tc.unconstrained)})
		if err != nil || len(results) != 1 {
			t.Fatalf("unconstrained=%v: allocate: %v, %d results", tc.unconstrained, err, len(results))
		}
		why := allocationMiss(&results[0], f.node, f.gpuRoot, f.hcaRoot)
		if (why != "") != tc.miss {
			t.Errorf("unconstrained=%v: allocationMiss(%+v) = %q, want a miss: %v", tc.unconstrained, results[0].Devices.Results, why, tc.miss)
		}
		if tc.miss {
			continue
		}
		if why := allocationMiss(&results[0], "another-node", f.gpuRoot, f.hcaRoot); why == "" {
			t.Errorf("an allocation from %s's pools is not a miss on another node", f.node)
		}
	}
	if why := allocationMiss(nil, f.node, f.gpuRoot, f.hcaRoot); why == "" {
		t.Error("no allocation is not a miss")
	}
}

// BenchmarkSchedulerFilter is where TestSchedulerBench's time goes (docs/benchmarks.md, "Where
// the scheduler's time goes"): the structured allocator the scheduler's DynamicResources plugin
// builds once per pod, whose Allocate its Filter calls for every node it tries, on one node's
// slices as TestSchedulerBench makes them. Claims: the two classes and a GPU + HCA claim without
// the constraint. Nodes: the GPU list starting on our first HCA's root (gpu-0) and on the last
// root with GPUs (gpu-6: six of our HCAs come before one on its root); our devices as published
// and cut to pcieRoot alone (what our attributes cost). Run by hand:
//
//	test/kubelet/run.sh --control-plane -run '^$' -bench BenchmarkSchedulerFilter -count 6
func BenchmarkSchedulerFilter(b *testing.B) {
	f := newFilterFixture(b, "bench-node")
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.node}}
	for _, ours := range []struct {
		name   string
		slices []resourcev1.ResourceSlice
	}{{"published", f.published}, {"pcieRoot-only", f.rootOnly}} {
		for _, start := range []int{0, 6} {
			for _, claim := range []string{classGPUOnly, classGPUAndHCA, "unconstrained"} {
				class, unconstrained := claim, claim == "unconstrained"
				if unconstrained {
					class = classGPUAndHCA
				}
				c := filterClaim(class, unconstrained)
				b.Run(fmt.Sprintf("ours=%s/first-gpu=%d/claim=%s", ours.name, start, claim), func(b *testing.B) {
					allocator := f.allocator(b, f.slices(ours.slices, start))
					ctx := context.Background()
					for b.Loop() {
						results, err := allocator.Allocate(ctx, node, []*resourcev1.ResourceClaim{c})
						if err != nil || len(results) != 1 {
							b.Fatalf("allocate %s: %v, %d results", claim, err, len(results))
						}
					}
				})
			}
		}
	}
}

// allocateXRootOnly is what our attributes cost the scheduler's allocator: its CPU time for a
// gpu-and-hca claim on the node with our slices as published over the same with our devices cut
// to pcieRoot alone, n calls of each for every start of the GPU list the cluster has. The calls
// are interleaved, each first in turn, on one locked OS thread whose CPU time is read around
// each: time the thread spends preempted by the machine's other work counts for neither.
func allocateXRootOnly(t *testing.T, f *filterFixture, n int) float64 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx := context.Background()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.node}}
	claim := []*resourcev1.ResourceClaim{filterClaim(classGPUAndHCA, false)}
	var took [2]time.Duration // published, pcieRoot alone
	for start := range f.gpus {
		allocators := [2]structured.Allocator{f.allocator(t, f.slices(f.published, start)), f.allocator(t, f.slices(f.rootOnly, start))}
		for i := 0; i < 2*n; i++ {
			which := i % 2
			if i/2%2 == 1 {
				which = 1 - which
			}
			begin := threadCPU(t)
			results, err := allocators[which].Allocate(ctx, node, claim)
			took[which] += threadCPU(t) - begin
			if err != nil || len(results) != 1 {
				t.Fatalf("allocate on %s, GPUs from %d: %v, %d results", f.node, start, err, len(results))
			}
		}
	}
	return round3(took[0].Seconds() / took[1].Seconds())
}

// threadCPU is the CPU time of the calling OS thread.
func threadCPU(t *testing.T) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		t.Fatalf("clock_gettime(CLOCK_THREAD_CPUTIME_ID): %v", err)
	}
	return time.Duration(ts.Nano())
}
