package realnode

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/rdma-device-plugin/rdma-device-plugin/test/kubelet"
)

// TestRealNodeBench measures what the plugin adds where a user feels it, on the real node with
// the chart as users run it (health poll at the chart's default, NRI on), and writes the figures
// to the JSON file RDP_REAL_NODE_BENCH names (scripts/bench.sh --real-node; docs/benchmarks.md).
// Without RDP_REAL_NODE_BENCH it skips, so ctest real_node does not run it. Each part fails the
// test when what it measures is not what it claims (a pod that does not start, a container the
// NRI plugin did or did not adjust against the condition, a failed scrape, a restarted plugin).
//
//   - pod_start_added_ms: pods asking for one HCA and the same pods without, interleaved, one at
//     a time; each from the client's Create call to the kubelet's "Started" event of its
//     container (the kubelet's log at -v 3, microseconds); the percentiles of the HCA pods minus
//     those of the others, through the device plugin and through DRA (a ResourceClaimTemplate).
//   - nri_create_us: containerd's CreateContainer (the CRI call the kubelet makes, NRI hooks
//     included) per container from containerd's log (nanoseconds), with our NRI plugin connected
//     minus with containerd's NRI on and no plugin connected (the NRI container removed from the
//     DaemonSet); containers without and with an HCA in the same pods.
//   - node_overhead: the plugin pod's containers over a window at rest with both metrics
//     endpoints scraped every 15 s: their cgroups' cpuacct.usage, and the largest sum of their
//     processes' VmRSS (what else it samples, it logs).
//
// The node's logs of each part (kubelet, containerd, the plugin's containers) are kept beside the
// JSON, in OUT-logs/deviceplugin and OUT-logs/dra. RDP_REAL_NODE_BENCH_WINDOW (default 10m),
// RDP_REAL_NODE_BENCH_PODS (pods of each kind, default 30) and RDP_REAL_NODE_BENCH_NRI_PODS
// (pods of 4 + 4 containers per condition, default 26) shorten a run.
func TestRealNodeBench(t *testing.T) {
	out := os.Getenv("RDP_REAL_NODE_BENCH")
	if out == "" {
		t.Skip("RDP_REAL_NODE_BENCH names no output file (scripts/bench.sh --real-node sets it)")
	}
	window := kubelet.EnvDuration(t, "RDP_REAL_NODE_BENCH_WINDOW", 10*time.Minute)
	pods := kubelet.EnvInt(t, "RDP_REAL_NODE_BENCH_PODS", 30)
	nriPods := kubelet.EnvInt(t, "RDP_REAL_NODE_BENCH_NRI_PODS", 26)
	t.Setenv("RDP_REAL_NODE_HEALTH_INTERVAL", "")      // the chart's default
	logs := strings.TrimSuffix(out, ".json") + "-logs" // the node's logs of each part
	r := benchReport{Conditions: map[string]any{
		"pods_per_kind": pods, "nri_containers_per_kind_and_condition": nriPods * 4,
		"overhead_window_s": window.Seconds(), "cpus": numCPU(), "load_average_at_start": loadAverage()}}
	write := func() {
		r.Conditions["load_average_at_end"] = loadAverage()
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
			t.Errorf("writing %s: %v", out, err)
		}
		t.Logf("%s:\n%s", out, b)
	}
	defer write()

	t.Run("DevicePlugin", func(t *testing.T) {
		c := up(t, "--driver", "deviceplugin", "--mode", "exclusive", "--nri")
		c.waitNRIConnected()
		c.checkDefaultHealthInterval()
		r.NodeOverhead = c.overhead(window)
		hcaPod := func(name string) *v1.Pod { return workloadPod(name, nil, ctr{name: "c", limits: hca(1)}) }
		r.PodStart.DevicePluginP50, r.PodStart.DevicePluginP95 = c.podStartAdded("dp", pods, hcaPod, func() {})
		r.NRICreate = c.nriCreate(nriPods)
		c.saveLogs(logs + "/deviceplugin")
	})
	t.Run("DRA", func(t *testing.T) {
		c := up(t, "--driver", "dra", "--mode", "exclusive", "--nri")
		c.waitNRIConnected()
		c.claimTemplate("bench-hca", request("hca", hcaClass, 1))
		hcaPod := func(name string) *v1.Pod {
			p := workloadPod(name, nil, ctr{name: "c", claims: []v1.ResourceClaim{{Name: "hca"}}})
			p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "hca", ResourceClaimTemplateName: ptr.To("bench-hca")}}
			return p
		}
		r.PodStart.DRAP50, r.PodStart.DRAP95 = c.podStartAdded("dra", pods, hcaPod, c.waitNoClaims)
		c.saveLogs(logs + "/dra")
	})
}

// benchReport is real-node.json; its keys are the ones docs/benchmarks.md names. A figure not
// measured (its part failed) is null.
type benchReport struct {
	PodStart struct {
		DevicePluginP50 *float64 `json:"deviceplugin_p50"`
		DevicePluginP95 *float64 `json:"deviceplugin_p95"`
		DRAP50          *float64 `json:"dra_p50"`
		DRAP95          *float64 `json:"dra_p95"`
	} `json:"pod_start_added_ms"`
	NRICreate    nriFigures      `json:"nri_create_us"`
	NodeOverhead overheadFigures `json:"node_overhead"`
	Conditions   map[string]any  `json:"conditions"`
}

type nriFigures struct {
	NoHCAP50 *float64 `json:"no_hca_p50"`
	NoHCAP99 *float64 `json:"no_hca_p99"`
	HCAP99   *float64 `json:"hca_p99"`
}

type overheadFigures struct {
	CPUMillicores *float64 `json:"cpu_millicores"`
	RSSMiB        *float64 `json:"rss_mib"`
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "\nprocessor") + 1
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// percentile: linear interpolation between the closest ranks of the sorted samples (numpy's
// default), p in [0, 100].
func percentile(samples []float64, p float64) float64 {
	s := append([]float64(nil), samples...)
	sort.Float64s(s)
	if len(s) == 0 {
		return math.NaN()
	}
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

func round1(v float64) *float64 {
	r := math.Round(v*10) / 10
	return &r
}

// checkDefaultHealthInterval: the plugin container runs without --health-interval (the
// binary's default, as the chart leaves it).
func (c *cluster) checkDefaultHealthInterval() {
	c.t.Helper()
	for _, ctr := range c.driverDaemonSet().Spec.Template.Spec.Containers {
		for _, a := range append(ctr.Command, ctr.Args...) {
			if strings.HasPrefix(a, "--health-interval") {
				c.t.Fatalf("the plugin runs with %s, not the chart's default", a)
			}
		}
	}
}

// --- Pod start ---------------------------------------------------------------------------------

// podStartAdded starts n pods that hcaPod makes and n plain ones (one container, no HCA),
// interleaved and one at a time, each deleted and settle called before the next; it returns the
// HCA pods' p50 and p95 minus the plain pods' (ms), from the client's Create to the kubelet's
// "Started" event, and logs where the time goes (kubelet events, containerd's CreateContainer).
func (c *cluster) podStartAdded(mode string, n int, hcaPod func(string) *v1.Pod, settle func()) (*float64, *float64) {
	c.t.Helper()
	created := map[string]time.Time{}
	var names [2][]string // [0] plain, [1] HCA
	for i := 0; i < n; i++ {
		order := []int{1, 0}
		if i%2 == 1 {
			order = []int{0, 1}
		}
		for _, k := range order {
			name := fmt.Sprintf("start-%s-%s-%02d", mode, []string{"plain", "hca"}[k], i)
			p := workloadPod(name, nil, ctr{name: "c"})
			if k == 1 {
				p = hcaPod(name)
			}
			created[name] = time.Now()
			c.create(p)
			c.waitRunning(podTimeout, name)
			c.deletePods(podTimeout, name)
			settle()
			names[k] = append(names[k], name)
		}
	}
	ev := c.kubeletEvents()
	creates := c.containerdCreates()
	var start [2][]float64
	var stages [2]map[string][]float64
	for k := range names {
		stages[k] = map[string][]float64{}
		for _, name := range names[k] {
			e := ev[testNS+"/"+name]
			if e["Started"].IsZero() {
				c.t.Fatalf("the kubelet's log has no Started event of pod %s", name)
			}
			t0 := created[name]
			start[k] = append(start[k], ms(e["Started"].Sub(t0)))
			stages[k]["create->kubelet ADD"] = append(stages[k]["create->kubelet ADD"], ms(e["ADD"].Sub(t0)))
			stages[k]["ADD->Pulled (admission, sandbox)"] = append(stages[k]["ADD->Pulled (admission, sandbox)"], ms(e["Pulled"].Sub(e["ADD"])))
			stages[k]["Pulled->Created"] = append(stages[k]["Pulled->Created"], ms(e["Created"].Sub(e["Pulled"])))
			stages[k]["Created->Started"] = append(stages[k]["Created->Started"], ms(e["Started"].Sub(e["Created"])))
			if d, ok := creates[podContainer{name, "c"}]; ok {
				stages[k]["containerd CreateContainer"] = append(stages[k]["containerd CreateContainer"], ms(d))
			}
		}
	}
	for k, kind := range []string{"plain", "hca"} {
		c.t.Logf("%s %s pods (%d): create->Started p50 %.1f ms, p95 %.1f ms, max %.1f ms", mode, kind, len(start[k]),
			percentile(start[k], 50), percentile(start[k], 95), percentile(start[k], 100))
		var keys []string
		for s := range stages[k] {
			keys = append(keys, s)
		}
		sort.Strings(keys)
		for _, s := range keys {
			c.t.Logf("  %s: p50 %.1f ms, p95 %.1f ms", s, percentile(stages[k][s], 50), percentile(stages[k][s], 95))
		}
	}
	p50 := percentile(start[1], 50) - percentile(start[0], 50)
	p95 := percentile(start[1], 95) - percentile(start[0], 95)
	c.t.Logf("%s: added p50 %.1f ms, p95 %.1f ms", mode, p50, p95)
	return round1(p50), round1(p95)
}

// saveLogs copies the node's logs (the kubelet's, containerd's, ...) and writes the plugin pod's
// containers' logs (plugin-NAME.log) to dir, which outlives the node (the next up clears its
// run directory), for reading where the time went.
func (c *cluster) saveLogs(dir string) {
	c.t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	logs, _ := filepath.Glob(filepath.Join(c.run, "logs", "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, filepath.Base(l)), b, 0o644)
		}
		if err != nil {
			c.t.Error(err)
		}
	}
	for _, p := range c.driverPods(c.driverDaemonSet()) {
		for _, ctr := range p.Spec.Containers {
			raw, err := c.client.CoreV1().Pods(pluginNS).GetLogs(p.Name, &v1.PodLogOptions{Container: ctr.Name, Timestamps: true}).Do(c.ctx()).Raw()
			if err != nil {
				c.t.Errorf("the log of %s/%s: %v", p.Name, ctr.Name, err)
				continue
			}
			if err := os.WriteFile(filepath.Join(dir, "plugin-"+ctr.Name+".log"), raw, 0o644); err != nil {
				c.t.Error(err)
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// claimTemplate creates a ResourceClaimTemplate in the test namespace.
func (c *cluster) claimTemplate(name string, requests ...resourceapi.DeviceRequest) {
	c.t.Helper()
	_, err := c.client.ResourceV1().ResourceClaimTemplates(testNS).Create(c.ctx(), &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: requests}}},
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("claim template %s: %v", name, err)
	}
}

// waitNoClaims waits until the resource-claim controller removed the claims of deleted pods.
func (c *cluster) waitNoClaims() {
	c.t.Helper()
	eventually(c.t, podTimeout, "no ResourceClaim left", func() (bool, string) {
		l, err := c.client.ResourceV1().ResourceClaims(testNS).List(c.ctx(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d claims", len(l.Items))
	})
}

// klogLine: a klog header ("I1206 09:31:02.123456 ...") and the rest of the line.
var klogLine = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})\s+\d+\s+\S+\] (.*)$`)
var (
	eventLine   = regexp.MustCompile(`"Event occurred" object="([^"]+)".* kind="Pod".* reason="(\w+)"`)
	syncAddLine = regexp.MustCompile(`"SyncLoop ADD" source="api" pods=\[([^\]]*)\]`)
)

// kubeletEvents: from the kubelet's log, per pod ("ns/name"), when the kubelet first logged each
// of its events (Pulled, Created, Started, ...) and its SyncLoop ADD ("ADD").
func (c *cluster) kubeletEvents() map[string]map[string]time.Time {
	c.t.Helper()
	f, err := os.Open(filepath.Join(c.run, "logs", "kubelet.log"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	year := time.Now().Year()
	out := map[string]map[string]time.Time{}
	note := func(pod, what string, at time.Time) {
		if out[pod] == nil {
			out[pod] = map[string]time.Time{}
		}
		if _, seen := out[pod][what]; !seen {
			out[pod][what] = at
		}
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		m := klogLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err := time.ParseInLocation("2006 0102 15:04:05.000000", fmt.Sprintf("%d %s", year, m[1]), time.Local)
		if err != nil {
			continue
		}
		if e := eventLine.FindStringSubmatch(m[2]); e != nil {
			note(e[1], e[2], at)
		} else if a := syncAddLine.FindStringSubmatch(m[2]); a != nil {
			for _, p := range strings.Split(a[1], ",") {
				note(strings.Trim(p, `" `), "ADD", at)
			}
		}
	}
	return out
}

// --- Container creation through containerd with and without our NRI plugin ---------------------

type podContainer struct{ pod, container string }

var (
	containerdTime = regexp.MustCompile(`^time="([^"]+)"`)
	sandboxReturns = regexp.MustCompile(`RunPodSandbox for name:\\"([^\\]+)\\".* returns sandbox id \\"([0-9a-f]+)\\"`)
	createRequest  = regexp.MustCompile(`CreateContainer within sandbox \\"([0-9a-f]+)\\" for container name:\\"([^\\]+)\\"`)
	createReturns  = regexp.MustCompile(`CreateContainer within sandbox \\"([0-9a-f]+)\\" for name:\\"([^\\]+)\\".* returns container id`)
)

// containerdCreates: from containerd's log, how long each CreateContainer took (its request
// logged to its return logged), by pod and container name.
func (c *cluster) containerdCreates() map[podContainer]time.Duration {
	c.t.Helper()
	f, err := os.Open(filepath.Join(c.run, "logs", "containerd.log"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	podOf := map[string]string{}
	begun := map[[2]string]time.Time{}
	out := map[podContainer]time.Duration{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := sc.Text()
		tm := containerdTime.FindStringSubmatch(l)
		if tm == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, tm[1])
		if err != nil {
			continue
		}
		if m := sandboxReturns.FindStringSubmatch(l); m != nil {
			podOf[m[2]] = m[1]
		} else if m := createRequest.FindStringSubmatch(l); m != nil {
			begun[[2]string{m[1], m[2]}] = at
		} else if m := createReturns.FindStringSubmatch(l); m != nil {
			if b, ok := begun[[2]string{m[1], m[2]}]; ok {
				out[podContainer{podOf[m[1]], m[2]}] = at.Sub(b)
			}
		}
	}
	return out
}

// nriCreate creates pods of 4 containers with an HCA and 4 without (alternating), one pod at a
// time: k/2 with our NRI plugin connected, k with the NRI container removed from the DaemonSet
// (containerd's NRI still on, no plugin), k/2 with it back; it returns the percentiles of
// containerd's CreateContainer with the plugin minus without, per kind (us).
func (c *cluster) nriCreate(k int) nriFigures {
	c.t.Helper()
	var with, without [2][]string // pod names, [0] plain containers, [1] HCA containers
	run := func(cond string, count int, plugin bool) []string {
		var names []string
		for i := 0; i < count; i++ {
			name := fmt.Sprintf("nri-%s-%02d", cond, i)
			var ctrs []ctr
			for j := 0; j < 8; j++ {
				x := ctr{name: fmt.Sprintf("c%d", j)}
				if j%2 == 0 {
					x.limits = hca(1)
				}
				ctrs = append(ctrs, x)
			}
			c.create(workloadPod(name, nil, ctrs...))
			c.waitRunning(podTimeout, name)
			// The condition holds: the NRI plugin adjusted the HCA container iff it is connected.
			if in := c.inside(name, "c0"); (in.memlock == c.memlock) != plugin {
				c.t.Fatalf("%s: ulimit -l %s in a container with an HCA, plugin connected %v (its limit %s)", name, in.memlock, plugin, c.memlock)
			}
			if in := c.inside(name, "c1"); in.memlock == c.memlock {
				c.t.Fatalf("%s: ulimit -l %s in a container without an HCA", name, in.memlock)
			}
			c.deletePods(podTimeout, name)
			names = append(names, name)
		}
		return names
	}
	first := run("plugin-a", k/2, true)
	saved := c.setNRIContainer(nil)
	none := run("none", k, false)
	c.setNRIContainer(saved)
	c.waitNRIConnected()
	second := run("plugin-b", k-k/2, true)
	creates := c.containerdCreates()
	collect := func(pods []string, into *[2][]string) {
		for _, p := range pods {
			for j := 0; j < 8; j++ {
				into[1-j%2] = append(into[1-j%2], fmt.Sprintf("%s/c%d", p, j))
			}
		}
	}
	collect(append(first, second...), &with)
	collect(none, &without)
	us := func(keys []string) []float64 {
		var s []float64
		for _, key := range keys {
			pod, ctrName, _ := strings.Cut(key, "/")
			d, ok := creates[podContainer{pod, ctrName}]
			if !ok {
				c.t.Fatalf("containerd's log has no CreateContainer of %s", key)
			}
			s = append(s, float64(d.Nanoseconds())/1000)
		}
		return s
	}
	var w, wo [2][]float64
	for kind := range w {
		w[kind], wo[kind] = us(with[kind]), us(without[kind])
		c.t.Logf("CreateContainer, %s containers: with our NRI plugin (%d) p50 %.0f us, p99 %.0f us; without (%d) p50 %.0f us, p99 %.0f us",
			[]string{"plain", "HCA"}[kind], len(w[kind]), percentile(w[kind], 50), percentile(w[kind], 99),
			len(wo[kind]), percentile(wo[kind], 50), percentile(wo[kind], 99))
	}
	return nriFigures{
		NoHCAP50: round1(percentile(w[0], 50) - percentile(wo[0], 50)),
		NoHCAP99: round1(percentile(w[0], 99) - percentile(wo[0], 99)),
		HCAP99:   round1(percentile(w[1], 99) - percentile(wo[1], 99)),
	}
}

// setNRIContainer removes the NRI container from the plugin's DaemonSet (restore nil; it returns
// the container removed) or puts restore back, and waits until the DaemonSet's one pod runs the
// new template with every container ready and the node's rdma/hca allocatable is back.
func (c *cluster) setNRIContainer(restore *v1.Container) *v1.Container {
	c.t.Helper()
	want := c.allocatable(hcaResource)
	ds := c.driverDaemonSet()
	old := map[string]bool{}
	for _, p := range c.driverPods(ds) {
		old[string(p.UID)] = true
	}
	var removed *v1.Container
	spec := &ds.Spec.Template.Spec
	if restore == nil {
		var keep []v1.Container
		for i := range spec.Containers {
			if spec.Containers[i].Name == "nri" {
				removed = spec.Containers[i].DeepCopy()
			} else {
				keep = append(keep, spec.Containers[i])
			}
		}
		if removed == nil {
			c.t.Fatalf("the DaemonSet %s has no nri container", ds.Name)
		}
		spec.Containers = keep
	} else {
		spec.Containers = append(spec.Containers, *restore)
	}
	if _, err := c.client.AppsV1().DaemonSets(pluginNS).Update(c.ctx(), ds, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("updating the DaemonSet %s: %v", ds.Name, err)
	}
	eventually(c.t, 2*podTimeout, "the plugin's pod replaced and ready", func() (bool, string) {
		pods := c.driverPods(ds)
		if len(pods) != 1 || old[string(pods[0].UID)] {
			return false, fmt.Sprintf("%d pods", len(pods))
		}
		p := pods[0]
		ready := p.Status.Phase == v1.PodRunning && len(p.Status.ContainerStatuses) == len(spec.Containers)
		for _, s := range p.Status.ContainerStatuses {
			ready = ready && s.Ready
		}
		return ready, podState(&p)
	})
	c.waitAllocatable(hcaResource, want, podTimeout)
	return removed
}

// --- The plugin pod at rest ----------------------------------------------------------------------

// overhead samples the plugin pod's containers at the start of window and every 15 s, scraping
// each metrics port the pod declares (the plugin's, the NRI container's) at each sample; CPU is
// the containers' cgroups' cpuacct.usage increase over the window's length, rss the largest sum
// of VmRSS over the processes in their cgroups (resident memory as ps counts it, shared
// libraries included; the cgroups' memory.stat charges file pages to whoever read them first,
// so it is logged beside it, not used).
func (c *cluster) overhead(window time.Duration) overheadFigures {
	c.t.Helper()
	pods := c.driverPods(c.driverDaemonSet())
	if len(pods) != 1 {
		c.t.Fatalf("%d plugin pods", len(pods))
	}
	pod := pods[0]
	root := c.cgroupRoot()
	var cpuDirs, memDirs, names []string
	restarts := map[string]int32{}
	for _, s := range pod.Status.ContainerStatuses {
		names = append(names, s.Name)
		id := strings.TrimPrefix(s.ContainerID, "containerd://")
		cpuDirs = append(cpuDirs, findCgroup(c.t, filepath.Join("/sys/fs/cgroup/cpuacct", root), id))
		memDirs = append(memDirs, findCgroup(c.t, filepath.Join("/sys/fs/cgroup/memory", root), id))
		restarts[s.Name] = s.RestartCount
	}
	var ports []int32
	for _, ctr := range pod.Spec.Containers {
		for _, p := range ctr.Ports {
			if strings.Contains(p.Name, "metrics") {
				ports = append(ports, p.ContainerPort)
			}
		}
	}
	if len(ports) == 0 {
		c.t.Fatalf("the plugin pod declares no metrics port")
	}
	c.t.Logf("node overhead: pod %s, containers %v, metrics ports %v, window %v", pod.Name, cpuDirs, ports, window)
	cpu := func() int64 {
		var sum int64
		for _, d := range cpuDirs {
			sum += readInt(c.t, filepath.Join(d, "cpuacct.usage"))
		}
		return sum
	}
	var rssMax, rssSum, chargedMax float64
	var samples int
	var atMax []string // per container at the largest sample: its resident set in parts
	sample := func() {
		var rss, charged int64
		var parts []string
		for i, d := range memDirs {
			var st map[string]int64
			for _, pid := range strings.Fields(readFile(c.t, filepath.Join(d, "cgroup.procs"))) {
				st = procMemory(pid, st)
			}
			rss += st["VmRSS"]
			parts = append(parts, fmt.Sprintf("%s: VmRSS %.1f MiB (anonymous %.1f, file %.1f), Pss %.1f MiB",
				names[i], mib(st["VmRSS"]), mib(st["RssAnon"]), mib(st["RssFile"]), mib(st["Pss"])))
			mst := memStat(c.t, filepath.Join(d, "memory.stat"))
			charged += mst["total_rss"] + mst["total_mapped_file"]
		}
		total := mib(rss)
		if total > rssMax {
			atMax = parts
		}
		rssMax = math.Max(rssMax, total)
		chargedMax = math.Max(chargedMax, mib(charged))
		rssSum += total
		samples++
		for _, port := range ports {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
			if err != nil {
				c.t.Fatalf("scraping port %d: %v", port, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				c.t.Fatalf("scraping port %d: %s", port, resp.Status)
			}
		}
	}
	// Each container's long-running processes (the plugin, the NRI plugin): their own CPU time
	// beside their cgroup's, which also counts what runs in the container for a while (the
	// kubelet's exec probes).
	var perCPU0 []int64
	procs := make([]map[string]int64, len(cpuDirs))
	for i, d := range cpuDirs {
		perCPU0 = append(perCPU0, readInt(c.t, filepath.Join(d, "cpuacct.usage")))
		procs[i] = map[string]int64{}
		for _, pid := range strings.Fields(readFile(c.t, filepath.Join(d, "cgroup.procs"))) {
			procs[i][pid] = cpuTicks(pid)
		}
	}
	start, cpu0 := time.Now(), cpu()
	sample()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for time.Since(start) < window {
		<-tick.C
		sample()
	}
	elapsed, used := time.Since(start), cpu()-cpu0
	for _, s := range c.driverPods(c.driverDaemonSet())[0].Status.ContainerStatuses {
		if s.RestartCount != restarts[s.Name] {
			c.t.Fatalf("container %s restarted during the window", s.Name)
		}
	}
	millicores := float64(used) / float64(elapsed.Nanoseconds()) * 1000
	c.t.Logf("node overhead over %v: %.2f millicores, rss max %.1f MiB, mean %.1f MiB (%d samples); the cgroups' own rss + mapped_file at most %.1f MiB",
		elapsed.Round(time.Second), millicores, rssMax, rssSum/float64(samples), samples, chargedMax)
	for _, p := range atMax {
		c.t.Logf("  at the largest: %s", p)
	}
	for i, d := range cpuDirs {
		var ticks int64
		for pid, t0 := range procs[i] {
			ticks += cpuTicks(pid) - t0
		}
		c.t.Logf("  container %s: %.2f millicores, of which its processes running at the start %.2f (the rest: processes started in it since, e.g. exec probes)", names[i],
			float64(readInt(c.t, filepath.Join(d, "cpuacct.usage"))-perCPU0[i])/float64(elapsed.Nanoseconds())*1000,
			float64(ticks)*10/elapsed.Seconds())
	}
	return overheadFigures{CPUMillicores: round1(millicores), RSSMiB: round1(rssMax)}
}

// cgroupRoot: the kubelet's cgroupRoot (real-node.sh's run/kubelet.yaml), without its "/".
func (c *cluster) cgroupRoot() string {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.run, "kubelet.yaml"))
	if err != nil {
		c.t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "cgroupRoot: /"); ok {
			return strings.TrimSpace(v)
		}
	}
	c.t.Fatalf("no cgroupRoot in %s/kubelet.yaml", c.run)
	return ""
}

// findCgroup: the directory under root named id (a container's cgroup).
func findCgroup(t *testing.T, root, id string) string {
	t.Helper()
	var found string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == id {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no cgroup of container %s under %s", id, root)
	}
	return found
}

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(readFile(t, path)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// procMemory adds process pid's VmRSS, RssAnon and RssFile (/proc/PID/status) and Pss
// (smaps_rollup) to sum, in bytes (nothing for a process that is gone).
func procMemory(pid string, sum map[string]int64) map[string]int64 {
	if sum == nil {
		sum = map[string]int64{}
	}
	for _, f := range []string{"status", "smaps_rollup"} {
		b, _ := os.ReadFile(filepath.Join("/proc", pid, f))
		for _, l := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok || (k != "VmRSS" && k != "RssAnon" && k != "RssFile" && k != "Pss") {
				continue
			}
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			sum[k] += kb << 10
		}
	}
	return sum
}

// cpuTicks: process pid's user + system time in clock ticks (USER_HZ, 100 a second), its
// exited threads included; 0 when it is gone.
func cpuTicks(pid string) int64 {
	b, _ := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // after the command name
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

func memStat(t *testing.T, path string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, l := range strings.Split(readFile(t, path), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			out[k] = n
		}
	}
	return out
}
