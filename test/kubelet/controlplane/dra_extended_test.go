package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// draBinary is the plugin binary (RDP_BINARY, which run.sh exports); the DRA tests fail
// without it rather than skip, so that a CI that lost the binary does not pass them silently.
func draBinary(t testing.TB) string {
	t.Helper()
	b := os.Getenv("RDP_BINARY")
	if b == "" {
		t.Fatal("RDP_BINARY is not set: run through test/kubelet/run.sh --control-plane with a built binary")
	}
	if _, err := os.Stat(b); err != nil {
		t.Fatalf("RDP_BINARY: %v", err)
	}
	return b
}

// runBinary runs the plugin binary under a deadline and returns its stdout.
func runBinary(t testing.TB, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, draBinary(t), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(cmd.Path), strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// draFixtureNode lays out the sysfs and /dev trees of a bundled topology (test/data/<xml>) with
// the binary's own `fixture` subcommand and returns the discovery flags that read them.
func draFixtureNode(t testing.TB, xml string) []string {
	t.Helper()
	root := t.TempDir()
	path := filepath.Join(repoRoot(), "test", "data", xml)
	runBinary(t, "fixture", "--topology-xml", path, "--out", root)
	return []string{"--topology-xml", path, "--sysfs-root", root, "--dev-root", root}
}

// draNodeSlices: what `rdma-device-plugin dra slices` prints for the node.
func draNodeSlices(t testing.TB, node, mode string, discovery []string) []resourcev1.ResourceSlice {
	t.Helper()
	out := runBinary(t, append([]string{"dra", "slices", "--node-name", node, "--mode", mode}, discovery...)...)
	var list struct {
		Items []resourcev1.ResourceSlice `json:"items"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("dra slices: %v\n%s", err, out)
	}
	if len(list.Items) == 0 {
		t.Fatalf("dra slices printed no slice for %s", node)
	}
	return list.Items
}

// chartDeviceClasses are the DeviceClasses the chart installs in DRA mode, rendered by helm:
// hca.<driver> (every HCA, for claims) and hca-exclusive.<driver> (the extended resource).
func chartDeviceClasses(t *testing.T, h *helm) []*resourcev1.DeviceClass {
	t.Helper()
	out := h.must("template", "rdp", h.chart, "--set", "image.repository="+testRepository,
		"--set", "driver=dra", "--show-only", "templates/dra.yaml")
	var classes []*resourcev1.DeviceClass
	for _, doc := range strings.Split(out, "\n---") {
		var class resourcev1.DeviceClass
		if err := yaml.Unmarshal([]byte(doc), &class); err == nil && class.Kind == "DeviceClass" {
			classes = append(classes, &class)
		}
	}
	if len(classes) != 2 {
		t.Fatalf("the chart renders %d DeviceClasses in DRA mode, want 2:\n%s", len(classes), out)
	}
	return classes
}

// draControlPlane starts a control plane with the Ready nodes given (no rdma/hca capacity: DRA
// serves them) and the DeviceClasses the chart installs in DRA mode.
func draControlPlane(t *testing.T, nodes ...string) *ControlPlane {
	t.Helper()
	helmBinary(t)
	cp := Start(t)
	for _, n := range nodes {
		addDRANode(t, cp.Client, n)
	}
	for _, class := range chartDeviceClasses(t, newHelm(t, cp)) {
		if _, err := cp.Client.ResourceV1().DeviceClasses().Create(context.Background(), class, metav1.CreateOptions{}); err != nil {
			t.Fatalf("DeviceClass %s: %v", class.Name, err)
		}
	}
	return cp
}

func addDRANode(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	addReadyNode(t, c, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"kubernetes.io/hostname": name}}})
}

func rdmaPod(name string, count int64) *v1.Pod {
	q := *resource.NewQuantity(count, resource.DecimalSI)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "localhost/x",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"rdma/hca": q}, Requests: v1.ResourceList{"rdma/hca": q}}}}},
	}
}

// unschedulable: whether the scheduler has said that no node fits p (PodScheduled False,
// Unschedulable).
func unschedulable(p *v1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// waitUnschedulable waits (up to settle) until the scheduler says that no node fits the pod
// default/name; it fails the test at once when the pod is bound, with `bound` and the node.
func waitUnschedulable(t *testing.T, c kubernetes.Interface, name, what, bound string) {
	t.Helper()
	waitFor(t, settle, what, func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		if p.Spec.NodeName != "" {
			return false, "", fmt.Errorf("%s bound to %s: %s", name, p.Spec.NodeName, bound)
		}
		return unschedulable(p), fmt.Sprintf("conditions %v", p.Status.Conditions), nil
	})
}

// TestDRAExtendedResource: a pod that asks resources.limits rdma/hca and has no ResourceClaim is
// served by our driver through the chart's DeviceClass (extendedResourceName), by the real
// kube-scheduler's DynamicResources plugin: it picks the node whose slices we published, creates
// the pod's claim and allocates distinct devices of ours. No kubelet runs, so nothing prepares
// the claim here (TestDRAKubelet* do that).
func TestDRAExtendedResource(t *testing.T) {
	const node = "dra-node"
	cp := draControlPlane(t, node, "no-rdma")
	c := cp.Client
	ctx := context.Background()
	slices := draNodeSlices(t, node, "exclusive", draFixtureNode(t, "dgx-h100-like.xml"))
	ours := map[string]bool{}
	for i := range slices {
		for _, d := range slices[i].Spec.Devices {
			ours[d.Name] = true
		}
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, &slices[i], metav1.CreateOptions{}); err != nil {
			t.Fatalf("create slice %s: %v", slices[i].Name, err)
		}
	}

	for _, tc := range []struct {
		pod   string
		count int64
	}{{"one-hca", 1}, {"two-hcas", 2}} {
		if _, err := c.CoreV1().Pods("default").Create(ctx, rdmaPod(tc.pod, tc.count), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var claimName string
		waitFor(t, settle, tc.pod+" bound with its extended-resource claim", func(ctx context.Context) (bool, string, error) {
			p, err := c.CoreV1().Pods("default").Get(ctx, tc.pod, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			if p.Spec.NodeName == "" || p.Status.ExtendedResourceClaimStatus == nil {
				return false, fmt.Sprintf("node %q, extendedResourceClaimStatus %v", p.Spec.NodeName, p.Status.ExtendedResourceClaimStatus), nil
			}
			claimName = p.Status.ExtendedResourceClaimStatus.ResourceClaimName
			return true, "", nil
		})
		p, _ := c.CoreV1().Pods("default").Get(ctx, tc.pod, metav1.GetOptions{})
		if p.Spec.NodeName != node {
			t.Errorf("%s: bound to %s, want %s (the only node with our devices)", tc.pod, p.Spec.NodeName, node)
		}
		claim, err := c.ResourceV1().ResourceClaims("default").Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: claim %s: %v", tc.pod, claimName, err)
		}
		if claim.Status.Allocation == nil {
			t.Fatalf("%s: claim %s is not allocated", tc.pod, claimName)
		}
		seen := map[string]bool{}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != draDriver || r.Pool != node || !ours[r.Device] || seen[r.Device] {
				t.Errorf("%s: result %+v: want a distinct device of ours (driver %s, pool %s)", tc.pod, r, draDriver, node)
			}
			seen[r.Device] = true
		}
		if int64(len(seen)) != tc.count {
			t.Errorf("%s: %d devices allocated, want %d: %+v", tc.pod, len(seen), tc.count, claim.Status.Allocation.Devices.Results)
		}
		t.Logf("%s: node %s, claim %s, devices %v", tc.pod, p.Spec.NodeName, claimName, seen)
	}
}

// TestDRASharedNodeServesNoExtendedResource: a device-plugin shared unit of rdma/hca gives every
// HCA of the node; one DRA device is one HCA. Through the chart's DeviceClass a pod that asked
// rdma/hca: 1 on a shared-mode node was allocated one HCA and ran on 1 of 8 (NCCL silently
// slower). The extended resource now selects exclusive-mode devices only: on a node of shared
// mode alone such a pod is unschedulable, by the real scheduler, and a claim with
// allocationMode: All through hca.<driver> gets every HCA there.
func TestDRASharedNodeServesNoExtendedResource(t *testing.T) {
	const node = "dra-shared"
	cp := draControlPlane(t, node)
	c := cp.Client
	ctx := context.Background()
	slices := draNodeSlices(t, node, "shared", draFixtureNode(t, "dgx-h100-like.xml"))
	devices := 0
	for i := range slices {
		devices += len(slices[i].Spec.Devices)
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, &slices[i], metav1.CreateOptions{}); err != nil {
			t.Fatalf("create slice %s: %v", slices[i].Name, err)
		}
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, rdmaPod("one-unit", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUnschedulable(t, c, "one-unit", "one-unit unschedulable", "a shared node served rdma/hca: 1 with one HCA")

	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "every-hca", Namespace: "default"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "hca", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "hca." + draDriver,
				AllocationMode: resourcev1.DeviceAllocationModeAll}}}}},
	}
	if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "every-hca", Namespace: "default"},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{Name: "c", Image: "localhost/x",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "hcas"}}}}},
			ResourceClaims: []v1.PodResourceClaim{{Name: "hcas", ResourceClaimName: &claim.Name}},
		},
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "every-hca allocated every HCA of the shared node", func(ctx context.Context) (bool, string, error) {
		got, err := c.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		if got.Status.Allocation == nil {
			return false, "not allocated", nil
		}
		n := len(got.Status.Allocation.Devices.Results)
		return n == devices, fmt.Sprintf("%d of %d devices", n, devices), nil
	})
}
