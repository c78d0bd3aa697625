package kubelet

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

var policies = []string{"none", "best-effort", "restricted", "single-numa-node"}
var scopes = []string{"container", "pod"}

// step is one pod of an alignment scenario and whether each policy admits it.
type step struct {
	pod      func() *v1.Pod
	rejectBy map[string]bool // policy -> rejected with TopologyAffinityError
	remove   bool            // remove it again after the checks
}

// The pod users run (rdma/hca 2 + nvidia.com/gpu 8) and smaller ones, under every policy and
// scope, on the exclusive plugin behind the tap. After each admission:
//   - restricted and single-numa-node admit only with a preferred hint, and 8 GPUs + 2 HCAs
//     is never preferred (the 8 GPUs need both NUMA nodes, the 2 HCAs want one; the kubelet
//     prefers a merged hint only when every provider's affinity is the same), so both reject
//     it with TopologyAffinityError; none and best-effort admit it;
//   - under any policy but none, whenever the container's hint is preferred, every device of
//     every resource lies in the hint's NUMA nodes; single-numa-node's hints are one node;
//   - every GetPreferredAllocation answer is valid (size, within available, must-include kept),
//     and the devices the kubelet then allocated are exactly that answer.
func TestAlignment(t *testing.T) {
	strict := map[string]bool{"restricted": true, "single-numa-node": true}
	steps := []step{
		{pod: func() *v1.Pod {
			return NewPod("hca2-gpu8", Ctr{Name: "train", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 8}})
		}, rejectBy: strict, remove: true},
		{pod: func() *v1.Pod {
			return NewPod("hca1-gpu4", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1, GPUResource: 4}})
		}},
		{pod: func() *v1.Pod {
			return NewPod("hca2-gpu2", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 2}})
		}},
		{pod: func() *v1.Pod {
			return NewPod("two-containers",
				Ctr{Name: "a", Limits: map[string]int64{ResourceHCA: 1, GPUResource: 1}},
				Ctr{Name: "b", Limits: map[string]int64{ResourceHCA: 1, GPUResource: 1}})
		}},
		{pod: func() *v1.Pod { return NewPod("hca3", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 3}}) }},
	}
	for _, policy := range policies {
		for _, scope := range scopes {
			if policy == "none" && scope == "pod" {
				continue // the scope does not matter under none
			}
			t.Run(policy+"_"+scope, func(t *testing.T) {
				if !Isolate(t) {
					return
				}
				e := NewEnv(t, EnvOptions{Policy: policy, Scope: scope, Mode: "exclusive", Tap: true})
				gpas := 0
				held := map[string]string{} // HCA ID -> pod
				for _, s := range steps {
					pod := s.pod()
					before := len(e.Tap.Exchanges())
					a := e.Kubelet.Admit(pod)
					if a.Took.Seconds() >= 5 {
						t.Errorf("admitting %s took %v (bound 5s)", pod.Name, a.Took)
					}
					if s.rejectBy[policy] {
						if a.Admit || a.Reason != "TopologyAffinityError" {
							t.Errorf("%s: admit=%v reason=%q, want TopologyAffinityError", pod.Name, a.Admit, a.Reason)
						}
						if n := len(e.Tap.Exchanges()) - before; n != 0 {
							t.Errorf("%s rejected, yet %d Allocate calls reached the plugin", pod.Name, n)
						}
						continue
					}
					if !a.Admit {
						t.Fatalf("%s rejected: %s: %s", pod.Name, a.Reason, a.Message)
					}
					gpas += e.checkAdmitted(pod, e.Tap.Exchanges()[before:])
					for _, c := range pod.Spec.Containers {
						for _, id := range e.Kubelet.Devices(pod, c.Name, ResourceHCA) {
							if other, ok := held[id]; ok {
								t.Errorf("HCA %s given to %s and %s", id, other, pod.Name)
							}
							held[id] = pod.Name
						}
					}
					if s.remove {
						e.Kubelet.RemovePod(pod)
						for id, p := range held {
							if p == pod.Name {
								delete(held, id)
							}
						}
					}
				}
				if gpas == 0 {
					t.Error("the kubelet never called GetPreferredAllocation")
				}
			})
		}
	}
}

// checkAdmitted checks one admitted pod's devices against the policy and the tap's record of
// the HCA exchanges (one per container asking for HCAs, in container order). It returns how
// many GetPreferredAllocation calls there were.
func (e *Env) checkAdmitted(pod *v1.Pod, xs []Exchange) int {
	t := e.T
	t.Helper()
	logger := klog.FromContext(e.Kubelet.Context())
	gpas := 0
	i := 0
	for _, c := range pod.Spec.Containers {
		hcas := e.Kubelet.Devices(pod, c.Name, ResourceHCA)
		gpus := e.Kubelet.Devices(pod, c.Name, GPUResource)
		wantH, wantG := c.Resources.Limits.Name(ResourceHCA, "0").Value(), c.Resources.Limits.Name(GPUResource, "0").Value()
		if int64(len(hcas)) != wantH || int64(len(gpus)) != wantG {
			t.Errorf("%s/%s got %d HCAs %d GPUs, want %d %d", pod.Name, c.Name, len(hcas), len(gpus), wantH, wantG)
		}
		hint := e.Kubelet.TM.GetAffinity(logger, string(pod.UID), c.Name)
		desc := fmt.Sprintf("%s/%s (policy %s, scope %s, hint %v): HCAs %v on NUMA %v, GPUs on NUMA %v",
			pod.Name, c.Name, e.Opts.Policy, e.Opts.Scope, hint, hcas,
			e.numaOf(ResourceHCA, hcas), e.numaOf(GPUResource, gpus))
		t.Log(desc)
		if e.Opts.Policy != "none" {
			if e.Opts.Policy != "best-effort" && !hint.Preferred {
				t.Errorf("%s: admitted under %s without a preferred hint", desc, e.Opts.Policy)
			}
			if e.Opts.Policy == "single-numa-node" && (hint.NUMANodeAffinity == nil || hint.NUMANodeAffinity.Count() != 1) {
				t.Errorf("%s: single-numa-node hint is not one NUMA node", desc)
			}
			if hint.Preferred && hint.NUMANodeAffinity != nil {
				for _, n := range append(e.numaOf(ResourceHCA, hcas), e.numaOf(GPUResource, gpus)...) {
					if n >= 0 && !hint.NUMANodeAffinity.IsSet(n) {
						t.Errorf("%s: device on NUMA %d outside the preferred hint", desc, n)
						break
					}
				}
			}
		}
		if wantH == 0 {
			continue
		}
		if i >= len(xs) {
			t.Errorf("%s: no Allocate of HCAs reached the plugin", desc)
			continue
		}
		x := xs[i]
		i++
		if strings.Join(x.Allocated, ",") != strings.Join(hcas, ",") {
			t.Errorf("%s: the plugin was asked to Allocate %v", desc, x.Allocated)
		}
		if x.GPA == nil {
			continue
		}
		gpas++
		checkAnswer(t, e, x, hcas, desc)
	}
	return gpas
}

// validAnswer checks a GetPreferredAllocation answer against its request: exact size, within
// available, must-include kept. (How many NUMA nodes it spans is the allocator's choice: it
// spreads HCAs over the NUMA nodes of the container's GPUs, or of `available` - which the
// kubelet has already narrowed to the hint when it could.)
func (e *Env) validAnswer(g *GPARecord) error {
	avail := map[string]bool{}
	for _, id := range g.Available {
		avail[id] = true
	}
	if len(g.Answer) != g.Size {
		return fmt.Errorf("size %d, want %d", len(g.Answer), g.Size)
	}
	in := map[string]bool{}
	for _, id := range g.Answer {
		if !avail[id] {
			return fmt.Errorf("%s not available", id)
		}
		in[id] = true
	}
	for _, id := range g.MustInclude {
		if !in[id] {
			return fmt.Errorf("must-include %s dropped", id)
		}
	}
	return nil
}

// single-numa-node rejects what no single NUMA node can hold, with TopologyAffinityError, and
// nothing is allocated: 6 HCAs (4 + 5 on the two nodes), and 8 GPUs + 2 HCAs.
func TestSingleNUMARejects(t *testing.T) {
	for _, scope := range scopes {
		t.Run(scope, func(t *testing.T) {
			if !Isolate(t) {
				return
			}
			e := NewEnv(t, EnvOptions{Policy: "single-numa-node", Scope: scope, Mode: "exclusive", Tap: true})
			for _, pod := range []*v1.Pod{
				NewPod("hca6", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 6}}),
				NewPod("hca2-gpu8", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 8}}),
				NewPod("split", Ctr{Name: "a", Limits: map[string]int64{ResourceHCA: 3}}, Ctr{Name: "b", Limits: map[string]int64{ResourceHCA: 3}}),
			} {
				a := e.Kubelet.Admit(pod)
				wantReject := !(scope == "container" && pod.Name == "split")
				if !wantReject {
					if !a.Admit {
						t.Errorf("%s under container scope: rejected (%s), want admitted", pod.Name, a.Reason)
					} else {
						e.checkAdmitted(pod, e.Tap.Exchanges()[len(e.Tap.Exchanges())-2:])
						e.Kubelet.RemovePod(pod)
					}
					continue
				}
				if a.Admit || a.Reason != "TopologyAffinityError" {
					t.Errorf("%s: admit=%v reason=%q message=%q, want TopologyAffinityError", pod.Name, a.Admit, a.Reason, a.Message)
				}
				for _, c := range pod.Spec.Containers {
					if d := e.Kubelet.Devices(pod, c.Name, ResourceHCA); len(d) != 0 {
						t.Errorf("%s rejected but holds %v", pod.Name, d)
					}
				}
			}
			if n := len(e.Tap.Exchanges()); scope == "pod" && n != 0 {
				t.Errorf("%d Allocate calls reached the plugin for rejected pods", n)
			}
			// Everything is still free: a 5-HCA pod fits NUMA 1.
			e.MustAdmit(NewPod("hca5", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 5}}))
		})
	}
}

// Shared mode through the tap: GetPreferredAllocation answers the lowest free unit IDs, and
// the kubelet allocates exactly that.
func TestSharedPreferredAllocation(t *testing.T) {
	if !Isolate(t) {
		return
	}
	e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "shared", Tap: true})
	for i, size := range []int64{1, 2, 3} {
		pod := NewPod(fmt.Sprintf("shared%d", i), Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: size}})
		before := len(e.Tap.Exchanges())
		e.MustAdmit(pod)
		xs := e.Tap.Exchanges()[before:]
		if len(xs) != 1 || xs[0].GPA == nil {
			t.Fatalf("%s: exchanges %+v, want one with GetPreferredAllocation", pod.Name, xs)
		}
		g := xs[0].GPA
		if err := e.validAnswer(g); err != nil {
			t.Errorf("%s: %v", pod.Name, err)
			continue
		}
		avail := append([]string(nil), g.Available...)
		sort.Slice(avail, func(i, j int) bool { return naturalLess(avail[i], avail[j]) })
		want := avail[:g.Size]
		sort.Strings(want)
		if strings.Join(g.Answer, ",") != strings.Join(want, ",") {
			t.Errorf("%s: answer %v, want the lowest free IDs %v", pod.Name, g.Answer, want)
		}
		if got := e.Kubelet.Devices(pod, "c", ResourceHCA); strings.Join(got, ",") != strings.Join(g.Answer, ",") {
			t.Errorf("%s: kubelet allocated %v, our answer was %v", pod.Name, got, g.Answer)
		}
	}
}

// naturalLess orders "2" before "10" (and zero-padded IDs as strings).
func naturalLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// GPU-aware placement (docs/allocator.md): the kubelet allocates a container's GPUs and HCAs in map order,
// so sometimes the GPUs come first. Whenever they did, and an HCA under the same PCIe switch as
// the container's GPU was available, our answer is such an HCA. Policy none, so that only the
// plugin places: 8 pods of 1 GPU + 1 HCA each.
func TestGPUAwarePlacement(t *testing.T) {
	if !Isolate(t) {
		return
	}
	e := NewEnv(t, EnvOptions{Policy: "none", Mode: "exclusive", Tap: true})
	gpuFirst, pix := 0, 0
	for i := 0; i < len(e.Node.GPUs); i++ {
		name := fmt.Sprintf("pair%d", i)
		x, g := e.AdmitGPUPair(name)
		gpuAt := e.GPU.AllocatedAt([]string{g.PCI})
		if gpuAt.IsZero() || gpuAt.After(x.GPA.At) {
			t.Logf("%s: HCA asked for before the GPU (%s, GPU Allocate at %v, GPA at %v): no GPU context; got %v", name, g.PCI, gpuAt.Format("05.000000"), x.GPA.At.Format("05.000000"), x.GPA.Answer)
			continue
		}
		gpuFirst++
		var near []string
		for _, id := range x.GPA.Available {
			if h, _ := e.Node.HCAByPCI(id); SameSwitch(g, h) {
				near = append(near, id)
			}
		}
		h, _ := e.Node.HCAByPCI(x.GPA.Answer[0])
		t.Logf("%s: GPU %s first; HCAs under its switch available: %v; answer %s (%s)", name, g.PCI, near, h.PCI, h.Name)
		if SameSwitch(g, h) {
			pix++
		} else if len(near) > 0 {
			t.Errorf("%s: the container's GPU %s was known, HCAs %v share its switch, but we answered %s",
				name, g.PCI, near, h.PCI)
		}
	}
	t.Logf("GPU allocated before the HCA for %d of %d pods; PIX placements %d", gpuFirst, len(e.Node.GPUs), pix)
}

// Must-include, the way the kubelet produces it: an init container's devices are reused by the
// app container that follows (devicesToReuse), and the device manager asks us for the rest
// with must-include = the reused ones. Our answer keeps them and is allocated exactly.
func TestMustInclude(t *testing.T) {
	if !Isolate(t) {
		return
	}
	e := NewEnv(t, EnvOptions{Policy: "best-effort", Scope: "container", Mode: "exclusive", Tap: true})
	pod := NewPod("init-then-app",
		Ctr{Name: "init", Limits: map[string]int64{ResourceHCA: 2}, Init: true},
		Ctr{Name: "app", Limits: map[string]int64{ResourceHCA: 3, GPUResource: 2}})
	e.MustAdmit(pod)
	initHCAs := e.Kubelet.Devices(pod, "init", ResourceHCA)
	app := e.Kubelet.Devices(pod, "app", ResourceHCA)
	xs := e.Tap.Exchanges()
	if len(xs) != 2 || xs[1].GPA == nil {
		t.Fatalf("exchanges %+v: want the init container's and then the app's with GetPreferredAllocation", xs)
	}
	g := xs[1].GPA
	t.Logf("init %v; app: available %v, must-include %v, answer %v, allocated %v", initHCAs, g.Available, g.MustInclude, g.Answer, app)
	if strings.Join(g.MustInclude, ",") != strings.Join(initHCAs, ",") {
		t.Errorf("must-include %v, want the init container's %v", g.MustInclude, initHCAs)
	}
	if err := e.validAnswer(g); err != nil {
		t.Errorf("answer %v: %v", g.Answer, err)
	}
	if strings.Join(app, ",") != strings.Join(g.Answer, ",") {
		t.Errorf("kubelet allocated %v to the app container, our answer was %v", app, g.Answer)
	}
}
