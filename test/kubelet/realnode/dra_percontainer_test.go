package realnode

import (
	"testing"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

// draPerContainer: what each container of a pod gets in DRA mode, per request and per claim
// (a regression guard: one CDI device per claim gave every container of the claim every HCA of
// it, and told a container holding two claims about one).
//   - two containers each asking rdma/hca: 1 (the DeviceClass's extended resource: one claim of
//     two requests made by the scheduler) get distinct HCAs, each container only its own;
//   - two containers each using one request of one claim likewise;
//   - a container using two claims sees both HCAs, and its environment names both.
func draPerContainer(t *testing.T, c *cluster) {
	usable := c.usableHCAs()
	check := func(what, pod string, ctrs ...string) {
		owner := map[string]string{}
		for _, name := range ctrs {
			in := c.inside(pod, name)
			got := c.hcasSeen(in)
			if len(got) != 1 {
				t.Errorf("%s: container %s sees the nodes of %v, want one HCA", what, name, got)
			}
			c.checkExactly(what+" "+name, in, got)
			for _, h := range got {
				if prev, ok := owner[h]; ok {
					t.Errorf("%s: containers %s and %s both hold %s", what, prev, name, h)
				}
				owner[h] = name
			}
			if others := kubelet.Minus(usable, got); len(others) > 0 {
				c.checkMknodDenied(what+" "+name, pod, name, others[0])
			}
		}
	}

	c.create(workloadPod("ext-two", nil, ctr{name: "a", limits: hca(1)}, ctr{name: "b", limits: hca(1)}))
	c.waitRunning(podTimeout, "ext-two")
	check("two containers asking rdma/hca: 1 each", "ext-two", "a", "b")

	c.claim("two-requests", request("r1", hcaClass, 1), request("r2", hcaClass, 1))
	c.create(claimPod("two-requests", map[string][]string{"a": {"two-requests/r1"}, "b": {"two-requests/r2"}}))
	c.waitRunning(podTimeout, "two-requests")
	check("two requests of one claim", "two-requests", "a", "b")
	for name, req := range map[string]string{"a": "r1", "b": "r2"} {
		want := c.allocated("two-requests", req)
		if got := c.hcasSeen(c.inside("two-requests", name)); len(got) != 1 || len(want) != 1 || got[0] != want[0] {
			t.Errorf("two requests of one claim: container %s (request %s) sees %v, the scheduler allocated %v", name, req, got, want)
		}
	}

	c.claim("first", request("hca", hcaClass, 1))
	c.claim("second", request("hca", hcaClass, 1))
	c.create(claimPod("two-claims", map[string][]string{"c": {"first", "second"}}))
	c.waitRunning(podTimeout, "two-claims")
	want := append(c.allocated("first", "hca"), c.allocated("second", "hca")...)
	in := c.inside("two-claims", "c")
	c.checkExactly("a container with two claims", in, sortStrings(want))
	if env := in.env["RDMA_HCA_NAMES"]; len(splitList(env)) != 2 {
		t.Errorf("a container with two claims: RDMA_HCA_NAMES=%q, want both %v", env, want)
	}
	c.deletePods(podTimeout, "ext-two", "two-requests", "two-claims")
}
