package controlplane

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDRAWithoutPodReads: with the chart's dra.readPods=false the driver's ServiceAccount may not
// get pods (asked of the real API server) and the DaemonSet runs the driver with the flag that
// says so; the driver, run with that flag and the chart's RBAC as the DaemonSet's pod, prepares
// two pods' claims through the kubelet's DRA manager: each container gets exactly its HCA and
// the request's own variables, no common NCCL_IB_HCA (which needs the pod specs), and the
// driver's log says once, not per claim, what it cannot do and why (docs/dra.md, "Reading
// pods").
func TestDRAWithoutPodReads(t *testing.T) {
	const node, ns, sa = "dra-node", "kube-system", "rdp-rdma-device-plugin"
	cp := draControlPlane(t, node)
	c := cp.Client
	ctx := context.Background()
	h := newHelm(t, cp)
	h.must("install", "rdp", h.chart, "-n", ns, "--set", "image.repository="+testRepository,
		"--set", "driver=dra", "--set", "modes={exclusive}", "--set", "dra.deviceClass.create=false",
		"--set", "dra.readPods=false")
	ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, "rdp-rdma-device-plugin-exclusive", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const flag = "--read-pods=false"
	if args := ds.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, flag) {
		t.Fatalf("the DaemonSet runs the driver with %v, without %s", args, flag)
	}

	// The driver's token: bound to a pod of the chart's ServiceAccount on the node.
	token := saToken(t, cp, ns, sa, podOnNode(t, cp, ns, sa, node))
	asDriver := tokenClient(t, cp, token)
	waitFor(t, time.Minute, "the chart's RBAC for the driver's token", func(ctx context.Context) (bool, string, error) {
		_, err := asDriver.ResourceV1().ResourceClaims("default").Get(ctx, "none", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil // NotFound is an answer past the authorizer
	})
	if _, err := asDriver.CoreV1().Pods(ns).Get(ctx, "driver-"+node, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the driver's token reads a pod: %v, want Forbidden", err)
	}

	discovery := draFixtureNode(t, "dgx-h100-like.xml")
	root := shortDir(t)
	e := &draNodeEnv{t: t, cp: cp, node: node, cdiRoot: filepath.Join(t.TempDir(), "cdi")}
	e.kubelet = startDRAKubelet(t, cp, node, root, t.TempDir(), func() []*v1.Pod { return e.pods })
	t.Cleanup(func() { e.kubelet.stop() })
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"token": token})
	e.driver = startDRADriver(t, kubeconfig, node, root, e.cdiRoot, append(discovery, flag))
	waitFor(t, settle, "the driver's slices", func(ctx context.Context) (bool, string, error) {
		got, err := nodeSlices(ctx, cp, node)
		return err == nil && len(got) > 0, fmt.Sprintf("%d slices", len(got)), err
	})

	for _, name := range []string{"first", "second"} {
		if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, hcaClaim(name, "hca"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := e.run(claimPod(name, map[string][]string{"c": {name}}))
		in := e.inside(pod, "c")
		devices := e.allocated("default", name, "")
		if len(devices) != 1 || len(in.devices) == 0 {
			t.Fatalf("%s: allocated %v, container devices %v", name, devices, in.devices)
		}
		own := 0
		for k := range in.env {
			if strings.HasPrefix(k, "NCCL_IB_HCA_") {
				own++
			}
		}
		if _, common := in.env["NCCL_IB_HCA"]; common || own != 1 {
			t.Errorf("%s: env %v: want the request's own NCCL_IB_HCA_<claim>_<request> and no NCCL_IB_HCA", name, in.env)
		}
	}
	const line = "pods are not read (--read-pods=false; "
	if n := strings.Count(e.driver.output(), line); n != 1 {
		t.Errorf("%d log lines saying %q after two claims, want 1", n, line)
	}
}
