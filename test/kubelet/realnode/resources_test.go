package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

const storageResource = "rdma/storage"

// twoResources is the chart's values for the node with roles: the compute rails as rdma/hca, the
// storage NICs as rdma/storage (docs/config.md, "In the chart").
const twoResources = `rdmaResources:
  - name: rdma/hca
    selector: {linkLayers: [InfiniBand]}
  - name: rdma/storage
    selector: {linkLayers: [Ethernet]}
`

// The node with roles (`rdma-device-plugin fixture --node dgx-roles`, test/data/README.md): its
// compute InfiniBand HCAs, its storage Ethernet functions and the two SR-IOV VFs of mlx5_0.
var (
	rolesCompute = []string{"mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5"}
	rolesStorage = []string{"mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7"}
	rolesVFs     = []string{"mlx5_8", "mlx5_9"}
)

// TestRealNodeResources: the chart with two resources from rdmaResources on the node with roles,
// through each door once. Device plugin (exclusive): the node's allocatable is rdma/hca 4 and
// rdma/storage 4 (the VFs in neither); a pod asking rdma/hca: 2 sees exactly two compute HCAs'
// device nodes and one asking rdma/storage: 1 exactly one storage HCA's, and neither can use
// the other role's. DRA: the chart's generated DeviceClasses (rdma-hca.<driver>,
// rdma-storage.<driver>) and their extended-resource classes allocate the same split, and each
// pod sees exactly what was allocated to it. No variable is checked: each resource's variables
// are their own contract (docs/config.md).
func TestRealNodeResources(t *testing.T) {
	values := filepath.Join(t.TempDir(), "two-resources.yaml")
	if err := os.WriteFile(values, []byte(twoResources), 0o644); err != nil {
		t.Fatal(err)
	}
	resources := []string{"--named-node", "dgx-roles", "--values", values}

	t.Run("DevicePlugin", func(t *testing.T) {
		c := up(t, append([]string{"--driver", "deviceplugin", "--mode", "exclusive"}, resources...)...)
		c.checkRoles()
		for _, r := range []string{hcaResource, storageResource} {
			eventually(t, podTimeout, "allocatable "+r, func() (bool, string) {
				n := c.allocatable(v1.ResourceName(r))
				return n > 0, fmt.Sprint(n)
			})
		}
		if h, s := c.allocatable(hcaResource), c.allocatable(storageResource); h != 4 || s != 4 {
			t.Errorf("allocatable rdma/hca %d, rdma/storage %d; want 4 and 4 (the VFs %v in neither)", h, s, rolesVFs)
		}
		c.create(
			workloadPod("compute", nil, ctr{name: "c", limits: map[string]int64{hcaResource: 2}}),
			workloadPod("storage", nil, ctr{name: "c", limits: map[string]int64{storageResource: 1}}))
		c.waitRunning(podTimeout, "compute", "storage")
		c.checkRole("rdma/hca: 2", "compute", rolesCompute, 2)
		c.checkRole("rdma/storage: 1", "storage", rolesStorage, 1)
	})

	t.Run("DRA", func(t *testing.T) {
		c := up(t, append([]string{"--driver", "dra", "--mode", "exclusive"}, resources...)...)
		c.checkRoles()
		c.claim("compute", request("hca", "rdma-hca."+draDriver, 2))
		c.claim("storage", request("hca", "rdma-storage."+draDriver, 1))
		c.create(
			claimPod("claim-compute", map[string][]string{"c": {"compute"}}),
			claimPod("claim-storage", map[string][]string{"c": {"storage"}}),
			workloadPod("ext-compute", nil, ctr{name: "c", limits: map[string]int64{hcaResource: 2}}),
			workloadPod("ext-storage", nil, ctr{name: "c", limits: map[string]int64{storageResource: 1}}))
		c.waitRunning(podTimeout, "claim-compute", "claim-storage", "ext-compute", "ext-storage")
		for _, x := range []struct {
			claim string
			role  []string
			n     int
		}{{"compute", rolesCompute, 2}, {"storage", rolesStorage, 1}} {
			got := c.checkRole("claim on the "+x.claim+" class", "claim-"+x.claim, x.role, x.n)
			if want := c.allocated(x.claim, "hca"); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("claim-%s sees %v, the scheduler allocated %v", x.claim, got, want)
			}
		}
		compute := append(c.checkRole("rdma/hca: 2 (extended resource)", "ext-compute", rolesCompute, 2), c.allocated("compute", "hca")...)
		if got := sortStrings(compute); strings.Join(got, ",") != strings.Join(rolesCompute, ",") {
			t.Errorf("the two compute pods hold %v between them, want each compute HCA once: %v", got, rolesCompute)
		}
		c.checkRole("rdma/storage: 1 (extended resource)", "ext-storage", rolesStorage, 1)
	})
}

// checkRoles: the node up is the node with roles: its compute HCAs' ports InfiniBand, its
// storage HCAs' Ethernet, its VFs there (so that a resource leaving them out is seen to).
func (c *cluster) checkRoles() {
	c.t.Helper()
	for _, x := range []struct {
		hcas []string
		link string
	}{{rolesCompute, "InfiniBand"}, {rolesStorage, "Ethernet"}, {rolesVFs, ""}} {
		for _, h := range x.hcas {
			got := c.sysfs("class", "infiniband", h, "ports", "1", "link_layer")
			if x.link != "" && got != x.link {
				c.t.Fatalf("the node's %s has link layer %s, want %s (not the node with roles?)", h, got, x.link)
			}
		}
	}
	if usable := c.usableHCAs(); len(usable) != len(rolesCompute)+len(rolesStorage)+len(rolesVFs) {
		c.t.Fatalf("the node has the uverbs nodes of %v, want its 8 HCAs and 2 VFs", usable)
	}
}

// checkRole: pod's container c sees the device nodes of exactly n HCAs, all of role
// (checkDevices), and cannot use a node it makes for an HCA of the other role. It returns the
// HCAs seen, sorted.
func (c *cluster) checkRole(what, pod string, role []string, n int) []string {
	c.t.Helper()
	in := c.inside(pod, "c")
	seen := c.hcasSeen(in)
	if len(seen) != n || len(kubelet.Minus(seen, role)) > 0 {
		c.t.Errorf("%s: pod %s sees the nodes of %v, want %d of %v", what, pod, seen, n, role)
	}
	c.checkDevices(what, in, seen)
	others := kubelet.Minus(append(append([]string{}, rolesCompute...), rolesStorage...), role)
	c.checkMknodDenied(what, pod, "c", others[0])
	c.t.Logf("%s: pod %s sees %v: %s", what, pod, seen, describe(in))
	return seen
}
