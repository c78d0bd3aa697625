package controlplane

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/kubernetes/pkg/features"
)

// scrape returns the driver's /metrics (its address from the "metrics: serving on" line).
func scrape(ctx context.Context, p *draProcess) (string, error) {
	m := regexp.MustCompile(`metrics: serving on (127\.0\.0\.1:\d+)`).FindStringSubmatch(p.output())
	if m == nil {
		return "", fmt.Errorf("no 'metrics: serving on' line yet")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m[1]+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestDRADroppedFields: a control plane with DRADeviceTaints and DRAConsumableCapacity off (a
// 1.34 or 1.35 one by default) drops device taints, allowMultipleAllocations and the capacities'
// requestPolicy (keeping their values) from the slices it stores, without an error. The driver compares every write's answer with what it sent: it logs
// a warning naming the feature gate, counts the field in
// rdma_device_plugin_dra_dropped_fields_total{field}, and, for taints, stops offering the HCA
// whose port is down (no device, rather than an untainted one the scheduler would allocate and
// Prepare would refuse).
func TestDRADroppedFields(t *testing.T) {
	featuregatetesting.SetFeatureGatesDuringTest(t, utilfeature.DefaultFeatureGate, featuregatetesting.FeatureOverrides{
		features.DRADeviceTaints:       false,
		features.DRAConsumableCapacity: false,
	})
	const node = "dra-node"
	cp := draControlPlane(t, node)
	discovery := draFixtureNode(t, "dgx-h100-like.xml")
	// mlx5_0's only port goes down before the driver starts.
	state := filepath.Join(discovery[3], "sys", "class", "infiniband", "mlx5_0", "ports", "1", "state")
	if err := os.WriteFile(state, []byte("1: DOWN\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const down = "hca-0000-1a-00-0"
	root := shortDir(t)
	var pods []*v1.Pod
	kubelet := startDRAKubelet(t, cp, node, root, t.TempDir(), func() []*v1.Pod { return pods })
	defer kubelet.stop()
	kubeconfig := writeJSONKubeconfig(t, cp, map[string]any{"tokenFile": draServiceAccount(t, cp)})
	driver := startDRAProcess(t, append([]string{"dra", "--mode", "shared", "--node-name", node, "--kubeconfig", kubeconfig,
		"--kubelet-dir", root, "--cdi-root", filepath.Join(t.TempDir(), "cdi"), "--log-level", "debug",
		"--metrics-address", "127.0.0.1:0"}, discovery...))
	all := draNodeSlices(t, node, "shared", discovery)
	healthy := 0
	for _, d := range all[0].Spec.Devices {
		if d.Name != down {
			healthy++
		}
	}

	waitFor(t, settle, "the slices without the HCA whose port is down", func(ctx context.Context) (bool, string, error) {
		got, err := nodeSlices(ctx, cp, node)
		if err != nil {
			return false, "", err
		}
		var names []string
		for _, s := range got {
			for _, d := range s.Spec.Devices {
				names = append(names, d.Name)
				if d.Name == down {
					return false, fmt.Sprintf("%s offered, taints %v", down, d.Taints), nil
				}
			}
		}
		return len(names) == healthy, fmt.Sprintf("devices %v", names), nil
	})
	waitFor(t, settle, "the dropped fields counted", func(ctx context.Context) (bool, string, error) {
		m, err := scrape(ctx, driver)
		if err != nil {
			return false, err.Error(), nil
		}
		var seen []string
		for _, field := range []string{"taints", "allowMultipleAllocations", "capacity.requestPolicy"} {
			if regexp.MustCompile(`(?m)^rdma_device_plugin_dra_dropped_fields_total\{field="` + field + `"\} [1-9]`).MatchString(m) {
				seen = append(seen, field)
			}
		}
		return len(seen) == 3, fmt.Sprintf("counted: %v", seen), nil
	})
	log := driver.output()
	for _, gate := range []string{"DRADeviceTaints", "DRAConsumableCapacity"} {
		if !strings.Contains(log, "the feature gate "+gate+" is off") {
			t.Errorf("no warning naming %s in the driver's log", gate)
		}
	}
}
