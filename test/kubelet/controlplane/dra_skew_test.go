package controlplane

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// olderKubelet registers a DRA driver the way a kubelet of another version does: its plugin
// watcher calls GetInfo on the registration socket, the DRA handler takes the first service of
// the driver's supported_versions that it knows (pkg/kubelet/cm/dra/plugin validateSupportedServices)
// and tells the driver its verdict. `known` is what that kubelet speaks: 1.32 and 1.33 know
// "v1beta1.DRAPlugin" only, 1.31 "v1alpha4.NodeServer" only. Returns the service chosen ("" when
// it refused the driver) and the endpoint.
func olderKubelet(t *testing.T, regSocket string, known ...string) (chosen, endpoint string) {
	t.Helper()
	conn, err := grpc.NewClient("unix:"+regSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := registerapi.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := c.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo on %s: %v", regSocket, err)
	}
	for _, s := range info.SupportedVersions {
		if slices.Contains(known, s) {
			chosen = s
			break
		}
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: chosen != ""}
	if chosen == "" {
		status.Error = fmt.Sprintf("RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC "+
			"versions of DRA driver plugin %s at endpoint %s: none of services supported by the plugin (%q) are "+
			"supported by the kubelet (%q)", info.Name, info.Endpoint, info.SupportedVersions, known)
	}
	if _, err := c.NotifyRegistrationStatus(ctx, status); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	return chosen, info.Endpoint
}

// probe runs `rdma-device-plugin probe --dra` (with --ready: the readiness probe); nil when it
// exits 0.
func probe(t *testing.T, root string, ready bool) error {
	t.Helper()
	args := []string{"probe", "--dra", "--kubelet-dir", root, "--driver-name", draDriver, "--timeout", "5s"}
	if ready {
		args = append(args, "--ready")
	}
	out, err := exec.Command(draBinary(t), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// TestDRAVersionSkew: the driver publishes ResourceSlices only while a kubelet has it registered
// (a node whose kubelet cannot prepare our claims must offer the scheduler nothing), withdraws
// them when a kubelet refuses it, and is ready (probe --dra --ready) only while registered. It
// speaks what kubelets 1.32 to 1.37 do: a kubelet that knows only DRAPlugin v1beta1 (1.32, 1.33)
// registers it and prepares a claim through v1beta1; one that knows neither (1.31) refuses it;
// the pinned kubelet (1.37) registers it through its own plugin manager and takes v1.
func TestDRAVersionSkew(t *testing.T) {
	const node = "dra-node"
	cp := draControlPlane(t, node)
	c := cp.Client
	ctx := context.Background()
	discovery := draFixtureNode(t, "dgx-h100-like.xml")
	root := shortDir(t)
	cdiRoot := filepath.Join(t.TempDir(), "cdi")
	regSocket := filepath.Join(root, "plugins_registry", draDriver+"-reg.sock")
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"tokenFile": draServiceAccount(t, cp)})
	driver := startDRADriver(t, kubeconfig, node, root, cdiRoot, discovery)
	sliceCount := func(ctx context.Context) (int, error) {
		got, err := nodeSlices(ctx, cp, node)
		return len(got), err
	}

	// No kubelet yet: nothing published (the driver says it waits), not ready, but alive.
	const waiting = "no ResourceSlices are published until it registers the driver"
	waitFor(t, settle, "the driver waiting for a registration, or slices published", func(ctx context.Context) (bool, string, error) {
		n, err := sliceCount(ctx)
		return n > 0 || strings.Contains(driver.output(), waiting), fmt.Sprintf("%d slices", n), err
	})
	if n, err := sliceCount(ctx); err != nil || n != 0 {
		t.Fatalf("%d slices published before any kubelet registered the driver (%v)", n, err)
	}
	if err := probe(t, root, false); err != nil {
		t.Errorf("liveness probe before registration: %v", err)
	}
	if err := probe(t, root, true); err == nil {
		t.Errorf("readiness probe passed before any kubelet registered the driver")
	}

	// A 1.33 kubelet: v1beta1 only. It registers the driver, which publishes and is ready.
	chosen, endpoint := olderKubelet(t, regSocket, "v1beta1.DRAPlugin")
	if chosen != "v1beta1.DRAPlugin" {
		t.Fatalf("a kubelet that speaks v1beta1 only refused the driver\n%s", driver.output())
	}
	want := draNodeSlices(t, node, "exclusive", discovery)
	waitFor(t, settle, "the slices published after the registration", func(ctx context.Context) (bool, string, error) {
		n, err := sliceCount(ctx)
		return n == len(want), fmt.Sprintf("%d slices", n), err
	})
	if err := probe(t, root, true); err != nil {
		t.Errorf("readiness probe while registered: %v", err)
	}
	// ... and prepares a claim the scheduler allocated, through v1beta1.
	claim := hcaClaim("skew", "hca")
	if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := claimPod("skew", map[string][]string{"c": {"skew"}})
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	allocated := waitAllocated(t, cp, "skew")
	conn, err := grpc.NewClient("unix:"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := drapbv1beta1.NewDRAPluginClient(conn).NodePrepareResources(callCtx, &drapbv1beta1.NodePrepareResourcesRequest{
		Claims: []*drapbv1beta1.Claim{{Namespace: "default", Uid: string(allocated.UID), Name: "skew"}}})
	if err != nil {
		t.Fatalf("NodePrepareResources over v1beta1: %v", err)
	}
	got := resp.Claims[string(allocated.UID)]
	wantID := draDriver + "/hca=" + string(allocated.UID) + "-hca," + draDriver + "/hca=" + string(allocated.UID) + "_hca"
	if got.GetError() != "" || len(got.GetDevices()) != 1 || got.Devices[0].DeviceName != allocated.Status.Allocation.Devices.Results[0].Device ||
		strings.Join(got.Devices[0].CdiDeviceIds, ",") != wantID {
		t.Errorf("v1beta1 answer %v, want device %s with CDI ID %s", got, allocated.Status.Allocation.Devices.Results[0].Device, wantID)
	}

	// A 1.31 kubelet: it knows neither DRAPlugin version and refuses the driver, which
	// withdraws its slices and is not ready.
	if chosen, _ := olderKubelet(t, regSocket, "v1alpha4.NodeServer"); chosen != "" {
		t.Fatalf("a kubelet that speaks v1alpha4 only chose %s", chosen)
	}
	waitFor(t, settle, "the slices withdrawn after the refusal", func(ctx context.Context) (bool, string, error) {
		n, err := sliceCount(ctx)
		return n == 0, fmt.Sprintf("%d slices", n), err
	})
	if err := probe(t, root, true); err == nil {
		t.Errorf("readiness probe passed after the kubelet refused the driver")
	}

	// The pinned kubelet (1.37): its own plugin manager registers the driver (v1); published.
	var pods []*v1.Pod
	kubelet := startDRAKubelet(t, cp, node, root, t.TempDir(), func() []*v1.Pod { return pods })
	defer kubelet.stop()
	waitFor(t, settle, "the slices published again after the 1.37 kubelet registered the driver", func(ctx context.Context) (bool, string, error) {
		n, err := sliceCount(ctx)
		return n == len(want), fmt.Sprintf("%d slices", n), err
	})
	if err := probe(t, root, true); err != nil {
		t.Errorf("readiness probe after the 1.37 kubelet registered the driver: %v", err)
	}
}

// waitAllocated waits until the scheduler has allocated the claim default/<name> and reserved it
// for a pod, and returns it.
func waitAllocated(t *testing.T, cp *ControlPlane, name string) *resourcev1.ResourceClaim {
	t.Helper()
	var allocated *resourcev1.ResourceClaim
	waitFor(t, settle, "the claim "+name+" allocated", func(ctx context.Context) (bool, string, error) {
		rc, err := cp.Client.ResourceV1().ResourceClaims("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		allocated = rc
		return rc.Status.Allocation != nil && len(rc.Status.ReservedFor) > 0, "not yet", nil
	})
	return allocated
}
