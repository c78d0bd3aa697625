package controlplane

import (
	"context"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

// TestDRADeviceMetadata: the standard device metadata (KEP-5304) as a container gets it. Pods run
// through the real scheduler, the resource-claim controller (claims from templates) and the
// kubelet's DRA manager; each container's CDI devices are injected by the CDI library, and the
// file its mount names is read on the host and decoded with the upstream package
// (k8s.io/dynamic-resource-allocation/devicemetadata, the pinned release) into the upstream types,
// validated:
//   - a claim from a template with two HCAs: the file at
//     .../resourceclaimtemplates/<podClaimName>/<request>/<driver>-metadata.json, read-only, a
//     v1beta1 object then a v1alpha1 one, naming the claim, its podClaimName and both devices with
//     the attributes the slices publish; a container of the pod without a claim has no such mount;
//   - a prioritized list (KEP-4816) whose first subrequest cannot be met: allocated as
//     "<request>/<second>", prepared under the request's name (the container that names the
//     request gets its HCA and the file under .../<request>/), the content naming the subrequest.
func TestDRADeviceMetadata(t *testing.T) {
	e := startDRANodeEnv(t, "dgx-h100-like.xml")
	startClaimController(t, e.cp)
	c := e.cp.Client
	ctx := context.Background()
	attributes := map[string]map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}
	published, err := nodeSlices(ctx, e.cp, e.node)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range published {
		for _, d := range s.Spec.Devices {
			attributes[d.Name] = d.Attributes
		}
	}

	t.Run("TemplateClaimWithTwoHCAs", func(t *testing.T) {
		e.t = t
		tmpl := &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "two-hcas", Namespace: "default"},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "hcas", Exactly: &resourcev1.ExactDeviceRequest{
					DeviceClassName: "hca." + draDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2}}},
			}}},
		}
		if _, err := c.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "metadata", Namespace: "default"}, Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: "rdma", ResourceClaimTemplateName: ptr.To("two-hcas")}},
			Containers: []v1.Container{
				{Name: "trainer", Image: "localhost/x", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "rdma"}}}},
				{Name: "sidecar", Image: "localhost/x"},
			},
		}}
		pod = e.run(pod)
		if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			t.Fatalf("pod's resourceClaimStatuses %+v: want the template's claim", pod.Status.ResourceClaimStatuses)
		}
		claimName := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
		claim, err := c.ResourceV1().ResourceClaims("default").Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		devices := e.allocated("default", claimName, "hcas")
		if len(devices) != 2 {
			t.Fatalf("claim %s: devices %v, want 2", claimName, devices)
		}
		in := e.inside(pod, "trainer")
		e.checkHolds("container trainer", in, devices)
		path := metadata.ResourceClaimTemplateFilePath(draDriver, "rdma", "hcas")
		beta, alpha := e.readMetadata(in, path)
		if beta.Name != claimName || beta.Namespace != "default" || beta.UID != claim.UID {
			t.Errorf("metadata names %s/%s uid %s, want default/%s uid %s", beta.Namespace, beta.Name, beta.UID, claimName, claim.UID)
		}
		if beta.PodClaimName == nil || *beta.PodClaimName != "rdma" {
			t.Errorf("podClaimName %v, want rdma", beta.PodClaimName)
		}
		if len(beta.Requests) != 1 || beta.Requests[0].Name != "hcas" {
			t.Fatalf("requests %+v, want one, hcas", beta.Requests)
		}
		var got []string
		for _, d := range beta.Requests[0].Devices {
			got = append(got, d.Name)
			if d.Driver != draDriver || d.Pool != e.node {
				t.Errorf("device %s: driver %s pool %s, want %s %s", d.Name, d.Driver, d.Pool, draDriver, e.node)
			}
			if !reflect.DeepEqual(d.Attributes, attributes[d.Name]) {
				t.Errorf("device %s: attributes %v, want the slice's %v", d.Name, d.Attributes, attributes[d.Name])
			}
		}
		sort.Strings(got)
		sort.Strings(devices)
		if !slices.Equal(got, devices) {
			t.Errorf("metadata devices %v, want the allocation's %v", got, devices)
		}
		if len(alpha.Requests) != 1 || len(alpha.Requests[0].Devices) != 2 || alpha.Name != claimName {
			t.Errorf("the v1alpha1 object says otherwise: %+v", alpha)
		}
		for dest := range e.inside(pod, "sidecar").mounts {
			if strings.HasPrefix(dest, metadata.ContainerDir) {
				t.Errorf("container sidecar (no claim) has a metadata mount %s", dest)
			}
		}
	})

	t.Run("PrioritizedListPreparedUnderTheSecondsName", func(t *testing.T) {
		e.t = t
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "fallback", Namespace: "default"}}
		claim.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "hca", FirstAvailable: []resourcev1.DeviceSubRequest{
			// More HCAs than the node has: cannot be met.
			{Name: "many", DeviceClassName: "hca." + draDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 64},
			{Name: "one", DeviceClassName: "hca." + draDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1},
		}}}
		if _, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := e.run(claimPod("fallback", map[string][]string{"c": {"fallback/hca"}}))
		if got := e.allocated("default", "fallback", "hca/many"); len(got) != 0 {
			t.Fatalf("the first subrequest was met: %v", got)
		}
		devices := e.allocated("default", "fallback", "hca/one")
		if len(devices) != 1 {
			t.Fatalf("request hca/one: devices %v, want 1", devices)
		}
		in := e.inside(pod, "c")
		e.checkHolds("container c", in, devices)
		beta, _ := e.readMetadata(in, metadata.ResourceClaimFilePath(draDriver, "fallback", "hca"))
		if beta.PodClaimName != nil {
			t.Errorf("podClaimName %q for a claim named in the pod", *beta.PodClaimName)
		}
		if len(beta.Requests) != 1 || beta.Requests[0].Name != "hca/one" || len(beta.Requests[0].Devices) != 1 ||
			beta.Requests[0].Devices[0].Name != devices[0] {
			t.Errorf("requests %+v, want hca/one with %s", beta.Requests, devices[0])
		}
	})
}

// readMetadata: the container's mount at `path` is a read-only bind of a host file that
// kubelet.DecodeDRAMetadata reads (the upstream package: v1beta1, then v1alpha1, validated).
func (e *draNodeEnv) readMetadata(in inside, path string) (*metadatav1beta1.DeviceMetadata, *metadatav1alpha1.DeviceMetadata) {
	e.t.Helper()
	m, ok := in.mounts[path]
	if !ok {
		e.t.Fatalf("no mount at %s: %v (CDI %v)", path, in.mounts, in.ids)
	}
	if !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "bind") {
		e.t.Errorf("mount %s options %v: want a read-only bind", path, m.Options)
	}
	data, err := os.ReadFile(m.Source)
	if err != nil {
		e.t.Fatalf("mount %s: %v", path, err)
	}
	beta, alpha, err := kubelet.DecodeDRAMetadata(data)
	if err != nil {
		e.t.Fatalf("%s: %v\n%s", m.Source, err, data)
	}
	return beta, alpha
}
