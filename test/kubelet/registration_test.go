package kubelet

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// The harness alone: the kubelet's managers come up, the GPU plugin registers with NUMA
// topology, and single-numa-node keeps a 4-GPU pod on one NUMA node. Needs no plugin binary.
func TestKubeletHarness(t *testing.T) {
	if !Isolate(t) {
		return
	}
	e := NewEnv(t, EnvOptions{Policy: "single-numa-node", Scope: "container"})
	pod := NewPod("gpus", Ctr{Name: "c", Limits: map[string]int64{GPUResource: 4}})
	e.MustAdmit(pod)
	gpus := e.Kubelet.Devices(pod, "c", GPUResource)
	if nodes := e.numaOf(GPUResource, gpus); len(nodes) != 1 {
		t.Errorf("4 GPUs under single-numa-node span NUMA nodes %v: %v", nodes, gpus)
	}
	big := NewPod("too-many-gpus", Ctr{Name: "c", Limits: map[string]int64{GPUResource: 5}})
	if a := e.Kubelet.Admit(big); a.Admit || a.Reason != "TopologyAffinityError" {
		t.Errorf("5 GPUs under single-numa-node: admit=%v reason=%q, want TopologyAffinityError", a.Admit, a.Reason)
	}
}

// numaOf returns the sorted NUMA nodes of devices as the kubelet knows them.
func (e *Env) numaOf(resource string, ids []string) []int {
	all := e.Kubelet.DM.GetAllocatableDevices(klog.FromContext(e.Kubelet.Context()))[resource]
	set := map[int]bool{}
	for _, id := range ids {
		d, ok := all[id]
		if !ok || d.GetTopology() == nil || len(d.GetTopology().GetNodes()) == 0 {
			set[-1] = true
			continue
		}
		for _, n := range d.GetTopology().GetNodes() {
			set[int(n.GetID())] = true
		}
	}
	return sortedKeys(set)
}

// Shared mode advertises --shared-devices units (1000) without topology; exclusive mode one
// device per HCA, ID = PCI address, each with its NUMA node.
func TestRegistration(t *testing.T) {
	for _, mode := range []string{"shared", "exclusive"} {
		t.Run(mode, func(t *testing.T) {
			if !Isolate(t) {
				return
			}
			e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: mode})
			if err := e.Plugin.WaitLog("Registered device plugin with Kubelet", 1, 5*time.Second); err != nil {
				t.Error(err)
			}
			if mode == "exclusive" {
				if err := e.Plugin.WaitLog("hca-exclusive mode", 1, time.Second); err != nil {
					t.Error(err)
				}
			}
			for _, h := range e.Node.HCAs {
				if e.Plugin.Count("discovered RDMA device: "+h.Name+" (PCI="+h.PCI) == 0 {
					t.Errorf("no `discovered RDMA device: %s (PCI=%s, ...` line", h.Name, h.PCI)
				}
			}
			devs := e.Kubelet.DM.GetAllocatableDevices(klog.FromContext(e.Kubelet.Context()))[ResourceHCA]
			if mode == "shared" {
				if len(devs) != 1000 {
					t.Errorf("%d shared devices, want 1000", len(devs))
				}
				for id, d := range devs {
					if d.GetTopology() != nil {
						t.Errorf("shared device %s has topology %v, want none", id, d.GetTopology())
						break
					}
				}
				return
			}
			if len(devs) != len(e.Node.HCAs) {
				t.Errorf("%d exclusive devices, want %d", len(devs), len(e.Node.HCAs))
			}
			for _, h := range e.Node.HCAs {
				d, ok := devs[h.PCI]
				if !ok {
					t.Errorf("no device with ID %s (%s)", h.PCI, h.Name)
					continue
				}
				nodes := d.GetTopology().GetNodes()
				if len(nodes) != 1 || int(nodes[0].GetID()) != h.NUMA {
					t.Errorf("%s topology %v, want NUMA %d", h.PCI, d.GetTopology(), h.NUMA)
				}
			}
		})
	}
}

// GetDeviceRunContainerOptions (what the kubelet hands the runtime) carries our DeviceSpecs
// and envs: exclusive mode the chosen HCAs' uverbs/umad/issm and rdma_cm, NCCL_IB_HCA in
// exact-match form; shared mode every HCA's.
func TestRunContainerOptions(t *testing.T) {
	for _, mode := range []string{"exclusive", "shared"} {
		t.Run(mode, func(t *testing.T) {
			if !Isolate(t) {
				return
			}
			e := NewEnv(t, EnvOptions{Policy: "best-effort", Scope: "container", Mode: mode})
			pod := NewPod("nccl", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 2}})
			e.MustAdmit(pod)
			opts, err := e.Kubelet.DM.GetDeviceRunContainerOptions(e.Kubelet.Context(), pod, &pod.Spec.Containers[0])
			if err != nil {
				t.Fatal(err)
			}
			var hcas []HCA
			if mode == "exclusive" {
				for _, id := range e.Kubelet.Devices(pod, "c", ResourceHCA) {
					h, ok := e.Node.HCAByPCI(id)
					if !ok {
						t.Fatalf("allocated ID %s is no HCA", id)
					}
					hcas = append(hcas, h)
				}
			} else {
				hcas = e.Node.HCAs
			}
			want := map[string]bool{"/dev/infiniband/rdma_cm": true}
			var names []string
			for _, h := range hcas {
				for _, f := range e.Sys.DeviceFiles(h.Name) {
					want[f] = true
				}
				names = append(names, h.Name)
			}
			got := map[string]bool{}
			for _, d := range opts.Devices {
				got[d.PathInContainer] = true
				if d.PathOnHost != d.PathInContainer || d.Permissions != "rw" {
					t.Errorf("device %+v: want host path = container path, permissions rw", d)
				}
			}
			if fmt.Sprint(sortedKeys(got)) != fmt.Sprint(sortedKeys(want)) {
				t.Errorf("devices %v\nwant     %v", sortedKeys(got), sortedKeys(want))
			}
			envs := map[string]string{}
			for _, ev := range opts.Envs {
				envs[ev.Name] = ev.Value
			}
			nccl := envs["NCCL_IB_HCA"]
			if !strings.HasPrefix(nccl, "=") {
				t.Errorf("NCCL_IB_HCA=%q: want the exact-match form =name,name", nccl)
			}
			gotNames := strings.Split(strings.TrimPrefix(nccl, "="), ",")
			sort.Strings(gotNames)
			sort.Strings(names)
			if fmt.Sprint(gotNames) != fmt.Sprint(names) {
				t.Errorf("NCCL_IB_HCA=%q, want the HCAs %v", nccl, names)
			}
			for _, k := range []string{"RDMA_HCA_NAMES", "RDMA_HCA_PCI"} {
				if envs[k] == "" {
					t.Errorf("no %s in %v", k, envs)
				}
			}
			if envs["NVIDIA_VISIBLE_DEVICES"] == "" {
				t.Errorf("the GPU plugin's envs were lost: %v", envs)
			}
		})
	}
}

// sortedKeys is the keys of a set, sorted.
func sortedKeys[K cmp.Ordered](m map[K]bool) []K { return slices.Sorted(maps.Keys(m)) }

// A port going DOWN makes that HCA Unhealthy: allocatable drops, capacity stays; back ACTIVE,
// allocatable returns. The plugin polls every 200 ms here (two intervals promised). Also: an
// HCA whose uverbs char device is missing is Unhealthy; shared mode stays Healthy while any
// HCA is, and turns Unhealthy when none is.
func TestPortDown(t *testing.T) {
	t.Run("exclusive", func(t *testing.T) {
		if !Isolate(t) {
			return
		}
		e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "exclusive"})
		n := int64(len(e.Node.HCAs))
		h := e.Node.HCAs[3]
		if err := e.Sys.SetPortState(h.Name, h.Ports[0], "DOWN"); err != nil {
			t.Fatal(err)
		}
		e.WaitCapacity(ResourceHCA, n, n-1, 5*time.Second)
		pod := NewPod("while-down", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: n - 1}})
		e.MustAdmit(pod)
		for _, id := range e.Kubelet.Devices(pod, "c", ResourceHCA) {
			if id == h.PCI {
				t.Errorf("the DOWN HCA %s (%s) was allocated", h.Name, h.PCI)
			}
		}
		if err := e.Sys.SetPortState(h.Name, h.Ports[0], "ACTIVE"); err != nil {
			t.Fatal(err)
		}
		e.WaitCapacity(ResourceHCA, n, n, 5*time.Second)
	})
	t.Run("uverbs_missing", func(t *testing.T) {
		if !Isolate(t) {
			return
		}
		e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "exclusive"})
		n := int64(len(e.Node.HCAs))
		h := e.Node.HCAs[7]
		dev := filepath.Join(e.Sys.Root, e.Sys.DeviceFiles(h.Name)[0])
		if err := os.Remove(dev); err != nil {
			t.Fatal(err)
		}
		e.WaitCapacity(ResourceHCA, n, n-1, 5*time.Second)
		if err := os.WriteFile(dev, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		e.WaitCapacity(ResourceHCA, n, n, 5*time.Second)
	})
	t.Run("shared_all_down", func(t *testing.T) {
		if !Isolate(t) {
			return
		}
		e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "shared"})
		for i, h := range e.Node.HCAs {
			if err := e.Sys.SetPortState(h.Name, h.Ports[0], "DOWN"); err != nil {
				t.Fatal(err)
			}
			if i == 0 { // one HCA down: the shared units stay Healthy
				e.WaitCapacity(ResourceHCA, 1000, 1000, 5*time.Second)
			}
		}
		e.WaitCapacity(ResourceHCA, 1000, 0, 5*time.Second)
		h := e.Node.HCAs[2]
		if err := e.Sys.SetPortState(h.Name, h.Ports[0], "ACTIVE"); err != nil {
			t.Fatal(err)
		}
		e.WaitCapacity(ResourceHCA, 1000, 1000, 5*time.Second)
		pod := NewPod("one-up", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1}})
		e.MustAdmit(pod)
		if names := e.ncclHCAs(pod); len(names) != 1 || names[0] != h.Name {
			t.Logf("with only %s up, a shared pod got NCCL_IB_HCA %v", h.Name, names)
		}
	})
}

// Real machines' exports with one HCA: exclusive mode registers it with its NUMA node, and
// single-numa-node puts a 1 GPU + 1 HCA pod on that node.
func TestOtherNodes(t *testing.T) {
	for _, f := range otherNodes {
		t.Run(strings.TrimSuffix(f, ".xml"), func(t *testing.T) {
			if !Isolate(t) {
				return
			}
			e := NewEnv(t, EnvOptions{Policy: "single-numa-node", Mode: "exclusive",
				XML: filepath.Join(repoRoot(), "test", "data", f)})
			h := e.Node.HCAs[0]
			devs := e.Kubelet.DM.GetAllocatableDevices(klog.FromContext(e.Kubelet.Context()))[ResourceHCA]
			if d, ok := devs[h.PCI]; !ok || len(d.GetTopology().GetNodes()) != 1 ||
				int(d.GetTopology().GetNodes()[0].GetID()) != h.NUMA {
				t.Fatalf("%s: devices %v, want %s on NUMA %d", f, devs, h.PCI, h.NUMA)
			}
			pod := NewPod("pair", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1, GPUResource: 1}})
			e.MustAdmit(pod)
			gpus := e.Kubelet.Devices(pod, "c", GPUResource)
			if nodes := e.numaOf(GPUResource, gpus); len(nodes) != 1 || nodes[0] != h.NUMA {
				t.Errorf("GPU %v on NUMA %v, the HCA on %d", gpus, nodes, h.NUMA)
			}
			if names := e.ncclHCAs(pod); len(names) != 1 || names[0] != h.Name {
				t.Errorf("NCCL_IB_HCA %v, want %s", names, h.Name)
			}
		})
	}
}

// "TopologyInfo for every HCA or for none": a node where one HCA's NUMA node is unknown (the
// dgx-h100-like export with mlx5_bond_0's host bridge moved up to the Machine, so it belongs to
// no NUMA node) lists every HCA without topology. single-numa-node then has no HCA hints, and
// admits 6 HCAs, which no single NUMA node holds, instead of failing everything.
func TestUnknownNUMA(t *testing.T) {
	if !Isolate(t) {
		return
	}
	data, err := os.ReadFile(fixtureXML())
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, `      <object type="Bridge" gp_index="90"`)
	end := strings.Index(text[start:], "\n      </object>\n")
	machineEnd := strings.LastIndex(text, "  </object>\n")
	if start < 0 || end < 0 || machineEnd < start {
		t.Fatal("dgx-h100-like.xml is not laid out as this test expects")
	}
	end += start + len("\n      </object>\n")
	bridge := text[start:end]
	moved := text[:start] + text[end:]
	machineEnd = strings.LastIndex(moved, "  </object>\n")
	moved = moved[:machineEnd] + bridge + moved[machineEnd:]
	xml := filepath.Join(t.TempDir(), "dgx-h100-like-bond-no-numa.xml")
	if err := os.WriteFile(xml, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := LoadNode(xml)
	if err != nil {
		t.Fatal(err)
	}
	if bond, _ := n.HCAByPCI("0000:c9:00.0"); bond.NUMA != -1 {
		t.Fatalf("the edited export still puts mlx5_bond_0 on NUMA %d", bond.NUMA)
	}
	e := NewEnv(t, EnvOptions{Policy: "single-numa-node", Mode: "exclusive", XML: xml})
	devs := e.Kubelet.DM.GetAllocatableDevices(klog.FromContext(e.Kubelet.Context()))[ResourceHCA]
	for id, d := range devs {
		if d.GetTopology() != nil {
			t.Errorf("%s has topology %v beside an HCA of unknown NUMA node", id, d.GetTopology())
		}
	}
	e.MustAdmit(NewPod("hca6", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 6}}))
}
