package kubelet

import (
	"fmt"
	"path/filepath"
	"testing"

	"k8s.io/klog/v2"
)

// The Grace-class nodes (test/data/gen_grace_nodes.py) through the kubelet's own managers: every
// HCA registers with its socket's CPU NUMA node (never a CPU-less node of GPU memory), a pod of
// 1 GPU + 1 HCA under single-numa-node gets both on one socket, and with no Topology Manager
// (policy none) our GetPreferredAllocation, knowing the container's GPU, answers an HCA on the
// GPU's socket: on a GB200 tray every HCA-GPU pair is NODE or SYS, and only NUMA tells them apart.
func TestGraceNodesKubelet(t *testing.T) {
	for _, node := range graceNodes {
		xml := filepath.Join(repoRoot(), "test", "data", node+".xml")
		t.Run(node+"/topology", func(t *testing.T) {
			if !Isolate(t) {
				return
			}
			e := NewEnv(t, EnvOptions{Policy: "single-numa-node", Mode: "exclusive", XML: xml})
			devs := e.Kubelet.DM.GetAllocatableDevices(klog.FromContext(e.Kubelet.Context()))[ResourceHCA]
			for _, h := range e.Node.HCAs {
				d, ok := devs[h.PCI]
				if !ok || len(d.GetTopology().GetNodes()) != 1 || int(d.GetTopology().GetNodes()[0].GetID()) != h.NUMA {
					t.Errorf("%s (%s): registered as %v, want NUMA node %d", h.Name, h.PCI, d, h.NUMA)
				}
			}
			for i := 0; i < len(e.Node.GPUs) && i < len(e.Node.HCAs); i++ {
				pod := NewPod(fmt.Sprintf("pair%d", i), Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1, GPUResource: 1}})
				e.MustAdmit(pod)
				gpus := e.Kubelet.Devices(pod, "c", GPUResource)
				hcas := e.Kubelet.Devices(pod, "c", ResourceHCA)
				g, h := e.numaOf(GPUResource, gpus), e.numaOf(ResourceHCA, hcas)
				if len(g) != 1 || len(h) != 1 || g[0] != h[0] {
					t.Errorf("%s: GPU %v on NUMA %v, HCA %v on %v", pod.Name, gpus, g, hcas, h)
				}
				if len(g) == 1 {
					found := false
					for _, n := range e.Node.NUMANodes {
						found = found || n == g[0]
					}
					if !found {
						t.Errorf("%s: NUMA node %d is not one with CPUs %v", pod.Name, g[0], e.Node.NUMANodes)
					}
				}
			}
		})
		t.Run(node+"/gpu-context", func(t *testing.T) {
			if !Isolate(t) {
				return
			}
			e := NewEnv(t, EnvOptions{Policy: "none", Mode: "exclusive", Tap: true, XML: xml})
			gpuFirst := 0
			for i := 0; i < len(e.Node.GPUs) && i < len(e.Node.HCAs); i++ {
				pod := NewPod(fmt.Sprintf("pair%d", i), Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1, GPUResource: 1}})
				before := len(e.Tap.Exchanges())
				e.MustAdmit(pod)
				xs := e.Tap.Exchanges()[before:]
				gpus := e.Kubelet.Devices(pod, "c", GPUResource)
				if len(xs) != 1 || xs[0].GPA == nil || len(gpus) != 1 {
					t.Fatalf("%s: exchanges %+v, GPUs %v", pod.Name, xs, gpus)
				}
				g, _ := e.Node.GPUByPCI(gpus[0])
				if at := e.GPU.AllocatedAt(gpus); at.IsZero() || at.After(xs[0].GPA.At) {
					t.Logf("%s: HCA asked for before the GPU: no GPU context", pod.Name)
					continue
				}
				gpuFirst++
				var same []string
				for _, id := range xs[0].GPA.Available {
					if h, _ := e.Node.HCAByPCI(id); h.NUMA == g.NUMA {
						same = append(same, h.Name)
					}
				}
				h, _ := e.Node.HCAByPCI(xs[0].GPA.Answer[0])
				t.Logf("%s: GPU %s (NUMA %d) first; HCAs on its socket available: %v; answer %s (NUMA %d)",
					pod.Name, g.PCI, g.NUMA, same, h.Name, h.NUMA)
				if len(same) > 0 && h.NUMA != g.NUMA {
					t.Errorf("%s: the container's GPU %s is on NUMA %d, HCAs %v too, but we answered %s on %d",
						pod.Name, g.PCI, g.NUMA, same, h.Name, h.NUMA)
				}
			}
			t.Logf("%s: the GPU was allocated before the HCA for %d pods", node, gpuFirst)
		})
	}
}
