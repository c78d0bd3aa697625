package kubelet

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// DRADriver is the driver name the DRA tests run the binary with.
const DRADriver = "rdma.example.com"

// draBinary returns the plugin binary; a binary without the DRA driver (`dra prepare-local`,
// `dra slices`) fails the test.
func draBinary(t *testing.T) string {
	t.Helper()
	bin := binaryPath()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no plugin binary at %s (set RDP_BINARY)", bin)
	}
	for sub, flag := range map[string]string{"prepare-local": "--claim-uid", "slices": "--driver-name"} {
		out, _ := exec.Command(bin, "dra", sub, "--help").CombinedOutput()
		if !strings.Contains(string(out), flag) {
			t.Fatalf("%s has no `dra %s`: build the DRA driver first", bin, sub)
		}
	}
	return bin
}

// usableHCAs returns the fixture's HCAs whose ports are all ACTIVE: InfiniBand ones, then RoCE.
func usableHCAs(n *Node) (ib, roce []HCA) {
	for _, h := range n.HCAs {
		ok := true
		for _, p := range h.Ports {
			if h.PortState[p] != "ACTIVE" {
				ok = false
			}
		}
		if !ok {
			continue
		}
		if h.Ethernet() {
			roce = append(roce, h)
		} else {
			ib = append(ib, h)
		}
	}
	return ib, roce
}

// draArgs are the flags every DRA run of the binary gets on the fixture node.
func draArgs(kubeletDir, cdiRoot string, sys *Sysfs, n *Node) []string {
	// No API server here: one that is never there (port 1). The driver serves the kubelet
	// regardless; claims not in its checkpoint fail with an error naming the API server.
	kubeconfig := kubeletDir + ".kubeconfig.json"
	_ = os.WriteFile(kubeconfig, []byte(`{"apiVersion":"v1","kind":"Config","current-context":"x",`+
		`"clusters":[{"name":"c","cluster":{"server":"https://127.0.0.1:1"}}],`+
		`"users":[{"name":"u","user":{"token":"t"}}],`+
		`"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}]}`), 0o600)
	return []string{
		"--kubeconfig", kubeconfig,
		"--kubelet-dir", kubeletDir,
		"--cdi-root", cdiRoot,
		"--driver-name", DRADriver,
		"--node-name", "fixture-node",
		"--sysfs-root", sys.Root,
		"--dev-root", sys.Root,
		"--topology-xml", n.XML,
		"--log-level", "debug",
	}
}

// draDriverFixture is what the driver tests of this package start from: the plugin binary, a short temp
// dir, and the bundled fixture node laid out as sysfs under <dir>/node.
func draDriverFixture(t *testing.T) (bin, dir string, n *Node, sys *Sysfs) {
	t.Helper()
	bin = draBinary(t)
	dir = shortTempDir(t)
	n, err := LoadNode(fixtureXML())
	if err != nil {
		t.Fatal(err)
	}
	sys, err = WriteSysfs(filepath.Join(dir, "node"), n)
	if err != nil {
		t.Fatal(err)
	}
	return bin, dir, n, sys
}
