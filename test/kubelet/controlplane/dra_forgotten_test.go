package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDRAKubeletForgottenClaimsAreUnprepared: a claim the kubelet no longer holds loses its CDI
// spec and checkpoint entry when the driver starts. Two pods' claims are prepared through the
// kubelet's DRA manager; the kubelet then loses its state (a new manager on a fresh state
// directory: the node's real layout, <root>/dra_manager_state) and prepares again only the pod
// still running, so that its own checkpoint, in its own format, lists that claim alone. The
// driver is restarted: it reads the kubelet's checkpoint, unprepares the forgotten claim (its CDI
// spec, its checkpoint entry; a log line and a metric say so) and leaves the held one as it was.
func TestDRAKubeletForgottenClaimsAreUnprepared(t *testing.T) {
	e := startDRANodeEnv(t, "dgx-h100-like.xml")
	c := e.cp.Client
	ctx := context.Background()
	claims := map[string]string{} // name -> uid
	for _, name := range []string{"held", "forgotten"} {
		claim, err := c.ResourceV1().ResourceClaims("default").Create(ctx, hcaClaim(name, "hca"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claims[name] = string(claim.UID)
	}
	held := e.run(claimPod("keeps", map[string][]string{"c": {"held"}}))
	e.run(claimPod("goes", map[string][]string{"c": {"forgotten"}}))

	// The CDI spec files by claim name (a spec file's name has the claim's UID).
	specs := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		for file := range cdiSpecs(t, e.cdiRoot) {
			for name, uid := range claims {
				if strings.Contains(file, uid) {
					b, err := os.ReadFile(filepath.Join(e.cdiRoot, file))
					if err != nil {
						t.Fatal(err)
					}
					out[name] = string(b)
				}
			}
		}
		return out
	}
	before := specs()
	if len(before) != 2 {
		t.Fatalf("CDI specs after both prepares: %v", before)
	}

	// The kubelet restarts without its state (the file wiped): a new DRA manager whose state
	// directory is the kubelet's root, as on a node, with only the pod that still runs; it
	// prepares that pod's claim again (the driver answers from its checkpoint) and records it.
	args := e.driver.cmd.Args[1:]
	i := slices.Index(args, "--kubelet-dir")
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("no --kubelet-dir in the driver's arguments %v", args)
	}
	root := args[i+1]
	e.kubelet.stop()
	e.pods = []*v1.Pod{held}
	e.kubelet = startDRAKubelet(t, e.cp, e.node, root, root, func() []*v1.Pod { return e.pods })
	waitFor(t, settle, "PrepareResources of the held pod by the restarted kubelet", func(ctx context.Context) (bool, string, error) {
		if err := e.kubelet.manager.PrepareResources(ctx, held); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
	state, err := os.ReadFile(filepath.Join(root, "dra_manager_state"))
	if err != nil || !strings.Contains(string(state), claims["held"]) || strings.Contains(string(state), claims["forgotten"]) {
		t.Fatalf("the kubelet's DRA checkpoint (%v) should list the held claim alone:\n%s", err, state)
	}

	// The driver restarts (the default --kubelet-state-file: <kubelet-dir>/dra_manager_state).
	e.driver.stop(t)
	e.driver = startDRAProcess(t, args)
	// /metrics is served once the driver has started, after its reconcile.
	var metrics string
	waitFor(t, settle, "the restarted driver's /metrics", func(ctx context.Context) (bool, string, error) {
		m, err := scrape(ctx, e.driver)
		metrics = m
		return err == nil, fmt.Sprint(err), nil
	})
	after := specs()
	if _, ok := after["forgotten"]; ok {
		t.Errorf("the forgotten claim's CDI spec is still there after the driver's start\ndriver log:\n%s", e.driver.output())
	}
	if after["held"] != before["held"] {
		t.Errorf("the held claim's CDI spec changed:\nbefore %s\nafter  %s", before["held"], after["held"])
	}
	if !regexp.MustCompile(`(?m)^rdma_device_plugin_dra_claims_unprepared_at_start_total 1$`).MatchString(metrics) {
		t.Errorf("rdma_device_plugin_dra_claims_unprepared_at_start_total is not 1:\n%s", metrics)
	}
	if !strings.Contains(e.driver.output(), "unprepared claim default/forgotten (uid "+claims["forgotten"]+")") {
		t.Errorf("no log line of the forgotten claim's unprepare:\n%s", e.driver.output())
	}
	checkpoint, err := os.ReadFile(filepath.Join(root, "plugins", draDriver, "checkpoint.json"))
	if err != nil || !strings.Contains(string(checkpoint), claims["held"]) || strings.Contains(string(checkpoint), claims["forgotten"]) {
		t.Errorf("the driver's checkpoint (%v) should hold the held claim alone:\n%s", err, checkpoint)
	}

	// The held claim goes on as before: the kubelet unprepares it through the driver when its pod
	// is gone, which removes its spec.
	e.pods = nil
	waitFor(t, settle, "UnprepareResources of the held pod", func(ctx context.Context) (bool, string, error) {
		if err := e.kubelet.manager.UnprepareResources(ctx, held); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
	if left := specs(); len(left) != 0 {
		t.Errorf("CDI specs after the held claim's unprepare: %v", left)
	}
}
