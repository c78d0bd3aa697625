package realnode

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// reloadTimeout: how soon after a driver reload a new pod asking one HCA must run.
const reloadTimeout = 2 * time.Minute

// driverReload: what an RDMA driver reload does to the node's /dev, while pod `holder` (container
// "c") holds HCAs: devtmpfs removes /dev/infiniband with its last node, and makes a new directory
// when the nodes come back. Here the directory is removed, the plugin is seen to take the node's
// HCAs as unusable, and a new directory is made with the same nodes. The plugin (which mounts the
// node's /dev, not the old /dev/infiniband) sees the new nodes: every HCA healthy again; the
// holder still sees what it saw and `accounting` (what the plugin keeps of the running pods)
// says what it said; a new pod asking one HCA runs within reloadTimeout with exactly one HCA that
// is not the holder's.
func driverReload(t *testing.T, c *cluster, holder string, accounting func() string) {
	before := c.inside(holder, "c")
	held := ncclHCAs(before.env["NCCL_IB_HCA"])
	kept := accounting()
	t.Logf("before the reload: %s holds %v and sees %s; accounting:\n%s", holder, held, describe(before), kept)
	watched := c.usableHCAs()[0]
	unhealthy, err := c.containerLogLines("rdma-device-plugin", "HCA "+watched+" ", "is now unhealthy")
	if err != nil {
		t.Fatal(err)
	}
	healthy, err := c.containerLogLines("rdma-device-plugin", "HCA "+watched+" ", "is now healthy")
	if err != nil {
		t.Fatal(err)
	}

	// The nodes as the kernel has them (name, major and minor in hex, mode), then no directory.
	nodes := strings.Fields(c.inNS("sh", "-c", `cd /dev/infiniband && for f in *; do stat -c '%n:%t:%T:%a' "$f"; done`))
	if len(nodes) == 0 {
		t.Fatal("the node's /dev/infiniband is empty")
	}
	c.inNS("rm", "-rf", "/dev/infiniband")
	c.waitContainerLogMore("rdma-device-plugin", len(unhealthy), "HCA "+watched+" ", "is now unhealthy")
	remake := []string{"set -e", "mkdir /dev/infiniband"}
	for _, n := range nodes {
		f := strings.Split(n, ":")
		if len(f) != 4 {
			t.Fatalf("stat of the node's /dev/infiniband: %q", n)
		}
		remake = append(remake, fmt.Sprintf("mknod -m %s /dev/infiniband/%s c $((0x%s)) $((0x%s))", f[3], f[0], f[1], f[2]))
	}
	start := time.Now()
	c.inNS("sh", "-c", strings.Join(remake, "\n"))
	t.Logf("/dev/infiniband removed and made again with %d nodes", len(nodes))
	c.waitContainerLogMore("rdma-device-plugin", len(healthy), "HCA "+watched+" ", "is now healthy")

	now := parseProbe(t, c.execSoon(holder, "c", probe))
	if describe(now) != describe(before) {
		t.Errorf("after the reload %s sees %s, before %s", holder, describe(now), describe(before))
	}
	if after := accounting(); after != kept {
		t.Errorf("after the reload the plugin's accounting of the running pods is\n%s\nbefore\n%s", after, kept)
	}

	c.create(workloadPod("after-reload", nil, ctr{name: "c", limits: hca(1)}))
	c.waitRunning(reloadTimeout, "after-reload")
	in := c.inside("after-reload", "c")
	got := ncclHCAs(in.env["NCCL_IB_HCA"])
	t.Logf("a new pod %s after the reload: %s", time.Since(start).Round(time.Second), describe(in))
	if len(got) != 1 {
		t.Errorf("after-reload: NCCL_IB_HCA=%q, want one HCA", in.env["NCCL_IB_HCA"])
	}
	c.checkExactly("after-reload", in, got)
	for _, h := range got {
		for _, x := range held {
			if h == x {
				t.Errorf("after-reload got %s, which %s holds", h, holder)
			}
		}
	}
	c.deletePods(podTimeout, "after-reload")
}

// heldSeries: the device plugin's hca_allocated series (which container holds which HCA, from
// the kubelet's pod-resources) of `pods`, sorted. Pods that run throughout: the plugin's view of
// a pod that has just been deleted trails by up to a refresh.
func (c *cluster) heldSeries(pods ...string) string {
	c.t.Helper()
	var out []string
	for _, l := range strings.Split(c.pluginScrape(), "\n") {
		if !strings.HasPrefix(l, "rdma_device_plugin_hca_allocated{") {
			continue
		}
		for _, p := range pods {
			if strings.Contains(l, `,pod="`+p+`",`) {
				out = append(out, l)
			}
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// pluginScrape: GET /metrics of the running plugin pod (hostNetwork here: its --metrics-address
// port on 127.0.0.1).
func (c *cluster) pluginScrape() string {
	c.t.Helper()
	pods, err := c.client.CoreV1().Pods(pluginNS).List(c.ctx(), metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != v1.PodRunning {
			continue
		}
		for _, ctr := range p.Spec.Containers {
			if ctr.Name != "rdma-device-plugin" {
				continue
			}
			for _, a := range ctr.Args {
				if !strings.HasPrefix(a, "--metrics-address=") {
					continue
				}
				port := a[strings.LastIndex(a, ":")+1:]
				client := http.Client{Timeout: 10 * time.Second}
				resp, err := client.Get("http://127.0.0.1:" + port + "/metrics")
				if err != nil {
					c.t.Fatalf("scraping the plugin: %v", err)
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != http.StatusOK {
					c.t.Fatalf("scraping the plugin: %s %v", resp.Status, err)
				}
				return string(body)
			}
		}
	}
	c.t.Fatal("no running plugin pod with --metrics-address")
	return ""
}
