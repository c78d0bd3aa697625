package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
)

// TestDRAClaimDeviceStatus: after NodePrepareResources the claim's status.devices names what the
// pod got (docs/dra.md, "Device status in the claim"): per device of ours, data.hcaName and the
// netdev's interface name and hardware address, as the node's sysfs has them. Unprepare removes
// our entries. Another driver's entry (a GPU of the same claim) is kept throughout. The driver
// runs with the chart's RBAC and a token bound to a pod on its node, as the DaemonSet's pod has:
// the API server's per-driver status authorization (resourceclaims/driver,
// associated-node:update) lets it write claims of its own node.
func TestDRAClaimDeviceStatus(t *testing.T) {
	const node, ns, sa = "status-node", "kube-system", "rdp-rdma-device-plugin"
	const gpuDriver = "gpu.example.com"
	cp := draControlPlane(t, node)
	c := cp.Client
	ctx := context.Background()
	h := newHelm(t, cp)
	h.must("install", "rdp", h.chart, "-n", ns, "--set", "image.repository="+testRepository,
		"--set", "driver=dra", "--set", "modes={exclusive}", "--set", "dra.deviceClass.create=false")

	// The driver's token: bound to a pod of the chart's ServiceAccount on the node.
	bound := podOnNode(t, cp, ns, sa, node)
	token := saToken(t, cp, ns, sa, bound)
	asDriver := tokenClient(t, cp, token)
	// The authorizer learns of the chart's binding through its informers: a refused status write
	// is not retried by the driver (403 is final), so wait until the identity is known.
	waitFor(t, time.Minute, "the chart's RBAC for the driver's token", func(ctx context.Context) (bool, string, error) {
		// NotFound is an answer past the authorizer.
		_, err := asDriver.ResourceV1().ResourceClaims("default").Get(ctx, "none", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"token": token})

	discovery := draFixtureNode(t, "dgx-h100-like.xml")
	root := shortDir(t)
	cdiRoot := filepath.Join(t.TempDir(), "cdi")
	kubelet := startDRAKubelet(t, cp, node, root, t.TempDir(), func() []*v1.Pod { return nil })
	defer kubelet.stop()
	driver := startDRADriver(t, kubeconfig, node, root, cdiRoot, discovery)
	waitFor(t, settle, "the driver's slices", func(ctx context.Context) (bool, string, error) {
		got, err := nodeSlices(ctx, cp, node)
		return err == nil && len(got) > 0, fmt.Sprintf("%d slices", len(got)), err
	})

	// A GPU driver's device on the same node, and a claim of one HCA and one GPU.
	gpuSlice := sliceFor("gpu-"+node, gpuDriver, node, "gpu-0")
	gpuSlice.Spec.NodeName = ptr.To(node)
	if _, err := c.ResourceV1().ResourceSlices().Create(ctx, gpuSlice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createDriverClass(t, c, gpuDriver)
	claim := hcaClaim("pair", "hca")
	claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourcev1.DeviceRequest{
		Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: gpuDriver}})
	if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, claimPod("pair", map[string][]string{"c": {"pair"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	allocated := waitAllocated(t, cp, "pair")
	var hca resourcev1.DeviceRequestAllocationResult
	for _, r := range allocated.Status.Allocation.Devices.Results {
		if r.Driver == draDriver {
			hca = r
		}
	}
	if hca.Device == "" {
		t.Fatalf("no device of ours in the allocation: %+v", allocated.Status.Allocation.Devices.Results)
	}
	// The GPU driver reports its device (as an admin may: the test's client).
	gpuEntry := resourcev1.AllocatedDeviceStatus{Driver: gpuDriver, Pool: node, Device: "gpu-0",
		Data: &runtime.RawExtension{Raw: []byte(`{"uuid":"GPU-0000"}`)}}
	allocated.Status.Devices = []resourcev1.AllocatedDeviceStatus{gpuEntry}
	if _, err := c.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, allocated, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the GPU driver's status entry: %v", err)
	}

	// What the node says of the allocated HCA: its name and PCI address from our slice, its
	// netdev and that one's address from the fixture's sysfs.
	var hcaName, pci string
	slices, err := nodeSlices(ctx, cp, node)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if d.Name != hca.Device {
				continue
			}
			if a, ok := d.Attributes[resourcev1.QualifiedName(draDriver+"/hcaName")]; ok && a.StringValue != nil {
				hcaName = *a.StringValue
			}
			if a, ok := d.Attributes["resource.kubernetes.io/pciBusID"]; ok && a.StringValue != nil {
				pci = *a.StringValue
			}
		}
	}
	netdevs, err := os.ReadDir(filepath.Join(discovery[3], "sys", "bus", "pci", "devices", pci, "net"))
	if hcaName == "" || pci == "" || err != nil || len(netdevs) == 0 {
		t.Fatalf("device %s: hcaName %q, pci %q, netdevs %v (%v)", hca.Device, hcaName, pci, netdevs, err)
	}
	netdev := netdevs[0].Name() // ReadDir sorts: the first, as the driver names it
	address, err := os.ReadFile(filepath.Join(discovery[3], "sys", "bus", "pci", "devices", pci, "net", netdev, "address"))
	if err != nil {
		t.Fatal(err)
	}

	// Prepare, as the kubelet calls it.
	conn, err := grpc.NewClient("unix:"+filepath.Join(root, "plugins", draDriver, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	plugin := drapbv1.NewDRAPluginClient(conn)
	ref := []*drapbv1.Claim{{Namespace: "default", Uid: string(allocated.UID), Name: "pair"}}
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	prepared, err := plugin.NodePrepareResources(callCtx, &drapbv1.NodePrepareResourcesRequest{Claims: ref})
	if err != nil || prepared.Claims[string(allocated.UID)].GetError() != "" {
		t.Fatalf("NodePrepareResources: %v %v", err, prepared)
	}

	statusOf := func(ctx context.Context) (ours []resourcev1.AllocatedDeviceStatus, others []resourcev1.AllocatedDeviceStatus, err error) {
		rc, err := c.ResourceV1().ResourceClaims("default").Get(ctx, "pair", metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		for _, d := range rc.Status.Devices {
			if d.Driver == draDriver {
				ours = append(ours, d)
			} else {
				others = append(others, d)
			}
		}
		return ours, others, nil
	}
	describe := func(entries []resourcev1.AllocatedDeviceStatus) string {
		b, _ := json.Marshal(entries)
		return string(b)
	}
	keptGPU := func(others []resourcev1.AllocatedDeviceStatus) bool {
		return len(others) == 1 && others[0].Driver == gpuDriver && others[0].Device == "gpu-0" &&
			others[0].Data != nil && string(others[0].Data.Raw) == `{"uuid":"GPU-0000"}`
	}
	waitFor(t, settle, "our entry in the claim's status.devices after prepare", func(ctx context.Context) (bool, string, error) {
		ours, others, err := statusOf(ctx)
		if err != nil {
			return false, "", err
		}
		if len(ours) != 1 {
			return false, describe(append(ours, others...)), nil
		}
		e := ours[0]
		var data map[string]string
		if e.Data != nil {
			_ = json.Unmarshal(e.Data.Raw, &data)
		}
		ok := e.Pool == node && e.Device == hca.Device && data["hcaName"] == hcaName &&
			strings.HasPrefix(data["uverbs"], "/dev/infiniband/uverbs") &&
			e.NetworkData != nil && e.NetworkData.InterfaceName == netdev &&
			e.NetworkData.HardwareAddress == strings.TrimSpace(string(address)) && keptGPU(others)
		return ok, describe(append(ours, others...)), nil
	})

	// Unprepare: ours go, the GPU driver's stays.
	if _, err := plugin.NodeUnprepareResources(callCtx, &drapbv1.NodeUnprepareResourcesRequest{Claims: ref}); err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	waitFor(t, settle, "our entry gone from the claim's status.devices after unprepare", func(ctx context.Context) (bool, string, error) {
		ours, others, err := statusOf(ctx)
		if err != nil {
			return false, "", err
		}
		return len(ours) == 0 && keptGPU(others), describe(append(ours, others...)), nil
	})
	if !strings.Contains(driver.output(), "status.devices has our 1 entry") {
		t.Errorf("no log line of the status write:\n%s", driver.output())
	}
	// Two writes (prepare, unprepare), none failed.
	waitFor(t, settle, "the status writes in /metrics", func(ctx context.Context) (bool, string, error) {
		m, err := scrape(ctx, driver)
		if err != nil {
			return false, err.Error(), nil
		}
		ok := strings.Contains(m, `rdma_device_plugin_dra_claim_status_writes_total{result="success"} 2`+"\n") &&
			strings.Contains(m, `rdma_device_plugin_dra_claim_status_writes_total{result="failure"} 0`+"\n")
		return ok, strings.Join(regexp.MustCompile(`(?m)^rdma_device_plugin_dra_claim_status_writes_total.*$`).FindAllString(m, -1), "; "), nil
	})
}
