package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDRAConsumableCapacity: HCAs shared by capacity (KEP-5075, DRAConsumableCapacity) through the
// real API server, kube-scheduler and the kubelet's DRA manager, on a shared node whose HCAs'
// ports are 400 Gb/s. The slices carry pods (1000, default 1) and bandwidthGbps (400, default 0)
// with their request policies as stored by the server. Four claims asking 100 Gb/s each, pinned
// to mlx5_0 by a CEL selector, are allocated that HCA and their pods prepared; a fifth stays
// Pending (Unschedulable). Two claims asking nothing on the same HCA are allocated beside the
// full bandwidth, consuming pods 1 and bandwidth 0. Each allocation result has a shareID and its
// consumedCapacity; the driver's checkpoint keeps them and the claim's status.devices entry
// carries the shareID. (The metadata file has no field for consumed capacity: upstream's
// DeviceMetadata has none.)
func TestDRAConsumableCapacity(t *testing.T) {
	e := startDRANodeEnvMode(t, "dgx-h100-like.xml", "shared")
	c := e.cp.Client
	ctx := context.Background()
	var target string
	for device, name := range e.hcaName {
		if name == "mlx5_0" {
			target = device
		}
	}
	if target == "" {
		t.Fatalf("no mlx5_0 among the published devices %v", e.hcaName)
	}

	// The capacities as the API server stored them.
	waitFor(t, settle, "mlx5_0's capacities in the API server", func(ctx context.Context) (bool, string, error) {
		slices, err := nodeSlices(ctx, e.cp, e.node)
		if err != nil {
			return false, "", err
		}
		for _, s := range slices {
			for _, d := range s.Spec.Devices {
				if d.Name != target {
					continue
				}
				pods, bw := d.Capacity["pods"], d.Capacity["bandwidthGbps"]
				ok := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations &&
					pods.Value.Value() == 1000 && pods.RequestPolicy != nil && pods.RequestPolicy.Default.Value() == 1 &&
					bw.Value.Value() == 400 && bw.RequestPolicy != nil && bw.RequestPolicy.Default.Value() == 0 &&
					bw.RequestPolicy.ValidRange != nil && bw.RequestPolicy.ValidRange.Step.Value() == 1
				return ok, fmt.Sprintf("allowMultipleAllocations %v capacity %+v", d.AllowMultipleAllocations, d.Capacity), nil
			}
		}
		return false, "not published", nil
	})

	// A claim for one request pinned to mlx5_0, asking gbps (none when 0), and a pod using it.
	create := func(name string, gbps int64) {
		t.Helper()
		req := &resourcev1.ExactDeviceRequest{DeviceClassName: "hca." + draDriver,
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].hcaName == "mlx5_0"`, draDriver)}}}}
		if gbps > 0 {
			req.Capacity = &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
				"bandwidthGbps": *resource.NewQuantity(gbps, resource.DecimalSI)}}
		}
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "hca", Exactly: req}}}}}
		if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The claim's one result, once allocated: device, shareID, consumed bandwidth and pods.
	result := func(name string) resourcev1.DeviceRequestAllocationResult {
		t.Helper()
		rc, err := c.ResourceV1().ResourceClaims("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || rc.Status.Allocation == nil || len(rc.Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("claim %s: %v, status %+v", name, err, rc.Status)
		}
		return rc.Status.Allocation.Devices.Results[0]
	}
	check := func(name string, gbps int64) resourcev1.DeviceRequestAllocationResult {
		t.Helper()
		r := result(name)
		bw, pods := r.ConsumedCapacity["bandwidthGbps"], r.ConsumedCapacity["pods"]
		if r.Device != target || r.ShareID == nil || bw.Value() != gbps || pods.Value() != 1 {
			t.Errorf("claim %s: %s shareID %v consumed bandwidthGbps %s pods %s; want %s, a shareID, %d and 1",
				name, r.Device, r.ShareID, bw.String(), pods.String(), target, gbps)
		}
		return r
	}

	shares := map[string]string{} // claim -> shareID
	for i := range 4 {
		name := fmt.Sprintf("bw-%d", i)
		create(name, 100)
		e.run(claimPod(name, map[string][]string{"c": {name}}))
		if r := check(name, 100); r.ShareID != nil {
			shares[name] = string(*r.ShareID)
		}
	}
	create("bw-4", 100)
	if _, err := c.CoreV1().Pods("default").Create(ctx, claimPod("bw-4", map[string][]string{"c": {"bw-4"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUnschedulable(t, c, "bw-4", "a fifth 100 Gb/s claim on mlx5_0 unschedulable", "400 Gb/s of mlx5_0 were already consumed")
	if rc, err := c.ResourceV1().ResourceClaims("default").Get(ctx, "bw-4", metav1.GetOptions{}); err != nil || rc.Status.Allocation != nil {
		t.Errorf("claim bw-4: %v, allocated %+v", err, rc.Status.Allocation)
	}

	// Asking nothing: pods 1, bandwidth 0, beside the full bandwidth.
	for _, name := range []string{"plain-0", "plain-1"} {
		create(name, 0)
		e.run(claimPod(name, map[string][]string{"c": {name}}))
		if r := check(name, 0); r.ShareID != nil {
			shares[name] = string(*r.ShareID)
		}
	}
	distinct := map[string]bool{}
	for _, id := range shares {
		distinct[id] = true
	}
	if len(distinct) != 6 {
		t.Errorf("shareIDs %v: want 6 distinct", shares)
	}

	// The checkpoint keeps what each claim consumed; status.devices carries the shareID.
	var cp struct {
		Claims map[string]struct {
			Name    string `json:"name"`
			Devices []struct {
				Device           string            `json:"device"`
				ShareID          string            `json:"shareID"`
				ConsumedCapacity map[string]string `json:"consumedCapacity"`
			} `json:"devices"`
		} `json:"claims"`
	}
	b, err := os.ReadFile(filepath.Join(e.root, "plugins", draDriver, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &cp); err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, b)
	}
	for name, id := range shares {
		entry, ok := cp.Claims[e.claimUID("default", name)]
		if !ok || len(entry.Devices) != 1 {
			t.Errorf("checkpoint: claim %s: %+v", name, entry)
			continue
		}
		d := entry.Devices[0]
		want := map[string]string{"bandwidthGbps": "100", "pods": "1"}
		if strings.HasPrefix(name, "plain") {
			want["bandwidthGbps"] = "0"
		}
		if d.Device != target || d.ShareID != id || fmt.Sprint(d.ConsumedCapacity) != fmt.Sprint(want) {
			t.Errorf("checkpoint: claim %s: %+v, want %s shareID %s consumed %v", name, d, target, id, want)
		}
	}
	for name, id := range shares {
		waitFor(t, settle, name+"'s status.devices with its shareID", func(ctx context.Context) (bool, string, error) {
			rc, err := c.ResourceV1().ResourceClaims("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			for _, d := range rc.Status.Devices {
				if d.Driver == draDriver && d.Device == target && d.ShareID != nil && *d.ShareID == id {
					return true, "", nil
				}
			}
			return false, fmt.Sprintf("status.devices %+v", rc.Status.Devices), nil
		})
	}
}
