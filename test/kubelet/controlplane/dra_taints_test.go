package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDRATaintEffects: the device-taint table (docs/dra.md, "Device taints") through the real API
// server and kube-scheduler. mlx5_0's port is INIT from the driver's start (waiting for a subnet
// manager): its device is tainted unhealthy=PortInit:NoSchedule, a claim that may take mlx5_0 or
// mlx5_1 gets mlx5_1, and a claim only mlx5_0 can serve stays Pending (the scheduler says
// Unschedulable) until the port is ACTIVE, then it gets mlx5_0. mlx5_2 is degraded (symbol
// errors): tainted degraded=SymbolErrors:None, and a claim only it can serve is allocated.
func TestDRATaintEffects(t *testing.T) {
	const node = "dra-node"
	cp := draControlPlane(t, node)
	c := cp.Client
	ctx := context.Background()
	discovery := draFixtureNode(t, "dgx-h100-like.xml")
	sys := filepath.Join(discovery[3], "sys", "class", "infiniband")
	write := func(path, text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Every port of mlx5_0 INIT, before the driver's first look: a port still INIT after boot.
	ports, err := filepath.Glob(filepath.Join(sys, "mlx5_0", "ports", "*", "state"))
	if err != nil || len(ports) == 0 {
		t.Fatalf("mlx5_0's ports in the fixture: %v %v", ports, err)
	}
	for _, p := range ports {
		write(p, "2: INIT")
	}

	root := shortDir(t) // the sockets' paths: t.TempDir() has the test's name in it
	kubelet := startDRAKubelet(t, cp, node, root, t.TempDir(), func() []*v1.Pod { return nil })
	defer func() { kubelet.stop() }()
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"tokenFile": draServiceAccount(t, cp)})
	startDRAProcess(t, append([]string{"dra", "--mode", "exclusive", "--node-name", node,
		"--kubeconfig", kubeconfig, "--kubelet-dir", root, "--cdi-root", filepath.Join(t.TempDir(), "cdi"),
		"--health-interval", "200ms"}, discovery...))

	deviceOf := func(hca string) string {
		pci, err := filepath.EvalSymlinks(filepath.Join(sys, hca, "device"))
		if err != nil {
			t.Fatal(err)
		}
		return "hca-" + strings.NewReplacer(":", "-", ".", "-").Replace(filepath.Base(pci))
	}
	initHCA, other, degraded := deviceOf("mlx5_0"), deviceOf("mlx5_1"), deviceOf("mlx5_2")
	taintIs := func(what, device, want string) {
		t.Helper()
		waitFor(t, settle, what, func(ctx context.Context) (bool, string, error) {
			taint, err := deviceTaint(ctx, cp, node, device)
			return err == nil && taint == want, fmt.Sprintf("%s: taint %q (want %q) %v", device, taint, want, err), nil
		})
	}
	taintIs("mlx5_0 INIT", initHCA, draDriver+"/unhealthy=PortInit:NoSchedule")
	taintIs("mlx5_1 healthy", other, "")

	// A claim for one HCA whose name is in `names`, and a pod that uses it.
	claimFor := func(name string, names ...string) {
		t.Helper()
		expr := fmt.Sprintf(`device.attributes[%q].hcaName in ["%s"]`, draDriver, strings.Join(names, `", "`))
		claim := &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
				Name: "hca", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "hca." + draDriver,
					Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: expr}}}}}}}},
		}
		if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Pods("default").Create(ctx, claimPod(name, map[string][]string{"c": {name}}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Waits until the claim's pod is bound to the node and returns the device allocated.
	allocated := func(name string) string {
		t.Helper()
		waitFor(t, settle, name+"'s pod bound", func(ctx context.Context) (bool, string, error) {
			p, err := c.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			return p.Spec.NodeName == node, fmt.Sprintf("node %q, conditions %v", p.Spec.NodeName, p.Status.Conditions), nil
		})
		claim, err := c.ResourceV1().ResourceClaims("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("claim %s after scheduling: %v %+v", name, err, claim.Status)
		}
		return claim.Status.Allocation.Devices.Results[0].Device
	}

	claimFor("either", "mlx5_0", "mlx5_1")
	if got := allocated("either"); got != other {
		t.Errorf("claim either got %s, want %s (mlx5_1): mlx5_0's port is INIT", got, other)
	}
	claimFor("pinned", "mlx5_0")
	waitUnschedulable(t, c, "pinned", "pinned unschedulable while mlx5_0's port is INIT", "while mlx5_0's port is INIT")
	if claim, err := c.ResourceV1().ResourceClaims("default").Get(ctx, "pinned", metav1.GetOptions{}); err != nil || claim.Status.Allocation != nil {
		t.Fatalf("claim pinned while mlx5_0's port is INIT: %v %+v", err, claim.Status)
	}

	for _, p := range ports {
		write(p, "4: ACTIVE")
	}
	taintIs("mlx5_0 ACTIVE", initHCA, "")
	if got := allocated("pinned"); got != initHCA {
		t.Errorf("claim pinned got %s once mlx5_0's port is ACTIVE, want %s", got, initHCA)
	}

	// Degraded: the taint informs, the scheduler allocates the HCA all the same.
	write(filepath.Join(sys, "mlx5_2", "ports", "1", "counters", "symbol_error"), "50")
	taintIs("mlx5_2's symbol errors", degraded, draDriver+"/degraded=SymbolErrors:None")
	claimFor("on-degraded", "mlx5_2")
	if got := allocated("on-degraded"); got != degraded {
		t.Errorf("claim on-degraded got %s, want %s", got, degraded)
	}
}
