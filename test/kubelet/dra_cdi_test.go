package kubelet

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// The binary writes a claim's CDI spec (through the driver's Prepare, `dra prepare-local`) on the
// fixture node; the CDI library that containerd and CRI-O use loads and validates it, and
// injecting the claim's device (one per request; the claim has one request, used by one
// container) into an OCI spec adds exactly the claim's device nodes (with the fixture's
// major:minor, so the runtime need not stat the host) and device-plugin Allocate's env, plus the
// request's own variables (docs/dra.md); the request's second device mounts its metadata file
// read-only where KEP-5304 puts it, a stream the upstream package
// (k8s.io/dynamic-resource-allocation/devicemetadata) decodes and validates as v1beta1, then
// v1alpha1, naming the claim's devices.
func TestDRACDISpecValid(t *testing.T) {
	bin, dir, n, sys := draDriverFixture(t)
	ib, roce := usableHCAs(n)
	if len(ib) == 0 {
		t.Fatalf("%s: no usable InfiniBand HCA", n.XML)
	}
	hcas := []HCA{ib[0]}
	if len(roce) > 0 {
		hcas = append(hcas, roce[0]) // no umad/issm
	} else if len(ib) > 1 {
		hcas = append(hcas, ib[1])
	}
	sort.Slice(hcas, func(i, j int) bool { return hcas[i].PCI < hcas[j].PCI })
	// A UID that starts with a digit, as UUIDs often do: the case that needs cdiVersion 0.5.0.
	const uid = "0f3b6c2e-4d1a-4c55-9b7e-2a1d3c4b5e6f"
	cdiRoot := filepath.Join(dir, "cdi")
	args := append([]string{"dra", "prepare-local"}, draArgs(filepath.Join(dir, "kubelet"), cdiRoot, sys, n)...)
	args = append(args, "--claim-uid", uid, "--claim-namespace", "ns", "--claim-name", "nccl")
	for _, h := range hcas {
		args = append(args, "--device", DRADeviceName(h))
	}
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s\n%s", bin, strings.Join(args, " "), err, out, stderr.String())
	}
	var answer struct {
		Devices []struct {
			DeviceName   string   `json:"deviceName"`
			CDIDeviceIDs []string `json:"cdiDeviceIds"`
		} `json:"devices"`
		CDISpec string `json:"cdiSpec"`
	}
	if err := json.Unmarshal(out, &answer); err != nil {
		t.Fatalf("answer %q: %v", out, err)
	}
	wantID := DRADriver + "/hca=" + uid + "-hca"
	metaID := DRADriver + "/hca=" + uid + "_hca"
	if len(answer.Devices) != len(hcas) {
		t.Fatalf("%d devices answered, want %d: %s", len(answer.Devices), len(hcas), out)
	}
	var ids []string
	for i, d := range answer.Devices {
		want := []string{wantID, metaID} // the request's CDI devices, on its first device only
		if i > 0 {
			want = nil
		}
		if d.DeviceName != DRADeviceName(hcas[i]) || fmt.Sprint(d.CDIDeviceIDs) != fmt.Sprint(want) {
			t.Errorf("device %d: %+v, want %s with CDI IDs %v", i, d, DRADeviceName(hcas[i]), want)
		}
		ids = append(ids, d.CDIDeviceIDs...) // as the kubelet hands them to the runtime
	}
	wantFile := filepath.Join(cdiRoot, DRADriver+"-hca_"+uid+".json")
	if answer.CDISpec != wantFile {
		t.Errorf("spec at %s, want %s", answer.CDISpec, wantFile)
	}
	if st, err := os.Stat(wantFile); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("spec file %s: %v, mode %v; want 0644", wantFile, err, st.Mode().Perm())
	}

	// The CDI library's cache, as a runtime configures it.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiRoot), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	for path, errs := range cache.GetErrors() {
		t.Errorf("CDI cache: %s: %v", path, errs)
	}
	specs := cache.GetVendorSpecs(DRADriver)
	if len(specs) != 1 {
		t.Fatalf("%d specs of vendor %s, want 1", len(specs), DRADriver)
	}
	spec := specs[0]
	if err := cdispecs.ValidateVersion(spec.Spec); err != nil {
		t.Errorf("spec version: %v", err)
	}
	minimum, err := cdispecs.MinimumRequiredVersion(spec.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Version != minimum || spec.Version != "0.5.0" {
		t.Errorf("cdiVersion %s; the library's minimum for it is %s; want both 0.5.0", spec.Version, minimum)
	}
	if spec.GetClass() != "hca" || len(spec.Devices) != 2 || spec.Devices[0].Name != uid+"-hca" || spec.Devices[1].Name != uid+"_hca" {
		t.Errorf("spec kind %s, devices %d: want class hca and the devices %s-hca, %s_hca", spec.Kind, len(spec.Devices), uid, uid)
	}
	if cache.GetDevice(wantID) == nil {
		t.Fatalf("no CDI device %s; have %v", wantID, cache.ListDevices())
	}

	ociSpec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := cache.InjectDevices(ociSpec, ids...)
	if err != nil || len(unresolved) != 0 {
		t.Fatalf("InjectDevices(%v): unresolved %v, %v", ids, unresolved, err)
	}

	// Exactly the claim's device nodes, each with the fixture's numbers.
	want := map[string]string{"/dev/infiniband/rdma_cm": RdmaCmDev}
	var names, pcis []string
	for _, h := range hcas {
		want[fmt.Sprintf("/dev/infiniband/uverbs%d", sys.Uverbs[h.Name])] =
			fmt.Sprintf("%d:%d", IBMajor, UverbsMinorBase+sys.Uverbs[h.Name])
		for _, m := range sys.Mads[h.Name] {
			want[fmt.Sprintf("/dev/infiniband/umad%d", m)] = fmt.Sprintf("%d:%d", IBMajor, m)
			want[fmt.Sprintf("/dev/infiniband/issm%d", m)] = fmt.Sprintf("%d:%d", IBMajor, IssmMinorBase+m)
		}
		names = append(names, h.Name)
		pcis = append(pcis, h.PCI)
	}
	got := map[string]string{}
	for _, d := range ociSpec.Linux.Devices {
		if _, dup := got[d.Path]; dup {
			t.Errorf("device %s added twice", d.Path)
		}
		got[d.Path] = fmt.Sprintf("%d:%d", d.Major, d.Minor)
		if d.Type != "c" {
			t.Errorf("device %s: type %q, want c", d.Path, d.Type)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("device nodes %v, want %v", got, want)
	}
	checkMetadataMount(t, ociSpec, metadata.ResourceClaimFilePath(DRADriver, "nccl", "hca"), uid, hcas)
	// The cgroup rules allow each of them, read-write (as device-plugin Allocate's "rw").
	if ociSpec.Linux.Resources == nil || len(ociSpec.Linux.Resources.Devices) < len(want) {
		t.Fatalf("cgroup device rules %+v, want one per node", ociSpec.Linux.Resources)
	}
	for _, r := range ociSpec.Linux.Resources.Devices {
		if !r.Allow || r.Access != "rw" || r.Type != "c" || r.Major == nil || r.Minor == nil {
			t.Errorf("cgroup rule %+v: want allow c rw with major and minor", r)
		}
	}
	// The env of device-plugin Allocate, and the same under the request's own names, nothing
	// else.
	own := "_" + strings.ReplaceAll(uid, "-", "") + "_hca="
	var ucx []string // UCX names a device by port: the fixture's HCAs have one ACTIVE port
	for _, n := range names {
		ucx = append(ucx, n+":1")
	}
	wantEnv := []string{
		"NCCL_IB_HCA==" + strings.Join(names, ","),
		"NCCL_IB_HCA" + own + "=" + strings.Join(names, ","),
		"RDMA_HCA_NAMES=" + strings.Join(names, ","),
		"RDMA_HCA_NAMES" + own + strings.Join(names, ","),
		"RDMA_HCA_PCI=" + strings.Join(pcis, ","),
		"RDMA_HCA_PCI" + own + strings.Join(pcis, ","),
		"UCX_NET_DEVICES=" + strings.Join(ucx, ","),
		"UCX_NET_DEVICES" + own + strings.Join(ucx, ","),
	}
	gotEnv := append([]string(nil), ociSpec.Process.Env...)
	sort.Strings(gotEnv)
	if strings.Join(gotEnv, "\n") != strings.Join(wantEnv, "\n") {
		t.Errorf("env %q, want %q", gotEnv, wantEnv)
	}
}

// checkMetadataMount: the OCI spec has one mount under the metadata directory, a read-only bind
// at `path` of a file that DecodeDRAMetadata reads, naming claim `uid`'s request "hca" and exactly `hcas`, with their PCI addresses
// as attributes.
func checkMetadataMount(t *testing.T, spec *oci.Spec, path, uid string, hcas []HCA) {
	t.Helper()
	var found []oci.Mount
	for _, m := range spec.Mounts {
		if strings.HasPrefix(m.Destination, metadata.ContainerDir+"/") {
			found = append(found, m)
		}
	}
	if len(found) != 1 || found[0].Destination != path {
		t.Fatalf("mounts %+v, want one at %s", spec.Mounts, path)
	}
	m := found[0]
	if strings.Join(m.Options, ",") != "ro,bind" {
		t.Errorf("mount options %v, want ro,bind", m.Options)
	}
	data, err := os.ReadFile(m.Source)
	if err != nil {
		t.Fatal(err)
	}
	beta, alpha, err := DecodeDRAMetadata(data)
	if err != nil {
		t.Fatalf("%s: %v\n%s", m.Source, err, data)
	}
	if string(beta.UID) != uid || beta.Name != "nccl" || beta.Namespace != "ns" || beta.PodClaimName != nil {
		t.Errorf("metadata %+v, want claim ns/nccl uid %s, no podClaimName", beta.ObjectMeta, uid)
	}
	if len(beta.Requests) != 1 || beta.Requests[0].Name != "hca" || len(beta.Requests[0].Devices) != len(hcas) {
		t.Fatalf("requests %+v, want hca with %d devices", beta.Requests, len(hcas))
	}
	for i, d := range beta.Requests[0].Devices {
		pci := d.Attributes["resource.kubernetes.io/pciBusID"].StringValue
		if d.Driver != DRADriver || d.Name != DRADeviceName(hcas[i]) || pci == nil || *pci != hcas[i].PCI {
			t.Errorf("device %d: %s %s pciBusID %v, want %s %s %s", i, d.Driver, d.Name, pci, DRADriver, DRADeviceName(hcas[i]), hcas[i].PCI)
		}
		if len(d.Attributes) < 5 {
			t.Errorf("device %s: attributes %v: want those of the slice", d.Name, d.Attributes)
		}
	}
	if len(alpha.Requests) != 1 || len(alpha.Requests[0].Devices) != len(hcas) {
		t.Errorf("v1alpha1 requests %+v", alpha.Requests)
	}
}
