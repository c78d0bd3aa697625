package kubelet

// The DRA driver's devices (`rdma-device-plugin dra slices`) against Kubernetes' own code:
// the standard attributes against k8s.io/dynamic-resource-allocation/deviceattribute on the
// same sysfs, the slices against the API server's create path for ResourceSlices, and
// allocation by the scheduler's structured allocator.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	resourceinternal "k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	"k8s.io/kubernetes/pkg/registry/resource/resourceslice"
	"k8s.io/utils/ptr"
)

const (
	draDriver   = "rdma.network.alibabacloud.com" // dra/model.h kDefaultDriverName
	draGPUClass = "gpu.example.com"               // the fake GPU driver's name and class
	draNodeName = "dra-node"
	stdPrefix   = deviceattribute.StandardDeviceAttributePrefix
)

// draFixture is a node laid out as the harness lays nodes out (WriteSysfs), with what the DRA
// helpers read: /sys/bus/pci/devices/<BDF> links and the GPUs' device directories with numa_node.
type draFixture struct {
	Name string
	Node *Node
	Root string   // holds sys/ and dev/
	Sys  *Sysfs   // flips port states
	Args []string // discovery flags for `dra slices`
}

// newDRAFixture lays out xml's node; edit, when given, changes the node before it is laid out
// (the kernel's view then differs from the XML's, which the binary also reads).
func newDRAFixture(t *testing.T, xml string, edit func(*Node)) draFixture {
	t.Helper()
	n, err := LoadNode(xml)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(n)
	}
	root := t.TempDir()
	s, err := WriteSysfs(root, n)
	if err != nil {
		t.Fatal(err)
	}
	return draFixture{Name: strings.TrimSuffix(filepath.Base(xml), ".xml"), Node: n, Root: root, Sys: s,
		Args: []string{"--topology-xml", xml, "--sysfs-root", root, "--dev-root", root, "--log-level", "warn"}}
}

// draXMLs are the nodes every DRA test runs on: dgx-h100-like, the two real machines' exports and
// the three synthetic nodes.
func draXMLs() []string { return allXMLs() }

// draSlices runs `dra slices` and decodes its List strictly: a field the API does not know fails.
func draSlices(t *testing.T, bin string, args ...string) []resourceapi.ResourceSlice {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"dra", "slices"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dra slices %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var list struct {
		APIVersion string                      `json:"apiVersion"`
		Kind       string                      `json:"kind"`
		Items      []resourceapi.ResourceSlice `json:"items"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&list); err != nil {
		t.Fatalf("dra slices: %v\n%s", err, out)
	}
	if list.APIVersion != "v1" || list.Kind != "List" {
		t.Fatalf("dra slices: apiVersion %q kind %q, want v1 List", list.APIVersion, list.Kind)
	}
	return list.Items
}

func draDevices(slices []resourceapi.ResourceSlice) []resourceapi.Device {
	var out []resourceapi.Device
	for _, s := range slices {
		out = append(out, s.Spec.Devices...)
	}
	return out
}

// upstreamStandard is what deviceattribute's helpers publish for a PCI function of the tree
// under root: the attributes a helper returns without error.
func upstreamStandard(root, pci string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	fs := deviceattribute.WithFSFromRoot(filepath.Join(root, "sys"))
	out := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	if a, err := deviceattribute.GetPCIBusIDAttribute(pci); err == nil {
		out[a.Name] = a.Value
	}
	if a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pci, fs); err == nil {
		out[a.Name] = a.Value
	}
	if a, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(pci, deviceattribute.ScalarAttribute, fs); err == nil {
		out[a.Name] = a.Value
	}
	return out
}

func standardOf(d resourceapi.Device) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	out := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for k, v := range d.Attributes {
		if strings.HasPrefix(string(k), stdPrefix) {
			out[k] = v
		}
	}
	return out
}

func attrString(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string) string {
	if v, ok := a[resourceapi.QualifiedName(name)]; ok && v.StringValue != nil {
		return *v.StringValue
	}
	return ""
}

// compareStandard checks every device of the binary's slices against the helpers on root and
// returns the PCI addresses it compared.
func compareStandard(t *testing.T, what, root string, devices []resourceapi.Device) []string {
	t.Helper()
	var pcis []string
	for _, d := range devices {
		pci := attrString(d.Attributes, stdPrefix+"pciBusID")
		if pci == "" {
			t.Errorf("%s: device %s has no pciBusID", what, d.Name)
			continue
		}
		pcis = append(pcis, pci)
		want := upstreamStandard(root, pci)
		if _, ok := want[deviceattribute.StandardDeviceAttributePCIeRoot]; !ok {
			t.Errorf("%s: the helpers find no pcieRoot for %s: the tree lacks the kernel's link", what, pci)
		}
		if got := standardOf(d); !apiequality.Semantic.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			t.Errorf("%s: device %s: standard attributes\n  ours:     %s\n  upstream: %s", what, d.Name, g, w)
		}
	}
	sort.Strings(pcis)
	return pcis
}

// deviceattribute's helpers on the fixture trees the harness lays out (plus the kernel's
// /sys/bus/pci/devices links), on trees where the kernel disagrees with the XML that hwloc reads
// (another root bus, numa_node -1: the helpers follow the kernel and so must we), and on a real
// machine's gathered /sys.
func TestDRAAttributesMatchUpstream(t *testing.T) {
	bin := draBinary(t)
	type fixture struct {
		name string
		f    draFixture
	}
	var fixtures []fixture
	for _, xml := range draXMLs() {
		f := newDRAFixture(t, xml, nil)
		fixtures = append(fixtures, fixture{f.Name, f})
	}
	diverged := newDRAFixture(t, fixtureXML(), func(n *Node) {
		n.HCAs[0].PCIeRoot = "pci0000:14" // a root bus the XML's host bridge does not name
		n.HCAs[1].NUMA = -1               // the kernel knows no NUMA node; hwloc's XML says 0
	})
	fixtures = append(fixtures, fixture{"dgx-h100-like, kernel differs from hwloc", diverged})

	for _, fx := range fixtures {
		devices := draDevices(draSlices(t, bin, append(fx.f.Args, "--node-name", draNodeName)...))
		pcis := compareStandard(t, fx.name, fx.f.Root, devices)
		var want []string
		for _, h := range fx.f.Node.HCAs {
			want = append(want, h.PCI)
		}
		sort.Strings(want)
		if strings.Join(pcis, " ") != strings.Join(want, " ") {
			t.Errorf("%s: devices for %v, want one per HCA %v", fx.name, pcis, want)
		}
	}
	// The divergence is real: the XML alone (hwloc's view, no sysfs) says otherwise.
	n := diverged.Node
	xmlOnly := draDevices(draSlices(t, bin, "--topology-xml", fixtureXML(), "--node-name", draNodeName, "--log-level", "warn"))
	for _, d := range xmlOnly {
		if attrString(d.Attributes, stdPrefix+"pciBusID") == n.HCAs[0].PCI &&
			attrString(d.Attributes, stdPrefix+"pcieRoot") == "pci0000:14" {
			t.Errorf("the XML alone also says pci0000:14 for %s: the diverged case tests nothing", n.HCAs[0].PCI)
		}
	}

	// A real machine's /sys (hwloc-gather-topology, test/data/README.md).
	dir := t.TempDir()
	tarball := filepath.Join(repoRoot(), "test", "data", "32em64t-2n8c+1mic.tar.bz2")
	if out, err := exec.Command("tar", "-xjf", tarball, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	root := filepath.Join(dir, "32em64t-2n8c+1mic")
	devices := draDevices(draSlices(t, bin, "--sysfs-root", root, "--dev-root", root, "--node-name", draNodeName, "--log-level", "warn"))
	if pcis := compareStandard(t, "gathered 32em64t-2n8c+1mic", root, devices); len(pcis) == 0 {
		t.Errorf("gathered tree: no device")
	}
}

// toInternal converts a v1 ResourceSlice as the API server does after decoding: defaults, then
// the internal version.
func toInternal(t *testing.T, s *resourceapi.ResourceSlice) *resourceinternal.ResourceSlice {
	t.Helper()
	legacyscheme.Scheme.Default(s)
	var out resourceinternal.ResourceSlice
	if err := legacyscheme.Scheme.Convert(s, &out, nil); err != nil {
		t.Fatalf("convert: %v", err)
	}
	return &out
}

// createErr runs the API server's create path for a ResourceSlice (rest.BeforeCreate with the
// registry's strategy: PrepareForCreate drops fields of disabled features, then handwritten and
// declarative validation).
func createErr(t *testing.T, s resourceapi.ResourceSlice) (*resourceinternal.ResourceSlice, error) {
	t.Helper()
	obj := toInternal(t, s.DeepCopy())
	rest.FillObjectMetaSystemFields(obj)
	ctx := genericapirequest.WithNamespace(genericapirequest.NewContext(), metav1.NamespaceNone)
	ctx = genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{
		IsResourceRequest: true, Verb: "create", APIPrefix: "apis", APIGroup: "resource.k8s.io",
		APIVersion: "v1", Resource: "resourceslices", Name: s.Name})
	return obj, rest.BeforeCreate(resourceslice.Strategy, ctx, obj)
}

// The node with roles (`fixture --node dgx-roles`: compute, storage and two SR-IOV VFs): its
// slices, every identity attribute of every device and the VFs' physicalFunction, pass the API
// server's validation, and the VFs are published marked.
func TestDRARolesNodeSlicesValidate(t *testing.T) {
	bin := draBinary(t)
	dir := t.TempDir()
	n, _, err := WriteNamedNodeWithBinary(bin, "dgx-roles", dir)
	if err != nil {
		t.Fatal(err)
	}
	slices := draSlices(t, bin, "--topology-xml", n.XML, "--sysfs-root", dir,
		"--dev-root", dir, "--log-level", "warn", "--node-name", draNodeName)
	devices, vfs := 0, 0
	for _, s := range slices {
		obj, err := createErr(t, s)
		if err != nil {
			t.Errorf("slice %s is refused: %v", s.Name, err)
			continue
		}
		for _, d := range obj.Spec.Devices {
			devices++
			if vf := d.Attributes[draDriver+"/virtualFunction"].BoolValue; vf != nil && *vf {
				vfs++
				if pf := d.Attributes[draDriver+"/physicalFunction"].StringValue; pf == nil || *pf != "0000:15:00.0" {
					t.Errorf("VF %s: physicalFunction %v, want 0000:15:00.0", d.Name, pf)
				}
			}
		}
	}
	if devices != 10 || vfs != 2 {
		t.Errorf("%d devices of which %d VFs, want 10 and 2", devices, vfs)
	}
}

// Every slice the binary prints for every fixture, in both modes, with a custom driver name and
// with an unhealthy HCA, passes the API server's validation for a create, and loses nothing to
// the feature gates' field dropping (taints, allowMultipleAllocations).
func TestDRASlicesValidate(t *testing.T) {
	bin := draBinary(t)
	checked := 0
	for _, xml := range draXMLs() {
		f := newDRAFixture(t, xml, nil)
		first := f.Node.HCAs[0]
		if err := f.Sys.SetPortState(first.Name, first.Ports[0], "DOWN"); err != nil {
			t.Fatal(err)
		}
		for _, extra := range [][]string{
			{"--mode", "exclusive", "--node-name", draNodeName},
			{"--mode", "shared", "--node-name", draNodeName},
			{"--mode", "shared", "--driver-name", "rdma.example.com", "--node-name", "node-1.zone-a"},
			{"--mode", "shared", "--shared-devices", "1", "--node-name", draNodeName},
		} {
			args := append(append([]string{}, f.Args...), extra...)
			slices := draSlices(t, bin, args...)
			if len(slices) == 0 {
				t.Fatalf("%s %v: no slice", f.Name, extra)
			}
			tainted, multi, consumable := 0, 0, 0
			for _, s := range slices {
				obj, err := createErr(t, s)
				if err != nil {
					t.Errorf("%s %v: slice %s is refused: %v", f.Name, extra, s.Name, err)
					continue
				}
				checked++
				for _, d := range obj.Spec.Devices {
					if len(d.Taints) > 0 {
						tainted++
					}
					if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
						multi++
					}
					if pods, bw := d.Capacity["pods"], d.Capacity["bandwidthGbps"]; pods.RequestPolicy != nil && bw.RequestPolicy != nil {
						consumable++
					}
				}
			}
			if tainted != 1 {
				t.Errorf("%s %v: %d tainted devices after create, want 1 (%s's port is DOWN)", f.Name, extra, tainted, first.Name)
			}
			if shared := extra[1] == "shared"; shared && multi != len(f.Node.HCAs) || !shared && multi != 0 {
				t.Errorf("%s %v: %d devices allow multiple allocations", f.Name, extra, multi)
			}
			if shared := extra[1] == "shared"; shared && consumable != len(f.Node.HCAs) || !shared && consumable != 0 {
				t.Errorf("%s %v: %d devices keep pods and bandwidthGbps with their request policies after create", f.Name, extra, consumable)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no slice validated")
	}

	// The path above refuses what it must: a control that breaks one device each way.
	f := newDRAFixture(t, fixtureXML(), nil)
	good := draSlices(t, bin, append(f.Args, "--node-name", draNodeName)...)[0]
	for what, breakIt := range map[string]func(d *resourceapi.Device){
		"string over 64": func(d *resourceapi.Device) {
			d.Attributes[draDriver+"/hcaName"] = resourceapi.DeviceAttribute{StringValue: ptr.To(strings.Repeat("m", 65))}
		},
		"id over 32": func(d *resourceapi.Device) {
			d.Attributes[draDriver+"/"+resourceapi.QualifiedName(strings.Repeat("a", 33))] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
		},
		"taint value": func(d *resourceapi.Device) {
			d.Taints = []resourceapi.DeviceTaint{{Key: draDriver + "/unhealthy", Value: "port 1 is DOWN", Effect: "NoSchedule"}}
		},
		"device name": func(d *resourceapi.Device) { d.Name = "hca-0000:1a:00.0" },
		"two value kinds": func(d *resourceapi.Device) {
			d.Attributes[draDriver+"/mode"] = resourceapi.DeviceAttribute{StringValue: ptr.To("x"), BoolValue: ptr.To(true)}
		},
	} {
		bad := *good.DeepCopy()
		breakIt(&bad.Spec.Devices[0])
		if _, err := createErr(t, bad); err == nil {
			t.Errorf("control %q: accepted", what)
		}
	}
}

// gpuSlice is a fake GPU driver's pool: one device per GPU of the node with the standard
// attributes as a real GPU driver gets them, from deviceattribute's helpers on the same tree.
func gpuSlice(t *testing.T, f draFixture) *resourceapi.ResourceSlice {
	t.Helper()
	s := NodeSlice(draNodeName+"-"+draGPUClass, draNodeName, draGPUClass)
	for i, g := range f.Node.GPUs {
		attrs := upstreamStandard(f.Root, g.PCI)
		if _, ok := attrs[deviceattribute.StandardDeviceAttributePCIeRoot]; !ok {
			t.Fatalf("%s: the helpers find no pcieRoot for GPU %s", f.Name, g.PCI)
		}
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: attrs})
	}
	return s
}

type draAllocator struct {
	t      *testing.T
	slices []*resourceapi.ResourceSlice
	node   *v1.Node
	byName map[string]HCA // our device name -> the node's HCA, through the device's pciBusID
}

func newDRAAllocator(t *testing.T, bin string, f draFixture, extra ...string) *draAllocator {
	t.Helper()
	a := &draAllocator{t: t, node: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: draNodeName}}, byName: map[string]HCA{}}
	ours := draSlices(t, bin, append(append(append([]string{}, f.Args...), "--node-name", draNodeName), extra...)...)
	for i := range ours {
		a.slices = append(a.slices, &ours[i])
		for _, d := range ours[i].Spec.Devices {
			if h, ok := f.Node.HCAByPCI(attrString(d.Attributes, stdPrefix+"pciBusID")); ok {
				a.byName[d.Name] = h
			} else {
				t.Fatalf("%s: device %s is no HCA of the node", f.Name, d.Name)
			}
		}
	}
	if len(f.Node.GPUs) > 0 {
		a.slices = append(a.slices, gpuSlice(t, f))
	}
	return a
}

// allocate runs the scheduler's allocator for the claims together on a node with nothing
// allocated yet; nil when they cannot all be allocated.
func (a *draAllocator) allocate(claims ...*resourceapi.ResourceClaim) []resourceapi.AllocationResult {
	a.t.Helper()
	features := structured.Features{ConsumableCapacity: true, DeviceTaints: true, PrioritizedList: true, PartitionableDevices: true}
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	classes := DeviceClasses{draDriver: DriverClass(draDriver, draDriver), draGPUClass: DriverClass(draGPUClass, draGPUClass)}
	alloc, err := structured.NewAllocator(context.Background(), features, state, classes, a.slices,
		cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		a.t.Fatal(err)
	}
	results, err := alloc.Allocate(context.Background(), a.node, claims)
	if err != nil {
		a.t.Fatalf("allocate: %v", err)
	}
	return results
}

// hcasOf maps a result's devices of `request` back to the node's HCAs.
func (a *draAllocator) hcasOf(r resourceapi.AllocationResult, request string) []HCA {
	var out []HCA
	for _, d := range r.Devices.Results {
		if d.Request != request {
			continue
		}
		if d.Driver != draDriver || d.Pool != draNodeName {
			a.t.Errorf("result %+v: not our driver's pool", d)
		}
		h, ok := a.byName[d.Device]
		if !ok {
			a.t.Errorf("result names device %s, which the slices do not have", d.Device)
		}
		out = append(out, h)
	}
	return out
}

func claim(name string, requests []resourceapi.DeviceRequest, constraints ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests, Constraints: constraints}},
	}
}

func exactly(name, class string, count int64, selectors ...string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
	for _, s := range selectors {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return r
}

// outermostSwitch is the upstream port of the switch right below the root port: the second
// bridge of the chain when there are at least three. "" when there is none.
func outermostSwitch(bridges []string) string {
	if len(bridges) < 3 {
		return ""
	}
	return bridges[1]
}

// checkSwitchPairs asks for two HCAs with matchAttribute on our attribute attr (a switch) and
// checks the result against the node's own reading of its bridges (switchOf): two HCAs under one
// switch when some switch has two, nothing otherwise. Then it takes one HCA of every such switch
// down, one at a time: the tainted HCAs' switches must no longer be chosen, and with all of them
// down the claim cannot be allocated. Ports are ACTIVE again at the end. Reports whether the node
// has a switch with two HCAs.
func checkSwitchPairs(t *testing.T, bin string, f draFixture, attr string, switchOf func([]string) string) bool {
	t.Helper()
	bySwitch := map[string][]string{}
	for _, h := range f.Node.HCAs {
		if sw := switchOf(h.Bridges); sw != "" {
			bySwitch[sw] = append(bySwitch[sw], h.Name)
		}
	}
	pairSwitches := 0
	for _, names := range bySwitch {
		if len(names) >= 2 {
			pairSwitches++
		}
	}
	two := claim("two-hcas", []resourceapi.DeviceRequest{exactly("hcas", draDriver, 2)},
		resourceapi.DeviceConstraint{Requests: []string{"hcas"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(draDriver + "/" + attr))})
	a := newDRAAllocator(t, bin, f)
	results := a.allocate(two)
	if pairSwitches == 0 {
		if results != nil {
			t.Errorf("%s %s: no switch holds two HCAs, yet got %+v", f.Name, attr, results)
		}
		return false
	}
	if len(results) != 1 {
		t.Errorf("%s %s: no two HCAs on one switch allocated; the node has %v", f.Name, attr, bySwitch)
		return true
	}
	hcas := a.hcasOf(results[0], "hcas")
	if len(hcas) != 2 || switchOf(hcas[0].Bridges) != switchOf(hcas[1].Bridges) || hcas[0].PCI == hcas[1].PCI {
		t.Errorf("%s %s: two HCAs on one switch: got %+v", f.Name, attr, hcas)
	}

	down := map[string]bool{} // switches with a DOWN HCA
	defer func() {
		for sw := range down {
			h := hcaByName(f.Node, bySwitch[sw][0])
			if err := f.Sys.SetPortState(h.Name, h.Ports[0], "ACTIVE"); err != nil {
				t.Fatal(err)
			}
		}
	}()
	for sw, names := range bySwitch {
		if len(names) < 2 {
			continue
		}
		h := hcaByName(f.Node, names[0])
		if err := f.Sys.SetPortState(h.Name, h.Ports[0], "DOWN"); err != nil {
			t.Fatal(err)
		}
		down[sw] = true
		a := newDRAAllocator(t, bin, f)
		results := a.allocate(two)
		if len(down) == pairSwitches {
			if results != nil {
				t.Errorf("%s %s: every switch has a DOWN HCA, yet got %+v", f.Name, attr, results)
			}
			break
		}
		if len(results) != 1 {
			t.Errorf("%s %s: with HCAs down on %d of %d switches: no allocation", f.Name, attr, len(down), pairSwitches)
			continue
		}
		for _, got := range a.hcasOf(results[0], "hcas") {
			if down[switchOf(got.Bridges)] {
				t.Errorf("%s %s: got %s on switch %s, which has a DOWN HCA", f.Name, attr, got.Name, switchOf(got.Bridges))
			}
		}
	}
	return true
}

// innermostSwitch is the upstream port of the nearest switch above a device, read off its bridge
// chain (root port first): the second-last bridge when there are at least three, since the last
// is then a downstream port of that switch. "" when there is none.
func innermostSwitch(bridges []string) string {
	if len(bridges) < 3 {
		return ""
	}
	return bridges[len(bridges)-2]
}

// The scheduler's structured allocator on the slices the binary prints and a fake GPU driver's:
// a GPU plus an HCA with matchAttribute pcieRoot gets an HCA under the GPU's root whenever the
// node has one (and nothing when it has none); two HCAs with matchAttribute on our pcieSwitch
// (pcieTopSwitch) get two under one nearest (top-level) switch where the node has such a switch,
// never a tainted (unhealthy) HCA; shared mode lets two claims each take every HCA, exclusive mode
// does not.
func TestDRAStructuredAllocation(t *testing.T) {
	bin := draBinary(t)
	pcieRoot := ptr.To(resourceapi.FullyQualifiedName(deviceattribute.StandardDeviceAttributePCIeRoot))
	pairs, unsatisfiable, switchPairs := 0, 0, map[string]int{}
	for _, xml := range draXMLs() {
		f := newDRAFixture(t, xml, nil)
		a := newDRAAllocator(t, bin, f)
		for _, g := range f.Node.GPUs {
			c := claim("gpu-and-hca", []resourceapi.DeviceRequest{
				exactly("gpu", draGPUClass, 1, fmt.Sprintf("device.attributes[%q].pciBusID == %q", strings.TrimSuffix(stdPrefix, "/"), g.PCI)),
				exactly("hca", draDriver, 1),
			}, resourceapi.DeviceConstraint{Requests: []string{"gpu", "hca"}, MatchAttribute: pcieRoot})
			var near []string
			for _, h := range f.Node.HCAs {
				if h.PCIeRoot == g.PCIeRoot {
					near = append(near, h.Name)
				}
			}
			results := a.allocate(c)
			if len(near) == 0 {
				unsatisfiable++
				if results != nil {
					t.Errorf("%s: GPU %s (%s) has no HCA on its root, yet got %+v", f.Name, g.PCI, g.PCIeRoot, results)
				}
				continue
			}
			pairs++
			if len(results) != 1 {
				t.Errorf("%s: GPU %s (%s): no allocation, though %v share its root", f.Name, g.PCI, g.PCIeRoot, near)
				continue
			}
			hcas := a.hcasOf(results[0], "hca")
			if len(hcas) != 1 || hcas[0].PCIeRoot != g.PCIeRoot {
				t.Errorf("%s: GPU %s (%s) got HCAs %+v", f.Name, g.PCI, g.PCIeRoot, hcas)
			}
		}

		for _, level := range []struct {
			attr string
			of   func([]string) string
		}{{"pcieSwitch", innermostSwitch}, {"pcieTopSwitch", outermostSwitch}} {
			if checkSwitchPairs(t, bin, f, level.attr, level.of) {
				switchPairs[level.attr]++
			}
		}
	}
	t.Logf("GPU+HCA claims: %d satisfiable, %d unsatisfiable; nodes with two HCAs on one switch: %v", pairs, unsatisfiable, switchPairs)
	if pairs == 0 || unsatisfiable == 0 || switchPairs["pcieSwitch"] == 0 || switchPairs["pcieTopSwitch"] <= switchPairs["pcieSwitch"] {
		t.Errorf("the fixtures tested %d satisfiable GPU pairs, %d unsatisfiable, switch pairs %v: each must be > 0, more nodes with a top switch pair than a leaf one",
			pairs, unsatisfiable, switchPairs)
	}

	// Shared mode: two claims that each want every HCA both fit; in exclusive mode they do not.
	f := newDRAFixture(t, fixtureXML(), nil)
	all := func(name string) *resourceapi.ResourceClaim {
		return claim(name, []resourceapi.DeviceRequest{{Name: "all", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: draDriver, AllocationMode: resourceapi.DeviceAllocationModeAll}}})
	}
	if results := newDRAAllocator(t, bin, f, "--mode", "exclusive").allocate(all("a"), all("b")); results != nil {
		t.Errorf("exclusive mode: two claims of every HCA were both allocated: %+v", results)
	}
	shared := newDRAAllocator(t, bin, f, "--mode", "shared")
	results := shared.allocate(all("a"), all("b"))
	if len(results) != 2 {
		t.Fatalf("shared mode: two claims of every HCA: %d results", len(results))
	}
	for i, r := range results {
		if got := shared.hcasOf(r, "all"); len(got) != len(f.Node.HCAs) {
			t.Errorf("shared mode: claim %d got %d HCAs, want %d", i, len(got), len(f.Node.HCAs))
		}
		for _, d := range r.Devices.Results {
			if d.ShareID == nil {
				t.Errorf("shared mode: claim %d's %s has no shareID", i, d.Device)
			}
		}
	}
}

func hcaByName(n *Node, name string) HCA {
	for _, h := range n.HCAs {
		if h.Name == name {
			return h
		}
	}
	return HCA{}
}

// TestDRAConsumableCapacityAllocation: the scheduler's allocator on a shared node's slices, one
// HCA (400 Gb/s) pinned by a CEL selector on its name. Claims asking 100 Gb/s each: four fit, a
// fifth does not; each result consumes what it asked and 1 of pods. Claims asking nothing consume
// pods 1 and bandwidth 0: 1000 of them fit on the default 1000 units beside the four, the 1001st
// does not; with --shared-devices 3, three.
func TestDRAConsumableCapacityAllocation(t *testing.T) {
	bin := draBinary(t)
	f := newDRAFixture(t, fixtureXML(), nil)
	hca := f.Node.HCAs[0].Name
	pinned := func(name string, gbps int64) *resourceapi.ResourceClaim {
		req := &resourceapi.ExactDeviceRequest{DeviceClassName: draDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1, Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes[%q].hcaName == %q`, draDriver, hca)}}}}
		if gbps > 0 {
			req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				"bandwidthGbps": *resource.NewQuantity(gbps, resource.DecimalSI)}}
		}
		return claim(name, []resourceapi.DeviceRequest{{Name: "hca", Exactly: req}})
	}
	// The quantities are printed as the API server writes them back (1000 is "1k"), so that a
	// restarted driver finds its stored slices equal to what it would write.
	for _, units := range []string{"1000", "1500", "3"} {
		out, err := exec.Command(bin, append(append([]string{"dra", "slices"}, f.Args...), "--node-name", draNodeName,
			"--mode", "shared", "--shared-devices", units)...).Output()
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Items []struct {
				Spec struct {
					Devices []struct {
						Capacity map[string]struct {
							Value         string
							RequestPolicy struct {
								Default    string
								ValidRange struct{ Min, Step string }
							}
						}
					}
				}
			}
		}
		if err := json.Unmarshal(out, &list); err != nil {
			t.Fatal(err)
		}
		for _, d := range list.Items[0].Spec.Devices {
			for name, c := range d.Capacity {
				for _, q := range []string{c.Value, c.RequestPolicy.Default, c.RequestPolicy.ValidRange.Min, c.RequestPolicy.ValidRange.Step} {
					parsed := resource.MustParse(q)
					if canonical := parsed.String(); q != canonical {
						t.Errorf("--shared-devices %s: capacity %s has %q, which the API server writes back as %q", units, name, q, canonical)
					}
				}
			}
		}
	}

	shared := newDRAAllocator(t, bin, f, "--mode", "shared")
	var bandwidth []*resourceapi.ResourceClaim
	for i := range 4 {
		bandwidth = append(bandwidth, pinned(fmt.Sprintf("bw-%d", i), 100))
	}
	results := shared.allocate(bandwidth...)
	if len(results) != 4 {
		t.Fatalf("four claims of 100 Gb/s on a 400 Gb/s HCA: %d allocated", len(results))
	}
	for i, r := range results {
		d := r.Devices.Results[0]
		bw, pods := d.ConsumedCapacity["bandwidthGbps"], d.ConsumedCapacity["pods"]
		if shared.byName[d.Device].Name != hca || d.ShareID == nil || bw.Value() != 100 || pods.Value() != 1 {
			t.Errorf("claim bw-%d: %s (%s) shareID %v consumed bandwidthGbps %s pods %s, want %s, a shareID, 100 and 1",
				i, d.Device, shared.byName[d.Device].Name, d.ShareID, bw.String(), pods.String(), hca)
		}
	}
	if got := shared.allocate(append(bandwidth, pinned("bw-4", 100))...); got != nil {
		t.Errorf("a fifth claim of 100 Gb/s on the 400 Gb/s HCA was allocated: %+v", got)
	}
	// A request of 0.5 Gb/s is rounded up to a whole one (step 1).
	if got := shared.allocate(pinned("nothing", 0), claim("frac", []resourceapi.DeviceRequest{{Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: draDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1, Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"bandwidthGbps": resource.MustParse("500m")}}}}})); len(got) == 2 {
		bw := got[1].Devices.Results[0].ConsumedCapacity["bandwidthGbps"]
		if bw.Value() != 1 || bw.MilliValue() != 1000 {
			t.Errorf("a request of 0.5 Gb/s consumed %s, want 1", bw.String())
		}
	} else {
		t.Errorf("a claim asking nothing and one asking 0.5 Gb/s: %d allocated", len(got))
	}

	// Claims asking nothing: pods 1, bandwidth 0, so they fit beside the full bandwidth.
	plain := append([]*resourceapi.ResourceClaim{}, bandwidth...)
	for i := range 1000 - len(bandwidth) {
		plain = append(plain, pinned(fmt.Sprintf("plain-%d", i), 0))
	}
	results = shared.allocate(plain...)
	if len(results) != 1000 {
		t.Fatalf("1000 claims on the HCA's 1000 pods units: %d allocated", len(results))
	}
	last := results[len(results)-1].Devices.Results[0]
	if bw, pods := last.ConsumedCapacity["bandwidthGbps"], last.ConsumedCapacity["pods"]; bw.Value() != 0 || pods.Value() != 1 {
		t.Errorf("a claim asking nothing consumed bandwidthGbps %s pods %s, want 0 and 1", bw.String(), pods.String())
	}
	if got := shared.allocate(append(plain, pinned("plain-extra", 0))...); got != nil {
		t.Errorf("a 1001st claim was allocated on 1000 pods units")
	}
	three := newDRAAllocator(t, bin, f, "--mode", "shared", "--shared-devices", "3")
	if got := three.allocate(pinned("a", 0), pinned("b", 0), pinned("c", 0)); len(got) != 3 {
		t.Errorf("--shared-devices 3: three claims, %d allocated", len(got))
	}
	if got := three.allocate(pinned("a", 0), pinned("b", 0), pinned("c", 0), pinned("d", 0)); got != nil {
		t.Errorf("--shared-devices 3: a fourth claim was allocated")
	}
}
