package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestDRAAdminAccess: admin access (KEP-5018, GA in 1.36) on an exclusive node, through the real
// API server, scheduler and the kubelet's DRA manager. A pod holds one HCA exclusively; a claim
// with adminAccess in a namespace labelled resource.kubernetes.io/admin-access: "true" selects
// that same HCA; the scheduler allocates it beside the holder and the kubelet's DRA manager has
// the driver prepare it. Both containers get the HCA's device nodes (the monitor the same as the
// holder: uverbs, umad, issm, rdma_cm); the holder's accounting is unchanged: its CDI spec and
// environment, the node's hca_* metrics, the published slices, and the scheduler still refuses
// the HCA to another ordinary claim. The driver logs the admin claim as such. The same claim in
// a namespace without the label is refused by the API server.
func TestDRAAdminAccess(t *testing.T) {
	e := startDRANodeEnv(t, "dgx-h100-like.xml")
	c := e.cp.Client
	ctx := context.Background()

	if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, hcaClaim("exclusive", "hca"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	holder := e.run(claimPod("holder", map[string][]string{"c": {"exclusive"}}))
	devices := e.allocated("default", "exclusive", "")
	if len(devices) != 1 {
		t.Fatalf("claim exclusive: devices %v, want 1", devices)
	}
	held := devices[0]
	holderIn := e.inside(holder, "c")
	e.checkHolds("holder", holderIn, devices)
	specFile := cdiSpecFileOf(t, e.cdiRoot, e.claimUID("default", "exclusive"))
	specBefore, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatal(err)
	}
	metricsBefore := hcaMetrics(t, e)
	slicesBefore := sliceDevices(t, e)
	bdf := pciBusID(t, e, held)

	// Only a labelled namespace may ask for admin access.
	if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, adminClaim("default", bdf), metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "resource.kubernetes.io/admin-access") {
		t.Errorf("an admin claim in an unlabelled namespace: %v, want refused naming the label", err)
	}
	const ns = "monitoring"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{resourcev1.DRAAdminNamespaceLabelKey: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "the service account "+ns+"/default", func(ctx context.Context) (bool, string, error) {
		_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err), nil
	})
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, adminClaim(ns, bdf), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	monitorPod := claimPod("monitor", map[string][]string{"perfquery": {"admin"}})
	monitorPod.Namespace = ns
	monitor := e.run(monitorPod)

	rc, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "admin", metav1.GetOptions{})
	if err != nil || rc.Status.Allocation == nil || len(rc.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s/admin: %v, allocation %+v", ns, err, rc.Status.Allocation)
	}
	if r := rc.Status.Allocation.Devices.Results[0]; r.Device != held || r.AdminAccess == nil || !*r.AdminAccess {
		t.Fatalf("claim %s/admin allocated %s adminAccess %v, want %s with adminAccess true", ns, r.Device, r.AdminAccess, held)
	}
	// Both hold their CDI devices; the monitor has the HCA's every node the holder has.
	monitorIn := e.inside(monitor, "perfquery")
	var holderNodes, monitorNodes []string
	for p := range holderIn.devices {
		holderNodes = append(holderNodes, p)
	}
	for p := range monitorIn.devices {
		monitorNodes = append(monitorNodes, p)
	}
	sort.Strings(holderNodes)
	sort.Strings(monitorNodes)
	if !reflect.DeepEqual(monitorNodes, holderNodes) {
		t.Errorf("monitor's device nodes %v, want the holder's %v", monitorNodes, holderNodes)
	}
	t.Logf("monitor: CDI %v, device nodes %v", monitorIn.ids, monitorNodes)
	if _, ok := monitorIn.env["NCCL_IB_HCA"]; ok {
		t.Errorf("the admin claim's CDI device sets NCCL_IB_HCA: %v", monitorIn.env)
	}
	line := fmt.Sprintf("admin access to HCA %s (%s)", e.hcaName[held], held)
	if !strings.Contains(e.driver.output(), line) {
		t.Errorf("the driver's log has no %q", line)
	}

	// The holder's accounting is what it was.
	e.checkHolds("holder, beside the monitor", e.inside(holder, "c"), devices)
	if specAfter, err := os.ReadFile(specFile); err != nil || string(specAfter) != string(specBefore) {
		t.Errorf("the holder's CDI spec changed (%v):\n%s\nwas\n%s", err, specAfter, specBefore)
	}
	if after := hcaMetrics(t, e); !reflect.DeepEqual(after, metricsBefore) {
		t.Errorf("hca_* metrics changed:\n%s\nwere\n%s", strings.Join(after, "\n"), strings.Join(metricsBefore, "\n"))
	}
	if after := sliceDevices(t, e); !reflect.DeepEqual(after, slicesBefore) {
		t.Errorf("the published devices changed: %v, were %v", after, slicesBefore)
	}
	// The scheduler still has the HCA held: an ordinary claim for it is not allocated.
	intruder := adminClaim("default", bdf)
	intruder.Name = "intruder"
	intruder.Spec.Devices.Requests[0].Exactly.AdminAccess = nil
	if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, intruder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, claimPod("intruder", map[string][]string{"c": {"intruder"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUnschedulable(t, c, "intruder", "intruder unschedulable", "the held HCA was allocated again")
}

// adminClaim: a claim named "admin" in ns for the HCA at PCI address bdf, with admin access.
func adminClaim(ns, bdf string) *resourcev1.ResourceClaim {
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "admin", Namespace: ns}}
	claim.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "hca", Exactly: &resourcev1.ExactDeviceRequest{
		DeviceClassName: "hca." + draDriver,
		AdminAccess:     ptr.To(true),
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes["resource.kubernetes.io"].pciBusID == %q`, bdf)}}},
	}}}
	return claim
}

// claimUID: the claim's metadata.uid.
func (e *draNodeEnv) claimUID(ns, name string) string {
	e.t.Helper()
	rc, err := e.cp.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return string(rc.UID)
}

// cdiSpecFileOf: the path of the claim's CDI spec in dir.
func cdiSpecFileOf(t *testing.T, dir, uid string) string {
	t.Helper()
	for name := range cdiSpecs(t, dir) {
		if strings.Contains(name, uid) {
			return dir + "/" + name
		}
	}
	t.Fatalf("no CDI spec of claim uid %s in %s", uid, dir)
	return ""
}

// pciBusID: the device's resource.kubernetes.io/pciBusID as the node's slices publish it.
func pciBusID(t *testing.T, e *draNodeEnv, device string) string {
	t.Helper()
	slices, err := nodeSlices(context.Background(), e.cp, e.node)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["resource.kubernetes.io/pciBusID"]; ok && d.Name == device && a.StringValue != nil {
				return *a.StringValue
			}
		}
	}
	t.Fatalf("device %s has no pciBusID in the node's slices", device)
	return ""
}

// sliceDevices: the node's published devices (as JSON: attributes, taints, ...) and its pools'
// generations.
func sliceDevices(t *testing.T, e *draNodeEnv) []string {
	t.Helper()
	slices, err := nodeSlices(context.Background(), e.cp, e.node)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range slices {
		out = append(out, fmt.Sprintf("pool %s generation %d", s.Spec.Pool.Name, s.Spec.Pool.Generation))
		for _, d := range s.Spec.Devices {
			b, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(b))
		}
	}
	sort.Strings(out)
	return out
}

// hcaMetrics: the driver's rdma_device_plugin_hca_* samples (health, info, allocation), sorted.
func hcaMetrics(t *testing.T, e *draNodeEnv) []string {
	t.Helper()
	m := regexp.MustCompile(`metrics: serving on (127\.0\.0\.1:\d+)`).FindStringSubmatch(e.driver.output())
	if m == nil {
		t.Fatalf("the driver serves no metrics:\n%s", e.driver.output())
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s %v", resp.Status, err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "rdma_device_plugin_hca_") {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		t.Fatalf("/metrics has no hca_* sample:\n%s", b)
	}
	sort.Strings(out)
	return out
}
