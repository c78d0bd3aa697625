package kubelet

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

const registered = "Registered device plugin with Kubelet"

// The plugin stopped (SIGTERM: socket removed) or killed (SIGKILL: stale socket left) and
// started again re-registers; allocations made before are kept and never handed out twice.
func TestPluginRestart(t *testing.T) {
	if !Isolate(t) {
		return
	}
	e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "exclusive"})
	n := int64(len(e.Node.HCAs))
	pod := NewPod("before", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 2}})
	e.MustAdmit(pod)
	held := e.Kubelet.Devices(pod, "c", ResourceHCA)

	if err := e.Plugin.Stop(); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(e.Plugin.Socket); !os.IsNotExist(err) {
		t.Errorf("SIGTERM left %s behind (%v)", e.Plugin.Socket, err)
	}
	e.WaitCapacity(ResourceHCA, n, 0, 5*time.Second) // the kubelet saw it go
	e.StartPlugin("exclusive")
	e.WaitCapacity(ResourceHCA, n, n, 10*time.Second)
	if err := e.Plugin.WaitLog(registered, 1, time.Second); err != nil {
		t.Error(err)
	}

	e.Plugin.Kill()
	e.WaitCapacity(ResourceHCA, n, 0, 5*time.Second)
	e.StartPlugin("exclusive")
	e.WaitCapacity(ResourceHCA, n, n, 10*time.Second)

	// Killed and restarted at once: the kubelet may not have dropped the old connection yet
	// and then refuses the registration ("device plugin already connected"); the plugin must
	// retry until it is accepted.
	e.Plugin.Kill()
	p := e.StartPlugin("exclusive")
	if err := p.WaitLog(registered, 1, 10*time.Second); err != nil {
		t.Error(err)
	}
	e.WaitCapacity(ResourceHCA, n, n, 10*time.Second)

	if got := e.Kubelet.Devices(pod, "c", ResourceHCA); strings.Join(got, ",") != strings.Join(held, ",") {
		t.Errorf("after restarts the pod holds %v, before %v", got, held)
	}
	rest := NewPod("rest", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: n - 2}})
	e.MustAdmit(rest)
	for _, id := range e.Kubelet.Devices(rest, "c", ResourceHCA) {
		for _, h := range held {
			if id == h {
				t.Errorf("HCA %s handed out twice", id)
			}
		}
	}
	if a := e.Kubelet.Admit(NewPod("one-too-many", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1}})); a.Admit {
		t.Error("a 10th HCA was admitted on a 9-HCA node")
	}
}

// A kubelet restart (a new device manager on the same directory: it wipes the sockets,
// restores its checkpoint and listens again), ten times in a row: our plugin re-registers
// within 1 s each time, and the allocations survive.
func TestKubeletRestart(t *testing.T) {
	if !Isolate(t) {
		return
	}
	e := NewEnv(t, EnvOptions{Policy: "single-numa-node", Scope: "pod", Mode: "exclusive"})
	n := int64(len(e.Node.HCAs))
	pod := NewPod("survivor", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 4}})
	e.MustAdmit(pod)
	held := e.Kubelet.Devices(pod, "c", ResourceHCA)
	heldGPUs := e.Kubelet.Devices(pod, "c", GPUResource)
	for i := 1; i <= 10; i++ {
		pods := e.Kubelet.Pods()
		e.Kubelet.Stop()
		before := e.Plugin.Count(registered)
		e.StartKubelet(pods)
		start := time.Now()
		Eventually(t, time.Second, fmt.Sprintf("restart %d: re-registered", i), func() (bool, string) {
			c, a := e.Kubelet.Capacity(ResourceHCA)
			return a == n, fmt.Sprintf("capacity %d allocatable %d", c, a)
		})
		took := time.Since(start)
		if err := e.Plugin.WaitLog(registered, before+1, time.Second); err != nil {
			t.Error(err)
		}
		t.Logf("restart %d: rdma/hca back in %v", i, took.Round(time.Millisecond))
		if err := e.GPU.Start(); err != nil {
			t.Fatal(err)
		}
		e.WaitCapacity(GPUResource, 8, 8, 5*time.Second)
		if got := e.Kubelet.Devices(pod, "c", ResourceHCA); strings.Join(got, ",") != strings.Join(held, ",") {
			t.Fatalf("restart %d: the pod holds HCAs %v, before %v", i, got, held)
		}
		if got := e.Kubelet.Devices(pod, "c", GPUResource); strings.Join(got, ",") != strings.Join(heldGPUs, ",") {
			t.Fatalf("restart %d: the pod holds GPUs %v, before %v", i, got, heldGPUs)
		}
	}
	// The restored kubelet allocates around the survivor: 2 more HCAs + the other 4 GPUs on
	// the other NUMA node.
	next := NewPod("next", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 4}})
	e.MustAdmit(next)
	for _, id := range e.Kubelet.Devices(next, "c", ResourceHCA) {
		for _, h := range held {
			if id == h {
				t.Errorf("HCA %s handed out twice after kubelet restarts", id)
			}
		}
	}
}

// Mode switches while pods hold rdma/hca under the other mode (the plugin learns who holds
// what from the kubelet's pod-resources List):
//   - shared -> exclusive: a shared unit means every HCA, so the exclusive plugin withholds all
//     HCAs (Unhealthy: allocatable 0) until that pod is gone, then offers them;
//   - exclusive -> shared: the HCAs an exclusive pod owns are left out of what shared pods get
//     (device specs, NCCL_IB_HCA) until that pod is gone.
func TestModeSwitch(t *testing.T) {
	t.Run("shared_to_exclusive", func(t *testing.T) {
		if !Isolate(t) {
			return
		}
		e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "shared"})
		n := int64(len(e.Node.HCAs))
		holder := NewPod("shared-holder", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1}})
		e.MustAdmit(holder)
		if err := e.Plugin.Stop(); err != nil {
			t.Error(err)
		}
		e.WaitCapacity(ResourceHCA, 1000, 0, 5*time.Second)
		p := e.StartPlugin("exclusive")
		if err := p.WaitLog(registered, 1, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		// From its first ListAndWatch on, no HCA may be allocatable while the holder runs.
		Eventually(t, 5*time.Second, "exclusive devices listed", func() (bool, string) {
			c, a := e.Kubelet.Capacity(ResourceHCA)
			if a > 0 {
				t.Errorf("allocatable %d while a pod holds shared rdma/hca", a)
			}
			return c == n, fmt.Sprintf("capacity %d allocatable %d", c, a)
		})
		if err := p.WaitLog("mode switch: container", 1, 5*time.Second); err != nil {
			t.Error(err)
		}
		if c, a := e.Kubelet.Capacity(ResourceHCA); a != 0 {
			t.Errorf("capacity %d allocatable %d after the plugin logged the withholding", c, a)
		}
		if a := e.Kubelet.Admit(NewPod("too-early", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1}})); a.Admit {
			t.Error("an exclusive HCA was admitted while a shared pod holds every HCA")
		}
		e.Kubelet.RemovePod(holder)
		e.WaitCapacity(ResourceHCA, n, n, 10*time.Second)
		e.MustAdmit(NewPod("after", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2}}))
	})
	t.Run("exclusive_to_shared", func(t *testing.T) {
		if !Isolate(t) {
			return
		}
		e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "exclusive"})
		holder := NewPod("exclusive-holder", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2}})
		e.MustAdmit(holder)
		owned := map[string]bool{}
		for _, id := range e.Kubelet.Devices(holder, "c", ResourceHCA) {
			h, _ := e.Node.HCAByPCI(id)
			owned[h.Name] = true
		}
		if err := e.Plugin.Stop(); err != nil {
			t.Error(err)
		}
		p := e.StartPlugin("shared")
		e.WaitCapacity(ResourceHCA, 1000, 1000, 10*time.Second)
		if err := p.WaitLog("mode switch: container", 1, 5*time.Second); err != nil {
			t.Error(err)
		}
		during := NewPod("shared-during", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1}})
		e.MustAdmit(during)
		names := e.ncclHCAs(during)
		for _, name := range names {
			if owned[name] {
				t.Errorf("shared pod got %s, owned by an exclusive pod (NCCL_IB_HCA lists %v)", name, names)
			}
		}
		if len(names) != len(e.Node.HCAs)-len(owned) {
			t.Errorf("shared pod got %v, want the %d HCAs nobody owns", names, len(e.Node.HCAs)-len(owned))
		}
		e.Kubelet.RemovePod(holder)
		if err := p.WaitLog("mode switch: no HCA is withheld any more", 1, 10*time.Second); err != nil {
			t.Error(err)
		}
		after := NewPod("shared-after", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 1}})
		e.MustAdmit(after)
		if names := e.ncclHCAs(after); len(names) != len(e.Node.HCAs) {
			t.Errorf("after the exclusive pod left, a shared pod got %v, want all %d HCAs", names, len(e.Node.HCAs))
		}
	})
}

// ncclHCAs returns the HCA names NCCL_IB_HCA gives a pod's first container.
func (e *Env) ncclHCAs(pod *v1.Pod) []string {
	e.T.Helper()
	opts, err := e.Kubelet.DM.GetDeviceRunContainerOptions(e.Kubelet.Context(), pod, &pod.Spec.Containers[0])
	if err != nil {
		e.T.Fatal(err)
	}
	for _, ev := range opts.Envs {
		if ev.Name == "NCCL_IB_HCA" {
			return strings.Split(strings.TrimPrefix(ev.Value, "="), ",")
		}
	}
	e.T.Fatalf("no NCCL_IB_HCA for %s", pod.Name)
	return nil
}

// The kubelet away for a while (the plugin's registration retries back off meanwhile), and a
// plugin that starts before any kubelet (node boot): either way the plugin registers within
// 1 s of kubelet.sock appearing.
func TestKubeletAbsent(t *testing.T) {
	t.Run("kubelet_down_3s", func(t *testing.T) {
		if !Isolate(t) {
			return
		}
		e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "exclusive"})
		n := int64(len(e.Node.HCAs))
		pods := e.Kubelet.Pods()
		e.Kubelet.Stop()
		// The scenario, not a synchronisation: the kubelet stays away while the plugin backs off.
		time.Sleep(3 * time.Second)
		before := e.Plugin.Count(registered)
		e.StartKubelet(pods)
		start := time.Now()
		e.WaitCapacity(ResourceHCA, n, n, time.Second)
		t.Logf("registered %v after the kubelet came back", time.Since(start).Round(time.Millisecond))
		if err := e.Plugin.WaitLog(registered, before+1, time.Second); err != nil {
			t.Error(err)
		}
	})
	t.Run("plugin_first", func(t *testing.T) {
		if !Isolate(t) {
			return
		}
		e := NewEnv(t, EnvOptions{Policy: "best-effort"})
		e.GPU.Stop()
		e.Kubelet.Stop()
		if err := ClearPluginDir(); err != nil {
			t.Fatal(err)
		}
		p := e.StartPlugin("exclusive")
		if err := p.WaitLog("serving", 1, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // the scenario: no kubelet for a while
		if p.Exited() {
			t.Fatal("the plugin exited while no kubelet was there")
		}
		e.StartKubelet(nil)
		start := time.Now()
		n := int64(len(e.Node.HCAs))
		e.WaitCapacity(ResourceHCA, n, n, time.Second)
		t.Logf("registered %v after the kubelet appeared", time.Since(start).Round(time.Millisecond))
	})
}

// A vanished HCA (hot-unplug) stays listed as Unhealthy, so capacity stays for pods that hold
// it; allocatable drops; it turns Healthy again when it returns.
func TestHotplug(t *testing.T) {
	if !Isolate(t) {
		return
	}
	e := NewEnv(t, EnvOptions{Policy: "best-effort", Mode: "exclusive"})
	n := int64(len(e.Node.HCAs))
	h := e.Node.HCAs[5]
	if err := e.Sys.RemoveHCA(h.Name); err != nil {
		t.Fatal(err)
	}
	e.WaitCapacity(ResourceHCA, n, n-1, 5*time.Second)
	if err := e.Sys.RestoreHCA(h.Name); err != nil {
		t.Fatal(err)
	}
	e.WaitCapacity(ResourceHCA, n, n, 5*time.Second)
	pod := NewPod("all", Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: n}})
	e.MustAdmit(pod)
	if names := e.ncclHCAs(pod); len(names) != int(n) {
		t.Errorf("after the HCA returned, a pod of all HCAs got %v", names)
	}
}

// Our plugin reads pod-resources while the kubelet waits on GetPreferredAllocation (which it
// calls without a deadline); admission must never stall: every admission completes within
// 5 s, with a prompt pod-resources server and with one that hangs for 30 s on every call.
func TestAdmissionNeverStalls(t *testing.T) {
	if !Isolate(t) {
		return
	}
	e := NewEnv(t, EnvOptions{Policy: "best-effort", Scope: "container", Mode: "exclusive"})
	for _, hang := range []time.Duration{0, 30 * time.Second} {
		e.Kubelet.SetPodResourcesDelay(hang)
		for i := 0; i < 4; i++ {
			pod := NewPod(fmt.Sprintf("p%d", i), Ctr{Name: "c", Limits: map[string]int64{ResourceHCA: 2, GPUResource: 2}})
			a := e.MustAdmit(pod)
			t.Logf("pod-resources delay %v: admission %d took %v", hang, i, a.Took.Round(time.Millisecond))
		}
		for _, p := range e.Kubelet.Pods().Active() {
			e.Kubelet.RemovePod(p)
		}
	}
	e.Kubelet.SetPodResourcesDelay(0)
}
