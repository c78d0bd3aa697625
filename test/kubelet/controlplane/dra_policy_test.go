package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// TestDRASliceWritesOwnNodeOnly: the chart's ValidatingAdmissionPolicy, installed by helm into
// the real API server, lets the driver's ServiceAccount write only the ResourceSlices of the node
// its token is bound to, and of its driver. The tokens are pod-bound, as the kubelet mints the
// projected token of a driver pod (TokenRequest with the pod as bound object: the server adds
// the pod's node to the token's extra). RBAC alone let any node's token rewrite every node's
// slices, other drivers' included.
func TestDRASliceWritesOwnNodeOnly(t *testing.T) {
	helmBinary(t)
	cp := Start(t)
	h := newHelm(t, cp)
	c := cp.Client
	ctx := context.Background()
	const nodeA, nodeB, ns, sa = "policy-node-a", "policy-node-b", "kube-system", "rdp-rdma-device-plugin"
	for _, n := range []string{nodeA, nodeB} {
		addDRANode(t, c, n)
	}
	h.must("install", "rdp", h.chart, "-n", ns, "--set", "image.repository="+testRepository,
		"--set", "driver=dra", "--set", "modes={exclusive}", "--set", "dra.deviceClass.create=false")

	// A token bound to a pod of the driver's ServiceAccount on `node`.
	podToken := func(node string) kubernetes.Interface {
		return saClient(t, cp, ns, sa, podOnNode(t, cp, ns, sa, node))
	}
	onA, onB := podToken(nodeA), podToken(nodeB)
	unbound := saClient(t, cp, ns, sa, nil)

	slice := func(name, node, driver string) *resourcev1.ResourceSlice {
		s := sliceFor(name, driver, node, "hca-0")
		s.Spec.NodeName = ptr.To(node)
		return s
	}
	// The policy takes effect once the server's admission has loaded it: until the first refusal.
	waitFor(t, time.Minute, "the policy refusing node A's token a slice of node B", func(ctx context.Context) (bool, string, error) {
		_, err := onA.ResourceV1().ResourceSlices().Create(ctx, slice("probe", nodeB, draDriver), metav1.CreateOptions{})
		if err == nil {
			_ = c.ResourceV1().ResourceSlices().Delete(ctx, "probe", metav1.DeleteOptions{})
			return false, "allowed", nil
		}
		return strings.Contains(err.Error(), "may write only the ResourceSlices of its own node"), err.Error(), nil
	})

	slices := func(k kubernetes.Interface) interface {
		Create(context.Context, *resourcev1.ResourceSlice, metav1.CreateOptions) (*resourcev1.ResourceSlice, error)
		Update(context.Context, *resourcev1.ResourceSlice, metav1.UpdateOptions) (*resourcev1.ResourceSlice, error)
		Delete(context.Context, string, metav1.DeleteOptions) error
	} {
		return k.ResourceV1().ResourceSlices()
	}

	// Its own node: create, update, delete.
	own, err := slices(onA).Create(ctx, slice("own-a", nodeA, draDriver), metav1.CreateOptions{})
	wantAllowed(t, "node A's token creates a slice of node A", err)
	if own != nil {
		own.Spec.Pool.Generation++
		_, err = slices(onA).Update(ctx, own, metav1.UpdateOptions{})
		wantAllowed(t, "node A's token updates it", err)
		// (Moving a slice to another node is refused by the server itself: spec.nodeName is
		// immutable.)
		wantAllowed(t, "node A's token deletes it", slices(onA).Delete(ctx, "own-a", metav1.DeleteOptions{}))
	}
	_, err = slices(onB).Create(ctx, slice("own-b", nodeB, draDriver), metav1.CreateOptions{})
	wantAllowed(t, "node B's token creates a slice of node B", err)

	// Another node's slices: neither created, updated nor deleted.
	_, err = slices(onA).Create(ctx, slice("other", nodeB, draDriver), metav1.CreateOptions{})
	wantRefused(t, "node A's token creates a slice of node B", "its own node", err)
	if theirs, err := c.ResourceV1().ResourceSlices().Get(ctx, "own-b", metav1.GetOptions{}); err == nil {
		theirs.Spec.Pool.Generation++
		_, err = slices(onA).Update(ctx, theirs, metav1.UpdateOptions{})
		wantRefused(t, "node A's token updates node B's slice", "its own node", err)
		wantRefused(t, "node A's token deletes node B's slice", "its own node",
			slices(onA).Delete(ctx, "own-b", metav1.DeleteOptions{}))
	} else {
		t.Errorf("node B's slice: %v", err)
	}
	// Another driver's slices, even on its own node (a GPU driver's).
	_, err = c.ResourceV1().ResourceSlices().Create(ctx, slice("gpu-a", nodeA, draOtherDriver), metav1.CreateOptions{})
	wantAllowed(t, "the admin creates a GPU driver's slice (not matched by the policy)", err)
	_, err = slices(onA).Create(ctx, slice("fake-gpu", nodeA, draOtherDriver), metav1.CreateOptions{})
	wantRefused(t, "node A's token creates another driver's slice on node A", "only the ResourceSlices of driver", err)
	wantRefused(t, "node A's token deletes the GPU driver's slice", "only the ResourceSlices of driver",
		slices(onA).Delete(ctx, "gpu-a", metav1.DeleteOptions{}))
	// A token bound to no pod has no node: it writes nothing.
	_, err = slices(unbound).Create(ctx, slice("unbound", nodeA, draDriver), metav1.CreateOptions{})
	wantRefused(t, "a token bound to no node creates a slice", "bound to no node", err)
}

// podOnNode creates a pod "driver-<node>" of the ServiceAccount on the node (as the DaemonSet's)
// and returns a reference for binding a token to it: such a token carries the node's name.
func podOnNode(t *testing.T, cp *ControlPlane, ns, sa, node string) *authenticationv1.BoundObjectReference {
	t.Helper()
	pod, err := cp.Client.CoreV1().Pods(ns).Create(context.Background(), &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "driver-" + node},
		Spec: v1.PodSpec{NodeName: node, ServiceAccountName: sa,
			Containers: []v1.Container{{Name: "driver", Image: testRepository}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("pod on %s: %v", node, err)
	}
	return &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
}

// wantRefused: err is a refusal of `what` whose message says `want`.
func wantRefused(t *testing.T, what, want string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want refused", what)
	} else if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want a refusal saying %q", what, err, want)
	}
}

// wantAllowed: `what` succeeded.
func wantAllowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v, want allowed", what, err)
	}
}

// saClient: a client with a token of the ServiceAccount, bound to `bound` when not nil.
func saClient(t *testing.T, cp *ControlPlane, ns, sa string, bound *authenticationv1.BoundObjectReference) kubernetes.Interface {
	t.Helper()
	return tokenClient(t, cp, saToken(t, cp, ns, sa, bound))
}

// saToken: a token of the ServiceAccount (an hour), bound to `bound` when not nil.
func saToken(t *testing.T, cp *ControlPlane, ns, sa string, bound *authenticationv1.BoundObjectReference) string {
	t.Helper()
	tr, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600), BoundObjectRef: bound}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", ns, sa, err)
	}
	return tr.Status.Token
}

// tokenClient: a client of the control plane that authenticates with `token` alone.
func tokenClient(t *testing.T, cp *ControlPlane, token string) kubernetes.Interface {
	t.Helper()
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = token
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
