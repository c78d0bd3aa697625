package kubelet

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// DRADriver is the driver name the DRA tests run the binary with.
const DRADriver = "rdma.example.com"

// draDriverBinary returns the plugin binary when it has the DRA driver (`dra prepare-local`), else
// skips the test.
func draDriverBinary(t *testing.T) string {
	t.Helper()
	bin := binaryPath()
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no plugin binary at %s (set RDP_BINARY)", bin)
	}
	out, _ := exec.Command(bin, "dra", "prepare-local", "--help").CombinedOutput()
	if !strings.Contains(string(out), "--claim-uid") {
		t.Skipf("%s has no `dra prepare-local`: build the DRA driver first", bin)
	}
	return bin
}

// DRADeviceName is the name of an HCA in our ResourceSlices: "hca-" and its PCI address with
// ':' and '.' as '-' (dra/devices.h).
func DRADeviceName(h HCA) string {
	return "hca-" + strings.NewReplacer(":", "-", ".", "-").Replace(h.PCI)
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
	return []string{
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
