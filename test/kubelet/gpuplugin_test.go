package kubelet

import (
	"path/filepath"
	"strings"
	"testing"
)

func loadNode(t *testing.T, name string) *Node {
	t.Helper()
	n, err := LoadNode(filepath.Join(repoRoot(), "test", "data", name+".xml"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func gpuIDs(n *Node) []string {
	var out []string
	for _, g := range n.GPUs {
		out = append(out, g.PCI)
	}
	return out
}

func without(ids []string, drop ...string) []string {
	var out []string
	for _, id := range ids {
		if !strings.Contains(strings.Join(drop, ","), id) {
			out = append(out, id)
		}
	}
	return out
}

// The GPU plugin's packing: best fit by NUMA node, PCIe root and switch; must-include kept.
func TestPackGPUs(t *testing.T) {
	dgx, twoLevel := loadNode(t, "dgx-h100-like"), loadNode(t, "two-level-switches")
	all := gpuIDs(dgx)
	cases := []struct {
		name                   string
		node                   *Node
		available, mustInclude []string
		size                   int
		want                   string
	}{
		{"a pair: one switch", dgx, all, nil, 2, "0000:18:00.0,0000:19:00.0"},
		{"one: the fullest NUMA node and switch that fit", dgx, without(all, "0000:18:00.0"), nil, 1, "0000:19:00.0"},
		{"three: a whole switch, then the next", dgx, all, nil, 3, "0000:18:00.0,0000:19:00.0,0000:3a:00.0"},
		{"beside must-include", dgx, all, []string{"0000:9d:00.0"}, 2, "0000:9d:00.0,0000:9e:00.0"},
		{"more than a NUMA node", dgx, all, nil, 6, "0000:18:00.0,0000:19:00.0,0000:3a:00.0,0000:3b:00.0,0000:9d:00.0,0000:9e:00.0"},
		{"unknown IDs never chosen", dgx, []string{"bogus", "0000:be:00.0"}, nil, 1, "0000:be:00.0"},
		{"two-level: a leaf switch", twoLevel, without(gpuIDs(twoLevel), "0000:15:00.0"), nil, 2, "0000:1a:00.0,0000:1b:00.0"},
		{"two-level: a top switch", twoLevel, gpuIDs(twoLevel), nil, 4, "0000:15:00.0,0000:16:00.0,0000:1a:00.0,0000:1b:00.0"},
	}
	for _, c := range cases {
		if got := strings.Join(PackGPUs(c.node, c.available, c.mustInclude, c.size), ","); got != c.want {
			t.Errorf("%s: PackGPUs = %s, want %s", c.name, got, c.want)
		}
	}
}
