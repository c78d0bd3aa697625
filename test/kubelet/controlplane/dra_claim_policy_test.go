package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/utils/ptr"
)

// TestDRAClaimStatusWritesOwnNodeOnly: the chart's claim-status ValidatingAdmissionPolicy,
// installed by helm into the real API server, lets the driver's ServiceAccount update the
// status only of the ResourceClaims the real scheduler allocated on the node its token is bound
// to (pod-bound tokens, as the kubelet mints the driver pod's), and there change only our
// driver's entries of status.devices. The server runs as a 1.34 or 1.35 one does:
// DRAResourceClaimGranularStatusAuthorization off (from 1.36 the server checks status.devices per
// driver and node and status.allocation and reservedFor through resourceclaims/binding itself;
// TestDRAClaimDeviceStatus runs the driver's own writes under both). There RBAC alone (update
// resourceclaims/status) let any node's token rewrite every claim's status: with the policy
// off (dra.restrictClaimStatusWrites=false) node B's token writes node A's claim.
func TestDRAClaimStatusWritesOwnNodeOnly(t *testing.T) {
	featuregatetesting.SetFeatureGatesDuringTest(t, utilfeature.DefaultFeatureGate, featuregatetesting.FeatureOverrides{
		features.DRAResourceClaimGranularStatusAuthorization: false,
	})
	e := startClaimPolicyEnv(t)
	// The policy takes effect once the server's admission has loaded it: until node B's token
	// is refused a write of node A's claim that changes nothing.
	waitFor(t, time.Minute, "the policy refusing node B's token node A's claim", func(ctx context.Context) (bool, string, error) {
		err := e.write(ctx, e.onB, "claim-a", func(*resourcev1.ResourceClaim) {})
		return err != nil && strings.Contains(err.Error(), policyMessageNode), fmt.Sprint(err), nil
	})
	e.check()

	// Without the policy, RBAC alone: node B's token writes node A's claim.
	e.h.must("upgrade", "rdp", e.h.chart, "-n", claimPolicyNS, "--reuse-values", "--set", "dra.restrictClaimStatusWrites=false")
	waitFor(t, time.Minute, "node B's token writing node A's claim once the policy is gone", func(ctx context.Context) (bool, string, error) {
		err := e.write(ctx, e.onB, "claim-a", withOurEntry)
		return err == nil, fmt.Sprint(err), nil
	})
}

// What the policy's refusals say.
const (
	policyMessageNode  = "may update the status only of the ResourceClaims allocated on its own node"
	policyMessageOwn   = "may change only its own entries of a ResourceClaim's status.devices"
	policyMessageBound = "bound to no node"
)

const claimPolicyNS = "kube-system"

// claimPolicyEnv: the chart installed in DRA mode, nodes A and B each with a slice of ours (as
// the admin writes them), a claim allocated on each by the scheduler, and pod-bound tokens of
// the driver's ServiceAccount on A and B and an unbound one.
type claimPolicyEnv struct {
	t                 *testing.T
	cp                *ControlPlane
	h                 *helm
	onA, onB, unbound kubernetes.Interface
}

func startClaimPolicyEnv(t *testing.T) *claimPolicyEnv {
	t.Helper()
	helmBinary(t)
	cp := Start(t)
	e := &claimPolicyEnv{t: t, cp: cp, h: newHelm(t, cp)}
	const nodeA, nodeB = "claim-node-a", "claim-node-b"
	c := cp.Client
	ctx := context.Background()
	e.h.must("install", "rdp", e.h.chart, "-n", claimPolicyNS, "--set", "image.repository="+testRepository,
		"--set", "driver=dra", "--set", "modes={exclusive}")
	const sa = "rdp-rdma-device-plugin"
	// Our HCA and a GPU driver's GPU on each node, and the GPU's DeviceClass.
	for _, node := range []string{nodeA, nodeB} {
		addDRANode(t, c, node)
		for _, s := range []*resourcev1.ResourceSlice{sliceFor("hcas-"+node, draDriver, node, "hca-0"), sliceFor("gpus-"+node, draOtherDriver, node, "gpu-0")} {
			s.Spec.NodeName = ptr.To(node)
			if _, err := c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	createDriverClass(t, c, draOtherDriver)
	e.onA = saClient(t, cp, claimPolicyNS, sa, podOnNode(t, cp, claimPolicyNS, sa, nodeA))
	e.onB = saClient(t, cp, claimPolicyNS, sa, podOnNode(t, cp, claimPolicyNS, sa, nodeB))
	e.unbound = saClient(t, cp, claimPolicyNS, sa, nil)

	for claim, node := range map[string]string{"claim-a": nodeA, "claim-b": nodeB} {
		rc := hcaClaim(claim, "hca")
		rc.Spec.Devices.Requests = append(rc.Spec.Devices.Requests, resourcev1.DeviceRequest{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: draOtherDriver}})
		if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, rc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := claimPod("pod-"+claim, map[string][]string{"c": {claim}})
		pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for claim, node := range map[string]string{"claim-a": nodeA, "claim-b": nodeB} {
		allocated := waitAllocated(t, cp, claim)
		// The shape the policy reads: what the scheduler's allocator writes for devices of a
		// slice with spec.nodeName.
		want := &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}}
		got, _ := json.Marshal(allocated.Status.Allocation.NodeSelector)
		if wantJSON, _ := json.Marshal(want); string(got) != string(wantJSON) {
			t.Fatalf("%s: status.allocation.nodeSelector %s, want %s", claim, got, wantJSON)
		}
	}
	return e
}

// write reads the claim, applies edit to it and updates its status with client k.
func (e *claimPolicyEnv) write(ctx context.Context, k kubernetes.Interface, claim string, edit func(*resourcev1.ResourceClaim)) error {
	rc, err := e.cp.Client.ResourceV1().ResourceClaims("default").Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return err
	}
	edit(rc)
	_, err = k.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, rc, metav1.UpdateOptions{})
	return err
}

// entry: the status.devices entry of the claim's device of `driver`.
func entry(rc *resourcev1.ResourceClaim, driver string) resourcev1.AllocatedDeviceStatus {
	for _, r := range rc.Status.Allocation.Devices.Results {
		if r.Driver == driver {
			return resourcev1.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device}
		}
	}
	return resourcev1.AllocatedDeviceStatus{Driver: driver}
}

// withOurEntry: what the driver writes after a prepare: our entry, other drivers' kept.
func withOurEntry(rc *resourcev1.ResourceClaim) {
	withoutOurEntries(rc)
	rc.Status.Devices = append(rc.Status.Devices, entry(rc, draDriver))
}

// withoutOurEntries: what the driver writes after an unprepare.
func withoutOurEntries(rc *resourcev1.ResourceClaim) {
	var kept []resourcev1.AllocatedDeviceStatus
	for _, d := range rc.Status.Devices {
		if d.Driver != draDriver {
			kept = append(kept, d)
		}
	}
	rc.Status.Devices = kept
}

func withoutReservations(rc *resourcev1.ResourceClaim) { rc.Status.ReservedFor = nil }

// withGPUEntry: the GPU driver's entry, which only that driver may write.
func withGPUEntry(rc *resourcev1.ResourceClaim) {
	rc.Status.Devices = append(rc.Status.Devices, entry(rc, draOtherDriver))
}

// check: node A's token writes our entries of node A's claim and nothing else of it; node B's
// token and an unbound one write nothing of node A's claim; other writers are not matched.
func (e *claimPolicyEnv) check() {
	t := e.t
	t.Helper()
	ctx := context.Background()
	wantAllowed(t, "node A's token writes our entry of node A's claim", e.write(ctx, e.onA, "claim-a", withOurEntry))
	wantAllowed(t, "node B's token writes our entry of node B's claim", e.write(ctx, e.onB, "claim-b", withOurEntry))
	wantAllowed(t, "node A's token removes our entry of node A's claim", e.write(ctx, e.onA, "claim-a", withoutOurEntries))

	wantRefused(t, "node B's token writes our entry of node A's claim", policyMessageNode, e.write(ctx, e.onB, "claim-a", withOurEntry))
	wantRefused(t, "node A's token removes our entry of node B's claim", policyMessageNode, e.write(ctx, e.onA, "claim-b", withoutOurEntries))
	wantRefused(t, "node B's token drops node A's claim's reservations", policyMessageNode, e.write(ctx, e.onB, "claim-a", withoutReservations))
	wantRefused(t, "node A's token drops its own claim's reservations", policyMessageOwn, e.write(ctx, e.onA, "claim-a", withoutReservations))
	wantRefused(t, "node A's token writes a GPU driver's entry of its own claim", policyMessageOwn, e.write(ctx, e.onA, "claim-a", withGPUEntry))
	wantRefused(t, "a token bound to no node writes our entry", policyMessageBound, e.write(ctx, e.unbound, "claim-a", withOurEntry))

	// Other writers are not matched: the admin (the GPU driver's part here) writes as before ...
	wantAllowed(t, "the admin writes a GPU driver's entry of node A's claim", e.write(ctx, e.cp.Client, "claim-a", withGPUEntry))
	// ... and node A's token then writes ours beside it, the GPU driver's kept.
	wantAllowed(t, "node A's token adds our entry beside the GPU driver's", e.write(ctx, e.onA, "claim-a", withOurEntry))
	rc, err := e.cp.Client.ResourceV1().ResourceClaims("default").Get(ctx, "claim-a", metav1.GetOptions{})
	if err != nil || len(rc.Status.Devices) != 2 || len(rc.Status.ReservedFor) != 1 {
		t.Errorf("node A's claim after the writes: %v, status %+v", err, rc.Status)
	}
}
