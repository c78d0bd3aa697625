package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

const (
	draDriver      = "rdma.network.alibabacloud.com" // dra/model.h kDefaultDriverName
	draOtherDriver = "gpu.example.com"
	draNode        = "dra-node-1"
)

// draTestBinary is the C++ gtest binary with the DRAKubeClientLive* tests: $RDP_DRA_TEST, else
// <build>/test/dra/dra_test beside $RDP_BINARY's <build>/cmd, else <repo>/build/test/dra/dra_test.
// A missing binary fails the test: the live client must not pass by not running.
func draTestBinary(t *testing.T) string {
	t.Helper()
	path := os.Getenv("RDP_DRA_TEST")
	if path == "" {
		if plugin := os.Getenv("RDP_BINARY"); plugin != "" {
			path = filepath.Join(filepath.Dir(filepath.Dir(plugin)), "test", "dra", "dra_test")
		} else {
			path = filepath.Join(repoRoot(), "build", "test", "dra", "dra_test")
		}
	}
	if info, err := os.Stat(path); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
		t.Fatalf("no DRA gtest binary at %s (build the CMake target dra_test, or set RDP_DRA_TEST): %v", path, err)
	}
	return path
}

// writeJSONKubeconfig writes a JSON kubeconfig (the C++ client reads JSON only) for the control
// plane's server, CA and tls-server-name, with `user` as its user entry ("token", "tokenFile").
func writeJSONKubeconfig(t *testing.T, cp *ControlPlane, user map[string]any) string {
	t.Helper()
	cfg := cp.Config
	if len(cfg.TLSClientConfig.CAData) == 0 || cfg.TLSClientConfig.ServerName == "" {
		t.Fatalf("control plane config has no CA data or server name")
	}
	doc := map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"current-context": "dra",
		"contexts":        []any{map[string]any{"name": "dra", "context": map[string]any{"cluster": "cp", "user": "dra"}}},
		"clusters": []any{map[string]any{"name": "cp", "cluster": map[string]any{
			"server":                     cfg.Host,
			"certificate-authority-data": cfg.TLSClientConfig.CAData, // []byte: base64 in JSON
			"tls-server-name":            cfg.TLSClientConfig.ServerName,
		}}},
		"users": []any{map[string]any{"name": "dra", "user": user}},
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// draServiceAccount creates the driver's identity with only the rights the driver needs
// (ResourceSlices: create, get, list, watch, update, delete; ResourceClaims: get, their status:
// update; Nodes: get; Pods: get),
// writes a token of it to a file (as a projected token is mounted) and waits until the RBAC
// authorizer has seen the binding. Returns the token file.
func draServiceAccount(t *testing.T, cp *ControlPlane) string {
	t.Helper()
	ctx := context.Background()
	c := cp.Client
	const name, ns = "rdma-dra", "default"
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("service account: %v", err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"create", "get", "list", "watch", "update", "delete"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
		// A claim's status.devices (the chart's rules); this token is bound to no pod, so the API
		// server's per-driver status check asks arbitrary-node where the chart's pod-bound token
		// needs only associated-node (TestDRAClaimDeviceStatus).
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, ResourceNames: []string{draDriver}, Verbs: []string{"arbitrary-node:update"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
	}}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("cluster role: %v", err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("cluster role binding: %v", err)
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token: %v", err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	// The authorizer learns of the binding through its informers: wait until the identity may
	// do what the driver does first, so that a 403 in the C++ tests is a real one.
	saCfg := rest.AnonymousClientConfig(cp.Config)
	saCfg.BearerToken = tr.Status.Token
	sa, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the service account's RBAC", func(ctx context.Context) (bool, string, error) {
		// NotFound is an answer past the authorizer (this test's node may have another name).
		if _, err := sa.CoreV1().Nodes().Get(ctx, draNode, metav1.GetOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return false, err.Error(), nil
		}
		if _, err := sa.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
	return tokenFile
}

// createDriverClass creates the DeviceClass named `driver` that selects every device of that
// driver.
func createDriverClass(t *testing.T, c kubernetes.Interface, driver string) {
	t.Helper()
	if _, err := c.ResourceV1().DeviceClasses().Create(context.Background(), &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: driver},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + driver + `"`}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func sliceFor(name, driver, pool string, devices ...string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(draNode),
			Pool:     resourcev1.ResourcePool{Name: pool, Generation: 7, ResourceSliceCount: 1},
		},
	}
	for _, d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: d})
	}
	return s
}

// gtestResults reads a --gtest_output=json file: test name ("Suite.Name") -> "PASSED", "SKIPPED"
// or "FAILED: <messages>".
func gtestResults(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("gtest output: %v", err)
	}
	var out struct {
		Testsuites []struct {
			Name      string `json:"name"`
			Testsuite []struct {
				Name     string `json:"name"`
				Result   string `json:"result"`
				Failures []struct {
					Failure string `json:"failure"`
				} `json:"failures"`
			} `json:"testsuite"`
		} `json:"testsuites"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("gtest output %s: %v", path, err)
	}
	results := map[string]string{}
	for _, suite := range out.Testsuites {
		for _, test := range suite.Testsuite {
			result := "PASSED"
			switch {
			case len(test.Failures) > 0:
				var msgs []string
				for _, f := range test.Failures {
					msgs = append(msgs, f.Failure)
				}
				result = "FAILED: " + strings.Join(msgs, "; ")
			case test.Result == "SKIPPED":
				result = "SKIPPED"
			}
			results[suite.Name+"."+test.Name] = result
		}
	}
	return results
}

// TestDRAKubeClientLive runs the C++ API client (dra/kube_client, dra/slice_publisher,
// dra/claim_reader) against a real kube-apiserver, as a service account with only the driver's
// RBAC rights and its token in a file: the gtests DRAKubeClientLive* publish this node's pool
// (several times: first, unchanged, changed, unchanged), read an allocated and a pending
// ResourceClaim, and meet a wrong token, a wrong tls-server-name and a closed port; then
// client-go checks what the server holds.
func TestDRAKubeClientLive(t *testing.T) {
	binary := draTestBinary(t)
	cp := Start(t)
	ctx := context.Background()
	c := cp.Client

	node, err := c.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: draNode}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	// A slice of ours under an old pool name (stale: to be deleted) and another driver's slice
	// on the same node (not ours: to be left alone).
	if _, err := c.ResourceV1().ResourceSlices().Create(ctx, sliceFor(draNode+"-stale", draDriver, "old-pool", "old-0"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("stale slice: %v", err)
	}
	other, err := c.ResourceV1().ResourceSlices().Create(ctx, sliceFor(draNode+"-gpu", draOtherDriver, draNode, "gpu-0"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("other driver's slice: %v", err)
	}

	// An allocated claim (one result of ours, one of another driver) and a pending one.
	claims := c.ResourceV1().ResourceClaims("default")
	newClaim := func(name string) *resourcev1.ResourceClaim {
		claim, err := claims.Create(ctx, &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
				{Name: "hca", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "rdma"}},
				{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu"}},
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		return claim
	}
	allocated := newClaim("hcas")
	allocated.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: draOtherDriver, Pool: draNode, Device: "gpu-0"},
			{Request: "hca", Driver: draDriver, Pool: draNode, Device: "hca-1"},
			{Request: "hca", Driver: draDriver, Pool: draNode, Device: "hca-2"},
		}}}
	if allocated, err = claims.UpdateStatus(ctx, allocated, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("claim status: %v", err)
	}
	pending := newClaim("pending")

	// The driver's own least-privilege identity, its token in a file as a pod mounts it.
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"tokenFile": draServiceAccount(t, cp)})
	output := filepath.Join(t.TempDir(), "gtest.json")
	cmd := exec.Command(binary, "--gtest_filter=DRAKubeClientLive*", "--gtest_output=json:"+output)
	cmd.Env = append(os.Environ(),
		"RDP_DRA_KUBECONFIG="+kubeconfig,
		"RDP_DRA_NODE="+draNode,
		"RDP_DRA_DRIVER="+draDriver,
		fmt.Sprintf("RDP_DRA_CLAIM=default/%s/%s", allocated.Name, allocated.UID),
		fmt.Sprintf("RDP_DRA_CLAIM_EXPECT=hca/%s/hca-1,hca/%s/hca-2", draNode, draNode),
		fmt.Sprintf("RDP_DRA_PENDING_CLAIM=default/%s/%s", pending.Name, pending.UID),
	)
	out, runErr := cmd.CombinedOutput()
	t.Logf("%s:\n%s", binary, out)
	results := gtestResults(t, output)
	for _, name := range []string{
		"DRAKubeClientLiveTest.PublishesThePoolAndKeepsIt",
		"DRAKubeClientLiveTest.ReadsAllocatedAndPendingClaims",
		"DRAKubeClientLiveTest.WrongTokenIsPermissionDenied",
		"DRAKubeClientLiveTest.ServerRefusalsMapToStatusesWithTheServersMessage",
		"DRAKubeClientLiveTest.WrongServerNameFailsCertificateVerification",
		"DRAKubeClientLiveTest.ClosedPortIsUnavailableWithinTheDeadline",
	} {
		if results[name] != "PASSED" {
			t.Errorf("%s: %q (want PASSED)", name, results[name])
		}
	}
	if runErr != nil {
		t.Fatalf("%s: %v", binary, runErr)
	}

	// What the server holds: exactly the last pool the gtest published (3 devices, generation 2
	// after one change), owned by the Node; the stale slice gone; the other driver's untouched.
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", draNode).String()})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		names = append(names, s.Name)
		switch s.Spec.Driver {
		case draOtherDriver:
			if s.ResourceVersion != other.ResourceVersion {
				t.Errorf("%s (another driver's) was written: resourceVersion %s -> %s", s.Name, other.ResourceVersion, s.ResourceVersion)
			}
			continue
		case draDriver:
		default:
			t.Errorf("unexpected slice %s of driver %s", s.Name, s.Spec.Driver)
			continue
		}
		want := draNode + "-" + draDriver + "-0"
		if s.Name != want {
			t.Errorf("slice %s of our driver, want only %s", s.Name, want)
		}
		if p := s.Spec.Pool; p.Name != draNode || p.Generation != 2 || p.ResourceSliceCount != 1 {
			t.Errorf("%s pool %+v, want {Name:%s Generation:2 ResourceSliceCount:1}", s.Name, p, draNode)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" || s.OwnerReferences[0].UID != node.UID ||
			s.OwnerReferences[0].Name != draNode || !ptr.Deref(s.OwnerReferences[0].Controller, false) {
			t.Errorf("%s owners %+v, want the Node %s (uid %s) as controller", s.Name, s.OwnerReferences, draNode, node.UID)
		}
		var devices []string
		for _, d := range s.Spec.Devices {
			devices = append(devices, d.Name)
		}
		if got := strings.Join(devices, ","); got != "hca-0,hca-1,hca-2" {
			t.Errorf("%s devices %s, want hca-0,hca-1,hca-2", s.Name, got)
		}
	}
	sort.Strings(names)
	if want := []string{draNode + "-gpu", draNode + "-" + draDriver + "-0"}; strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("slices of node %s: %v, want %v", draNode, names, want)
	}
}
