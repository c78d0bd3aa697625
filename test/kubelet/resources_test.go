package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ResourceStorage is the second resource of twoResources: the storage NICs.
const ResourceStorage = "rdma/storage"

// twoResources is the --config of the node with roles: the compute rails and the storage NICs,
// each a resource of its own (docs/config.md).
const twoResources = `resources:
  - name: rdma/hca
    selector:
      linkLayers: [InfiniBand]
  - name: rdma/storage
    selector:
      linkLayers: [Ethernet]
`

// One exclusive `serve --config` of two resources on the node with roles (dgx-roles: 4 compute
// InfiniBand HCAs, each on a PCIe switch with 2 GPUs, 2 per NUMA node; 4 Ethernet storage
// functions, 2 per NUMA node; 2 VFs of the first compute HCA), through the kubelet's device
// manager and Topology Manager: both resources register from the one process, each lists exactly
// its NICs with their NUMA nodes (the VFs in neither), and the Topology Manager aligns each: 3
// compute HCAs are refused under single-numa-node (no NUMA node holds them) and admitted under
// restricted (their narrowest hint), a pod of 2 compute HCAs + 4 GPUs gets them on one NUMA node,
// a pod of 1 storage NIC + 1 GPU gets the NIC on its GPU's node, and a container holding both
// resources and a GPU gets all three on one. The runtime is handed exactly each container's
// NICs' device files.
func TestConformanceTwoResources(t *testing.T) {
	for _, policy := range []string{"single-numa-node", "restricted"} {
		t.Run(policy, func(t *testing.T) {
			if !Isolate(t) {
				return
			}
			e := NewEnv(t, EnvOptions{Policy: policy, Scope: "container", NamedNode: "dgx-roles"})
			config := filepath.Join(e.Dir, "resources.yaml")
			if err := os.WriteFile(config, []byte(twoResources), 0o644); err != nil {
				t.Fatal(err)
			}
			e.StartPlugin("exclusive", "--config", config)
			compute, storage := e.Node.byLinkLayer()
			if len(compute) != 4 || len(storage) != 4 {
				t.Fatalf("dgx-roles: %d compute and %d storage HCAs, want 4 and 4", len(compute), len(storage))
			}
			e.WaitCapacity(ResourceHCA, 4, 4, 15*time.Second)
			e.WaitCapacity(ResourceStorage, 4, 4, 15*time.Second)
			for _, r := range []string{ResourceHCA, ResourceStorage} {
				if err := e.Plugin.WaitLog("Registered device plugin with Kubelet: "+r, 1, 5*time.Second); err != nil {
					t.Error(err)
				}
			}
			// The node holds 10 RDMA devices (the VFs among them); the kubelet sees 4 + 4.
			if entries, err := os.ReadDir(filepath.Join(e.Sys.Root, "sys", "class", "infiniband")); err != nil || len(entries) != 10 {
				t.Errorf("the laid-out dgx-roles has %d RDMA devices (%v), want 10 with its VFs", len(entries), err)
			}
			all := e.Kubelet.DM.GetAllocatableDevices(klog.FromContext(e.Kubelet.Context()))
			e.checkListed(ResourceHCA, all[ResourceHCA], compute)
			e.checkListed(ResourceStorage, all[ResourceStorage], storage)

			// 3 compute HCAs span both NUMA nodes (2 each): single-numa-node refuses them; for
			// restricted that narrowest hint is the preferred one, so it admits them.
			hca3 := NewPod("hca3", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 3}})
			if a := e.Kubelet.Admit(hca3); policy == "single-numa-node" && (a.Admit || a.Reason != "TopologyAffinityError") {
				t.Errorf("3 compute HCAs under %s: admit=%v reason=%q, want TopologyAffinityError", policy, a.Admit, a.Reason)
			} else if policy == "restricted" {
				if !a.Admit {
					t.Errorf("3 compute HCAs under restricted: rejected: %s: %s", a.Reason, a.Message)
				}
				e.Kubelet.RemovePod(hca3)
			}
			e.admitAligned(NewPod("compute", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 4}}),
				map[string][]HCA{ResourceHCA: compute})
			e.admitAligned(NewPod("storage", Ctr{Name: "c", Limits: map[string]int64{ResourceStorage: 1, GPUResource: 1}}),
				map[string][]HCA{ResourceStorage: storage})
			e.admitAligned(NewPod("both", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1, ResourceStorage: 1,
				GPUResource: 1}}), map[string][]HCA{ResourceHCA: compute, ResourceStorage: storage})
		})
	}
	t.Run("one-container-both", func(t *testing.T) {
		if !Isolate(t) {
			return
		}
		e := NewEnv(t, EnvOptions{Scope: "container", NamedNode: "dgx-roles"})
		e.checkOneContainerBoth()
	})
}

// checkOneContainerBoth serves twoResources with an allocation dir and admits a container asking
// for one compute and one storage NIC. The kubelet's device manager merges the two Allocate
// answers keeping the first value of each variable name and mount path it meets, walking the
// container's resources in a Go map's order (a new order on every call), and logs a conflict:
// the merge is the same whatever the order, with no conflict logged; the plain variables and
// /etc/rdma/allocation.json name the compute NIC only, and each resource's own variables and
// file name its NIC (docs/server.md, "A container holding several resources").
func (e *Env) checkOneContainerBoth() {
	t := e.T
	config := filepath.Join(e.Dir, "resources.yaml")
	if err := os.WriteFile(config, []byte(twoResources), 0o644); err != nil {
		t.Fatal(err)
	}
	allocations := mkdir(t, filepath.Join(e.Dir, "allocations"))
	e.StartPlugin("exclusive", "--config", config, "--allocation-dir", allocations)
	compute, storage := e.Node.byLinkLayer()
	e.WaitCapacity(ResourceHCA, 4, 4, 15*time.Second)
	e.WaitCapacity(ResourceStorage, 4, 4, 15*time.Second)
	pod := NewPod("both", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1, ResourceStorage: 1}})
	e.MustAdmit(pod)
	c, s := e.onlyDevice(pod, ResourceHCA, compute), e.onlyDevice(pod, ResourceStorage, storage)
	want := map[string]string{
		"NCCL_IB_HCA": "=" + c.Name, "RDMA_HCA_NAMES": c.Name, "RDMA_HCA_PCI": c.PCI,
		"NCCL_IB_HCA_RDMA_HCA": "=" + c.Name, "RDMA_HCA_NAMES_RDMA_HCA": c.Name,
		"RDMA_HCA_NAMES_RDMA_STORAGE": s.Name, "RDMA_HCA_PCI_RDMA_STORAGE": s.PCI,
	}
	files := map[string]HCA{"/etc/rdma/allocation.json": c, "/etc/rdma/rdma_hca/allocation.json": c,
		"/etc/rdma/rdma_storage/allocation.json": s}
	// Two resources: 16 calls all walk them in one order with a chance of 2^-15.
	for i := 0; i < 16; i++ {
		opts, err := e.Kubelet.DM.GetDeviceRunContainerOptions(e.Kubelet.Context(), pod, &pod.Spec.Containers[0])
		if err != nil {
			t.Fatal(err)
		}
		envs := map[string]string{}
		for _, v := range opts.Envs {
			envs[v.Name] = v.Value
		}
		for name, value := range want {
			if envs[name] != value {
				t.Errorf("call %d: the container gets %s=%q, want %q (all: %v)", i, name, envs[name], value, envs)
			}
		}
		mounts := map[string]string{}
		for _, m := range opts.Mounts {
			mounts[m.ContainerPath] = m.HostPath
		}
		if len(mounts) != len(files) {
			t.Errorf("call %d: mounts %v, want exactly %d: those of %v", i, mounts, len(files), files)
		}
		for path, h := range files {
			data, err := os.ReadFile(mounts[path])
			if err != nil {
				t.Errorf("call %d: %s: %v", i, path, err)
				continue
			}
			for _, other := range append(append([]HCA{}, compute...), storage...) {
				if has := strings.Contains(string(data), fmt.Sprintf("%q", other.Name)); has != (other.Name == h.Name) {
					t.Errorf("call %d: %s names %s: %v; it describes %s only:\n%s", i, path, other.Name, has, h.Name, data)
				}
			}
		}
	}
	log, err := os.ReadFile(filepath.Join(e.Dir, "kubelet.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "conflicting") {
			t.Errorf("the kubelet logs a conflict: %s", line)
		}
	}
}

// onlyDevice is the one HCA of pool the container "c" of pod holds of resource; it fails the
// test otherwise.
func (e *Env) onlyDevice(pod *v1.Pod, resource string, pool []HCA) HCA {
	e.T.Helper()
	ids := e.Kubelet.Devices(pod, "c", resource)
	if len(ids) != 1 {
		e.T.Fatalf("%s: %s devices %v, want 1", pod.Name, resource, ids)
	}
	h, ok := hcaIn(pool, ids[0])
	if !ok {
		e.T.Fatalf("%s: %s device %s is none of that resource's HCAs", pod.Name, resource, ids[0])
	}
	return h
}

// byLinkLayer splits the node's HCAs into InfiniBand and Ethernet ones.
func (n *Node) byLinkLayer() (infiniband, ethernet []HCA) {
	for _, h := range n.HCAs {
		if h.Ethernet() {
			ethernet = append(ethernet, h)
		} else {
			infiniband = append(infiniband, h)
		}
	}
	return infiniband, ethernet
}

// checkListed fails the test unless the kubelet's devices of resource are exactly want, each
// with its HCA's NUMA node.
func (e *Env) checkListed(resource string, devs map[string]*pluginapi.Device, want []HCA) {
	e.T.Helper()
	var ids, wantIDs []string
	for id := range devs {
		ids = append(ids, id)
	}
	for _, h := range want {
		wantIDs = append(wantIDs, h.PCI)
		d, ok := devs[h.PCI]
		if ok && (len(d.GetTopology().GetNodes()) != 1 || int(d.GetTopology().GetNodes()[0].GetID()) != h.NUMA) {
			e.T.Errorf("%s: %s (%s) has topology %v, want NUMA %d", resource, h.PCI, h.Name, d.GetTopology(), h.NUMA)
		}
	}
	sort.Strings(ids)
	sort.Strings(wantIDs)
	if fmt.Sprint(ids) != fmt.Sprint(wantIDs) {
		e.T.Errorf("%s lists %v, want exactly %v", resource, ids, wantIDs)
	}
}

// admitAligned admits pod (one container "c") and fails the test unless each of our resources it
// asks for got that many devices of its own (pool: that resource's HCAs), all of them and the
// container's GPUs on one NUMA node, and the runtime is handed exactly those HCAs' device files
// and rdma_cm.
func (e *Env) admitAligned(pod *v1.Pod, pools map[string][]HCA) {
	e.T.Helper()
	e.MustAdmit(pod)
	limits := pod.Spec.Containers[0].Resources.Limits
	numa := map[int]bool{}
	for _, n := range e.numaOf(GPUResource, e.Kubelet.Devices(pod, "c", GPUResource)) {
		numa[n] = true
	}
	want := map[string]bool{"/dev/infiniband/rdma_cm": true}
	for resource, pool := range pools {
		ids := e.Kubelet.Devices(pod, "c", resource)
		if q := limits[v1.ResourceName(resource)]; int64(len(ids)) != q.Value() {
			e.T.Errorf("%s: %d %s devices %v, asked %d", pod.Name, len(ids), resource, ids, q.Value())
		}
		for _, id := range ids {
			h, ok := hcaIn(pool, id)
			if !ok {
				e.T.Errorf("%s: %s device %s is none of that resource's HCAs", pod.Name, resource, id)
				continue
			}
			numa[h.NUMA] = true
			for _, f := range e.Sys.DeviceFiles(h.Name) {
				want[f] = true
			}
		}
	}
	if len(numa) != 1 {
		e.T.Errorf("%s under %s: its HCAs and GPUs span NUMA nodes %v", pod.Name, e.Opts.Policy, sortedKeys(numa))
	}
	opts, err := e.Kubelet.DM.GetDeviceRunContainerOptions(e.Kubelet.Context(), pod, &pod.Spec.Containers[0])
	if err != nil {
		e.T.Fatal(err)
	}
	got := map[string]bool{}
	for _, d := range opts.Devices {
		got[d.PathInContainer] = true
	}
	if fmt.Sprint(sortedKeys(got)) != fmt.Sprint(sortedKeys(want)) {
		e.T.Errorf("%s: the runtime gets %v, want exactly %v", pod.Name, sortedKeys(got), sortedKeys(want))
	}
}

func hcaIn(pool []HCA, pci string) (HCA, bool) {
	for _, h := range pool {
		if h.PCI == pci {
			return h, true
		}
	}
	return HCA{}, false
}
