package kubelet

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
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
			e := NewEnv(t, EnvOptions{Policy: "none", Mode: "exclusive", Tap: true, XML: xml,
				Extra: []string{"--metrics-address", "127.0.0.1:0"}})
			gpuFirst, gpuFirstNode, same, across := 0, 0, 0, 0
			pods := 0
			for i := 0; i < len(e.Node.GPUs) && i < len(e.Node.HCAs); i++ {
				pods++
				name := fmt.Sprintf("pair%d", i)
				x, g := e.AdmitGPUPair(name)
				if h, _ := e.Node.HCAByPCI(x.GPA.Answer[0]); h.NUMA == g.NUMA {
					same++
				} else {
					across++
				}
				if at := e.GPU.AllocatedAt([]string{g.PCI}); at.IsZero() || at.After(x.GPA.At) {
					t.Logf("%s: HCA asked for before the GPU: no GPU context", name)
					continue
				}
				gpuFirst++
				var near []string
				for _, id := range x.GPA.Available {
					if h, _ := e.Node.HCAByPCI(id); h.NUMA == g.NUMA {
						near = append(near, h.Name)
					}
				}
				h, _ := e.Node.HCAByPCI(x.GPA.Answer[0])
				t.Logf("%s: GPU %s (NUMA %d) first; HCAs on its socket available: %v; answer %s (NUMA %d)",
					name, g.PCI, g.NUMA, near, h.Name, h.NUMA)
				if h.NUMA == g.NUMA {
					gpuFirstNode++
				}
				if len(near) > 0 && h.NUMA != g.NUMA {
					t.Errorf("%s: the container's GPU %s is on NUMA %d, HCAs %v too, but we answered %s on %d",
						name, g.PCI, g.NUMA, near, h.Name, h.NUMA)
				}
			}
			t.Logf("%s: the GPU was allocated before the HCA for %d pods", node, gpuFirst)

			// The metrics say the same: each HCA on its socket; an allocation is NODE when its HCA
			// is on its GPU's socket and SYS only when it is not (without a GPU context at
			// Allocate it is unknown), and those the GPU context placed are all counted NODE.
			metrics := scrape(t, filepath.Join(e.Dir, "plugin.log"))
			for _, h := range e.Node.HCAs {
				want := fmt.Sprintf(`rdma_device_plugin_hca_info{hca="%s",pci="%s",numa_node="%d",pcie_root="%s",`, h.Name, h.PCI, h.NUMA, h.PCIeRoot)
				if !strings.Contains(metrics, want) {
					t.Errorf("no %s... in /metrics", want)
				}
			}
			class := func(c string) int {
				return sample(metrics, `rdma_device_plugin_allocation_alignment_total{resource="rdma/hca",path_class="`+c+`"}`)
			}
			node, sys, unknown := class("NODE"), class("SYS"), class("unknown")
			if node < gpuFirstNode || node > same || sys > across || node+sys+unknown != pods ||
				class("PIX")+class("PXB")+class("PHB") != 0 {
				t.Errorf("allocation_alignment_total NODE %d SYS %d unknown %d; pods %d, on their GPU's socket %d "+
					"(%d placed knowing the GPU), across %d", node, sys, unknown, pods, same, gpuFirstNode, across)
			}
		})
	}
}

// scrape reads the plugin's /metrics at the address its log names (--metrics-address port 0),
// waiting at most 10 s for the log line.
func scrape(t *testing.T, log string) string {
	t.Helper()
	re := regexp.MustCompile(`metrics: serving on (127\.0\.0\.1:\d+)`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(log)
		if m := re.FindSubmatch(data); m != nil {
			resp, err := http.Get("http://" + string(m[1]) + "/metrics")
			if err != nil {
				t.Fatalf("GET /metrics: %v", err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return string(body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 'metrics: serving on' in %s after 10 s", log)
		}
		time.Sleep(50 * time.Millisecond) // polling the log for a line, bounded by the deadline
	}
}

// sample is the value of the sample named exactly so (name and labels), or -1.
func sample(metrics, name string) int {
	for _, line := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return int(v)
			}
		}
	}
	return -1
}

// TestDRAGraceNodes: the DRA driver's devices on the Grace fixtures carry the kernel's placement:
// numaNode the socket's CPU node, pcieRoot the device's own root complex (a domain each), and
// one device per HCA although four share bus:dev.fn 01:00.0. (TestDRAAttributesMatchUpstream
// holds the same attributes to deviceattribute's helpers on these trees.)
func TestDRAGraceNodes(t *testing.T) {
	bin := draBinary(t)
	for _, node := range graceNodes {
		f := newDRAFixture(t, filepath.Join(repoRoot(), "test", "data", node+".xml"), nil)
		devices := draDevices(draSlices(t, bin, append(f.Args, "--node-name", draNodeName)...))
		if len(devices) != len(f.Node.HCAs) {
			t.Errorf("%s: %d devices, want %d", node, len(devices), len(f.Node.HCAs))
		}
		for _, d := range devices {
			pci := attrString(d.Attributes, stdPrefix+"pciBusID")
			h, ok := f.Node.HCAByPCI(pci)
			numa := d.Attributes[resourceapi.QualifiedName(stdPrefix+"numaNode")].IntValue
			if !ok || attrString(d.Attributes, stdPrefix+"pcieRoot") != h.PCIeRoot || numa == nil || int(*numa) != h.NUMA {
				t.Errorf("%s: device %s: pciBusID %q pcieRoot %q numaNode %v; want %+v", node, d.Name, pci,
					attrString(d.Attributes, stdPrefix+"pcieRoot"), numa, h)
			}
		}
	}
}
