package realnode

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// insideThePod (with up --nri): what a training container needs besides its device
// nodes, seen from inside real containers. A container holding an HCA has the RLIMIT_MEMLOCK of
// the chart's NRI plugin (nri.memlock; real-node.sh sets it above the runtime's soft limit) and /etc/rdma/allocation.json; one without an HCA keeps the
// runtime's default and gets neither file nor variables; a variable the pod spec sets wins over
// ours; the NRI plugin's container killed, containers are still created, and once it is back
// they are adjusted again.
func insideThePod(t *testing.T, c *cluster) {
	if !c.nri {
		t.Fatal("insideThePod needs a cluster brought up with --nri")
	}
	userHCA := "=mlx5_chosen_by_the_user"
	c.create(
		workloadPod("plain", nil, ctr{name: "c"}),
		workloadPod("rdma", nil, ctr{name: "c", limits: hca(1)}),
		workloadPod("user-env", nil, ctr{name: "c", limits: hca(1),
			env: []v1.EnvVar{{Name: "NCCL_IB_HCA", Value: userHCA}}}))
	c.waitRunning(podTimeout, "plain", "rdma", "user-env")

	plain := c.inside("plain", "c")
	t.Logf("plain (no HCA): ulimit -l %s; /dev/infiniband %v; NCCL/RDMA variables %v; allocation.json %q",
		plain.memlock, plain.names(), plain.env, plain.allocation)
	if plain.memlock == c.memlock || plain.memlock == "" {
		t.Errorf("plain: ulimit -l is %q, what the NRI plugin sets: a container without an HCA must keep the runtime's", plain.memlock)
	}
	if len(plain.devs) != 0 || len(plain.env) != 0 || plain.allocation != "" {
		t.Errorf("plain: a container without an HCA got %v, %v, %q", plain.names(), plain.env, plain.allocation)
	}

	rdma := c.inside("rdma", "c")
	c.checkExactly("rdma", rdma, ncclHCAs(rdma.env["NCCL_IB_HCA"]))
	t.Logf("rdma: the variables inside: %v", rdma.env)
	t.Logf("rdma: /etc/rdma/allocation.json inside: %s", rdma.allocation)

	// The pod spec's NCCL_IB_HCA is the one the container has; the device nodes, the limit and
	// the allocation file (which names our choice) are still ours.
	c.checkPodSpecWins("user-env", c.inside("user-env", "c"), userHCA, 1)
	c.deletePods(podTimeout, "plain", "rdma", "user-env")

	// The NRI plugin's container killed (SIGKILL, through containerd): a container holding an
	// HCA is still created, adjusted or not (that depends on whether the kubelet has the NRI
	// container back yet); once it is back, the next one is adjusted again.
	restarts := nriRestarts(t, c)
	id := nriContainerID(t, c)
	c.inNS(c.ctr("task", "kill", "--signal", "SIGKILL", id)...)
	c.create(workloadPod("nri-killed", nil, ctr{name: "c", limits: hca(1)}))
	c.waitRunning(podTimeout, "nri-killed")
	killed := c.inside("nri-killed", "c")
	t.Logf("created while the NRI container was killed: running, ulimit -l %s", killed.memlock)
	eventually(t, 2*podTimeout, "the NRI container started again", func() (bool, string) {
		n := nriRestarts(t, c)
		return n > restarts, fmt.Sprintf("restarts %d", n)
	})
	c.waitNRIConnected()
	c.create(workloadPod("nri-back", nil, ctr{name: "c", limits: hca(1)}))
	c.waitRunning(podTimeout, "nri-back")
	back := c.inside("nri-back", "c")
	c.checkExactly("nri-back", back, ncclHCAs(back.env["NCCL_IB_HCA"]))
	c.deletePods(podTimeout, "nri-killed", "nri-back")
}

// nriStatus: the running plugin pod's NRI container status (nil: none running).
func nriStatus(c *cluster) *v1.ContainerStatus {
	pods, err := c.client.CoreV1().Pods(pluginNS).List(c.ctx(), metav1.ListOptions{})
	if err != nil {
		return nil
	}
	for _, p := range pods.Items {
		if p.Status.Phase != v1.PodRunning {
			continue
		}
		for i, s := range p.Status.ContainerStatuses {
			if s.Name == "nri" {
				return &p.Status.ContainerStatuses[i]
			}
		}
	}
	return nil
}

func nriRestarts(t *testing.T, c *cluster) int32 {
	if s := nriStatus(c); s != nil && s.Ready {
		return s.RestartCount
	}
	return -1
}

// nriContainerID: containerd's ID of the running NRI container.
func nriContainerID(t *testing.T, c *cluster) string {
	t.Helper()
	s := nriStatus(c)
	if s == nil || !strings.HasPrefix(s.ContainerID, "containerd://") {
		t.Fatalf("no running NRI container: %+v", s)
	}
	return strings.TrimPrefix(s.ContainerID, "containerd://")
}

// waitNRIConnected: the running NRI container logged that it registered with the runtime.
func (c *cluster) waitNRIConnected() {
	c.t.Helper()
	c.waitContainerLog("nri", nriRegisteredLine, "")
}

// checkPodSpecWins: the container's NCCL_IB_HCA is userHCA, the value its pod spec set, and
// otherwise it is as checkExactly wants for the n HCAs its allocation file lists (the file gives
// our NCCL_IB_HCA, for reference).
func (c *cluster) checkPodSpecWins(what string, in inside, userHCA string, n int) {
	c.t.Helper()
	if got := in.env["NCCL_IB_HCA"]; got != userHCA {
		c.t.Errorf("%s: NCCL_IB_HCA=%q inside, the pod spec set %q: the pod spec must win", what, got, userHCA)
	}
	var f allocationFile
	if err := json.Unmarshal([]byte(in.allocation), &f); err != nil || len(f.HCAs) != n {
		c.t.Fatalf("%s: allocation.json %q, want %d HCAs: %v", what, in.allocation, n, err)
	}
	var names []string
	for _, h := range f.HCAs {
		names = append(names, h.Name)
	}
	in.env["NCCL_IB_HCA"] = f.Env["NCCL_IB_HCA"]
	c.checkExactly(what, in, names)
	c.t.Logf("%s: the pod spec set NCCL_IB_HCA=%s and the container has it; ours, in allocation.json: %s", what, userHCA, f.Env["NCCL_IB_HCA"])
}

// What the NRI plugin logs once the runtime took its registration (nri/plugin.cc).
const nriRegisteredLine = "registered with the runtime as"

// ctr: the arguments of containerd's ctr on the node's containerd (k8s.io namespace), for inNS.
func (c *cluster) ctr(args ...string) []string {
	return append([]string{filepath.Join(buildDir(), "real-node", "bin", "ctr"),
		"--address", filepath.Join(c.run, "containerd", "containerd.sock"), "-n", "k8s.io"}, args...)
}
