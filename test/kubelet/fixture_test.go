package kubelet

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The harness's reading of the fixture: what the GPU plugin and the Topology Manager use.
func TestFixtureNode(t *testing.T) {
	n, err := LoadNode(fixtureXML())
	if err != nil {
		t.Fatal(err)
	}
	if got := n.NUMANodes; len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Errorf("NUMA nodes %v, want [0 1]", got)
	}
	if len(n.GPUs) != 8 || len(n.HCAs) != 9 {
		t.Fatalf("%d GPUs, %d HCAs; want 8, 9", len(n.GPUs), len(n.HCAs))
	}
	for i, g := range n.GPUs {
		if want := i / 4; g.NUMA != want {
			t.Errorf("GPU %d (%s) on NUMA %d, want %d", i, g.PCI, g.NUMA, want)
		}
	}
	h, ok := n.HCAByPCI("0000:1a:00.0")
	if !ok || h.Name != "mlx5_0" || h.PCIeRoot != "pci0000:15" ||
		strings.Join(h.Bridges, " ") != "0000:15:01.0 0000:16:00.0 0000:17:02.0" {
		t.Errorf("mlx5_0 = %+v", h)
	}
}

// otherNodes are real machines' exports (test/data/README.md) with an HCA and GPUs.
var otherNodes = []string{"32em64t-2n8c2t-pci-normalio.xml", "24em64t-2n6c2t-pci.xml"}

// syntheticNodes are test/data/gen_quality_nodes.py's nodes (test/data/<name>.xml), which the
// quality replay uses beside dgx-h100-like.
var syntheticNodes = []string{"two-level-switches", "four-numa", "fewer-hcas-than-gpus"}

// graceNodes are test/data/gen_grace_nodes.py's nodes: a GB200 compute tray and a GH200 node
// (CPU-less NUMA nodes of GPU memory, a PCI domain per root complex) and a POWER9 node whose
// NUMA IDs are 0 and 8.
var graceNodes = []string{"gb200-tray", "gh200", "power9-numa-0-8"}

// allXMLs are the fixture XMLs the harness reads: dgx-h100-like, the real machines', the
// synthetic and the Grace-class nodes.
func allXMLs() []string {
	xmls := []string{fixtureXML()}
	for _, f := range otherNodes {
		xmls = append(xmls, filepath.Join(repoRoot(), "test", "data", f))
	}
	for _, f := range append(append([]string(nil), syntheticNodes...), graceNodes...) {
		xmls = append(xmls, filepath.Join(repoRoot(), "test", "data", f+".xml"))
	}
	return xmls
}

// Our reading of each XML agrees with the plugin's own (`topology --json`).
func TestFixtureAgreesWithBinary(t *testing.T) {
	bin := binaryPath()
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no plugin binary at %s (set RDP_BINARY)", bin)
	}
	for _, xml := range allXMLs() {
		agree(t, bin, xml)
	}
}

func agree(t *testing.T, bin, xml string) {
	out, err := exec.Command(bin, "topology", "--json", "--topology-xml", xml,
		"--log-level", "warn").Output()
	if err != nil {
		t.Fatalf("topology --json: %v", err)
	}
	var report struct {
		GPUs []struct {
			PCI  string `json:"pci"`
			NUMA *int   `json:"numa"`
		} `json:"gpus"`
		HCAs []struct {
			Name string `json:"name"`
			PCI  string `json:"pci"`
			NUMA *int   `json:"numa"`
		} `json:"hcas"`
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("topology --json: %v\n%s", err, out)
	}
	n, err := LoadNode(xml)
	if err != nil {
		t.Fatal(err)
	}
	var ours, theirs []string
	for _, g := range n.GPUs {
		ours = append(ours, "gpu "+g.PCI+" "+itoa(g.NUMA))
	}
	for _, h := range n.HCAs {
		ours = append(ours, "hca "+h.Name+" "+h.PCI+" "+itoa(h.NUMA))
	}
	for _, g := range report.GPUs {
		theirs = append(theirs, "gpu "+g.PCI+" "+itoaPtr(g.NUMA))
	}
	for _, h := range report.HCAs {
		theirs = append(theirs, "hca "+h.Name+" "+h.PCI+" "+itoaPtr(h.NUMA))
	}
	sort.Strings(ours)
	sort.Strings(theirs)
	if strings.Join(ours, "\n") != strings.Join(theirs, "\n") {
		t.Errorf("%s: harness:\n%s\nplugin:\n%s", filepath.Base(xml), strings.Join(ours, "\n"), strings.Join(theirs, "\n"))
	}
}

// Near (PIX or PXB, the quality replay's measure) agrees with the plugin's path classes
// (`topology --json`) for every HCA and GPU of every fixture.
func TestNearAgreesWithBinary(t *testing.T) {
	bin := binaryPath()
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no plugin binary at %s (set RDP_BINARY)", bin)
	}
	for _, xml := range allXMLs() {
		out, err := exec.Command(bin, "topology", "--json", "--topology-xml", xml, "--log-level", "warn").Output()
		if err != nil {
			t.Fatalf("%s: topology --json: %v", filepath.Base(xml), err)
		}
		var report struct {
			Paths map[string]map[string]string `json:"paths"` // HCA name -> GPU PCI -> class
		}
		if err := json.Unmarshal(out, &report); err != nil {
			t.Fatalf("%s: %v", filepath.Base(xml), err)
		}
		n, err := LoadNode(xml)
		if err != nil {
			t.Fatal(err)
		}
		pairs := 0
		for _, h := range n.HCAs {
			for _, g := range n.GPUs {
				class, ok := report.Paths[h.Name][g.PCI]
				if !ok {
					t.Errorf("%s: the plugin has no path from %s to %s", filepath.Base(xml), h.Name, g.PCI)
					continue
				}
				pairs++
				if want := class == "PIX" || class == "PXB"; Near(g, h) != want {
					t.Errorf("%s: %s to GPU %s is %s, Near says %v", filepath.Base(xml), h.Name, g.PCI, class, Near(g, h))
				}
			}
		}
		if pairs == 0 {
			t.Errorf("%s: no HCA-GPU pair compared", filepath.Base(xml))
		}
	}
}

// The Go layout and the plugin's `fixture` subcommand (SysfsFixture::AddTopology) write the
// same trees, so tests may use either.
func TestFixtureLayoutMatchesBinary(t *testing.T) {
	bin := binaryPath()
	if !BinaryWritesFixtures(bin) {
		t.Skipf("%s has no `fixture` subcommand", bin)
	}
	for _, xml := range allXMLs() {
		n, err := LoadNode(xml)
		if err != nil {
			t.Fatal(err)
		}
		goRoot, binRoot := filepath.Join(t.TempDir(), "go"), filepath.Join(t.TempDir(), "bin")
		if _, err := WriteSysfs(goRoot, n); err != nil {
			t.Fatal(err)
		}
		if _, err := WriteSysfsWithBinary(bin, binRoot, n); err != nil {
			t.Fatal(err)
		}
		a, b := treeListing(t, goRoot), treeListing(t, binRoot)
		if strings.Join(a, "\n") != strings.Join(b, "\n") {
			t.Errorf("%s: layouts differ\nonly in Go's: %v\nonly in the binary's: %v",
				filepath.Base(xml), Minus(a, b), Minus(b, a))
		}
	}
}

func treeListing(t *testing.T, root string) []string {
	var out []string
	err := filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := filepath.EvalSymlinks(path)
			trel, _ := filepath.Rel(root, target)
			out = append(out, rel+" -> "+trel)
		case info.IsDir():
			out = append(out, rel+"/")
		default:
			data, _ := os.ReadFile(path)
			out = append(out, rel+" = "+strings.TrimSpace(string(data)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func itoa(i int) string {
	if i < 0 {
		return "?"
	}
	return strconv.Itoa(i)
}

func itoaPtr(p *int) string {
	if p == nil {
		return "?"
	}
	return itoa(*p)
}

// The synthetic nodes are what test/data/gen_quality_nodes.py writes, with the shapes
// docs/allocator.md describes.
func TestQualityNodes(t *testing.T) {
	want := map[string][3]int{ // NUMA nodes, GPUs, HCAs
		"two-level-switches": {2, 16, 8}, "four-numa": {4, 16, 8}, "fewer-hcas-than-gpus": {2, 8, 4},
	}
	for _, f := range syntheticNodes {
		n, err := LoadNode(filepath.Join(repoRoot(), "test", "data", f+".xml"))
		if err != nil {
			t.Fatal(err)
		}
		if got := [3]int{len(n.NUMANodes), len(n.GPUs), len(n.HCAs)}; got != want[f] {
			t.Errorf("%s: NUMA nodes, GPUs, HCAs = %v, want %v", f, got, want[f])
		}
	}
	sameAsGenerator(t, "gen_quality_nodes.py", syntheticNodes)
}

// The node with roles (test/data/gen_roles_node.py) as its export holds it: 4 compute and 4
// storage functions (its VFs are laid out by `fixture --node dgx-roles` alone), read as the
// plugin reads it and laid out as the binary lays it out. Not among allXMLs: the DRA replay's
// claim counts are over the nodes there.
func TestRolesNode(t *testing.T) {
	xml := filepath.Join(repoRoot(), "test", "data", "dgx-roles.xml")
	n, err := LoadNode(xml)
	if err != nil {
		t.Fatal(err)
	}
	if got := [3]int{len(n.NUMANodes), len(n.GPUs), len(n.HCAs)}; got != [3]int{2, 8, 8} {
		t.Errorf("NUMA nodes, GPUs, HCAs = %v, want [2 8 8]", got)
	}
	ethernet := 0
	for _, h := range n.HCAs {
		if h.Ethernet() {
			ethernet++
		}
	}
	if ethernet != 4 {
		t.Errorf("%d Ethernet functions, want 4", ethernet)
	}
	sameAsGenerator(t, "gen_roles_node.py", []string{"dgx-roles"})
	bin := binaryPath()
	if !BinaryWritesFixtures(bin) {
		t.Skipf("%s has no `fixture` subcommand", bin)
	}
	agree(t, bin, xml)
	goRoot, binRoot := filepath.Join(t.TempDir(), "go"), filepath.Join(t.TempDir(), "bin")
	if _, err := WriteSysfs(goRoot, n); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteSysfsWithBinary(bin, binRoot, n); err != nil {
		t.Fatal(err)
	}
	if a, b := treeListing(t, goRoot), treeListing(t, binRoot); strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Errorf("layouts differ\nonly in Go's: %v\nonly in the binary's: %v", Minus(a, b), Minus(b, a))
	}
}

// sameAsGenerator checks that test/data/<name>.xml is what the generator writes, for each name.
func sameAsGenerator(t *testing.T, generator string, names []string) {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3: generated XMLs not compared with the generator")
	}
	dir := t.TempDir()
	if out, err := exec.Command(python, filepath.Join(repoRoot(), "test", "data", generator), dir).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", generator, err, out)
	}
	for _, f := range names {
		committed, err1 := os.ReadFile(filepath.Join(repoRoot(), "test", "data", f+".xml"))
		generated, err2 := os.ReadFile(filepath.Join(dir, f+".xml"))
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v %v", f, err1, err2)
		}
		if string(committed) != string(generated) {
			t.Errorf("test/data/%s.xml differs from what %s writes: run it again", f, generator)
		}
	}
}

// The Grace-class nodes as the harness reads them: only the NUMA nodes with CPUs are the
// machine's (the GPU memory and MIG nodes are not), every device's NUMA node is its socket's
// CPU node, and devices that share bus:dev.fn 01:00.0 in different domains stay apart.
func TestGraceNodes(t *testing.T) {
	type want struct {
		cpuNodes, allNodes []int
		cpus               map[int]string
		gpus, hcas         map[string]int // PCI address -> NUMA node
	}
	wants := map[string]want{
		"gb200-tray": {[]int{0, 1}, []int{0, 1, 2, 3, 4, 5}, map[int]string{0: "0-71", 1: "72-143"},
			map[string]int{"0008:01:00.0": 0, "0009:01:00.0": 0, "0018:01:00.0": 1, "0019:01:00.0": 1},
			map[string]int{"0000:01:00.0": 0, "0002:01:00.0": 0, "0010:01:00.0": 1, "0012:01:00.0": 1}},
		"gh200": {[]int{0}, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, map[int]string{0: "0-71"},
			map[string]int{"0009:01:00.0": 0},
			map[string]int{"0000:01:00.0": 0, "0002:01:00.0": 0}},
		"power9-numa-0-8": {[]int{0, 8}, []int{0, 8}, map[int]string{0: "0-63", 8: "64-127"},
			map[string]int{"0004:01:00.0": 0, "0005:01:00.0": 0, "0034:01:00.0": 8, "0035:01:00.0": 8},
			map[string]int{"0003:01:00.0": 0, "0033:01:00.0": 8}},
	}
	for _, f := range graceNodes {
		n, err := LoadNode(filepath.Join(repoRoot(), "test", "data", f+".xml"))
		if err != nil {
			t.Fatal(err)
		}
		w := wants[f]
		if fmt.Sprint(n.NUMANodes) != fmt.Sprint(w.cpuNodes) {
			t.Errorf("%s: NUMA nodes with CPUs %v, want %v", f, n.NUMANodes, w.cpuNodes)
		}
		var all []int
		for _, m := range n.NUMA {
			all = append(all, m.ID)
			if m.HasCPUs != (w.cpus[m.ID] != "") || m.CPUs != w.cpus[m.ID] {
				t.Errorf("%s: NUMA node %d: %+v, want CPUs %q", f, m.ID, m, w.cpus[m.ID])
			}
		}
		if fmt.Sprint(all) != fmt.Sprint(w.allNodes) {
			t.Errorf("%s: NUMA nodes %v, want %v", f, all, w.allNodes)
		}
		got := map[string]int{}
		for _, g := range n.GPUs {
			got[g.PCI] = g.NUMA
			if g.PCIeRoot != "pci"+g.PCI[:4]+":00" || len(g.Bridges) != 1 {
				t.Errorf("%s: GPU %s under %s %v, want alone under its own root complex", f, g.PCI, g.PCIeRoot, g.Bridges)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(w.gpus) {
			t.Errorf("%s: GPUs' NUMA nodes %v, want %v", f, got, w.gpus)
		}
		got = map[string]int{}
		for _, h := range n.HCAs {
			got[h.PCI] = h.NUMA
			if h.PCIeRoot != "pci"+h.PCI[:4]+":00" {
				t.Errorf("%s: %s under %s", f, h.Name, h.PCIeRoot)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(w.hcas) {
			t.Errorf("%s: HCAs' NUMA nodes %v, want %v", f, got, w.hcas)
		}
	}
	sameAsGenerator(t, "gen_grace_nodes.py", graceNodes)
}
