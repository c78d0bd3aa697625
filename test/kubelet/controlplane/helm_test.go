package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	daemonutil "k8s.io/kubernetes/pkg/controller/daemon/util"
	"sigs.k8s.io/yaml"
)

const (
	exclusiveKey = "rdma.network.alibabacloud.com/exclusive"
	rdmaLabel    = "feature.node.kubernetes.io/pci-15b3.present"
	// Any RDMA NIC, as NFD's rdma source says it, and a Broadcom NIC by NFD's pci source.
	rdmaCapableLabel = "feature.node.kubernetes.io/rdma.capable"
	broadcomLabel    = "feature.node.kubernetes.io/pci-14e4.present"
	// The image reference the scenarios install with; nothing pulls it (no kubelet).
	testRepository = "localhost/rdma-device-plugin"
	settle         = 60 * time.Second
)

// The kinds of node the chart must tell apart.
const (
	gpuNode          = "gpu-exclusive"    // RDMA NIC (NFD label), exclusive label, GPU taint
	rdmaNode         = "rdma-unlabelled"  // RDMA NIC, no exclusive label
	broadcomNode     = "broadcom-rdma"    // a Broadcom NIC (NFD's pci vendor label), no exclusive label
	nfdRdmaNode      = "nfd-rdma-capable" // an RDMA device by NFD's rdma source only
	cpuNode          = "cpu-only"         // no RDMA NIC
	controlPlaneNode = "control-plane"    // RDMA NIC label but the control-plane taint
)

func testNodes() []*v1.Node {
	node := func(name string, labels map[string]string, taints ...v1.Taint) *v1.Node {
		l := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
		for k, v := range labels {
			l[k] = v
		}
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
			Spec: v1.NodeSpec{Taints: taints}}
	}
	return []*v1.Node{
		node(gpuNode, map[string]string{rdmaLabel: "true", exclusiveKey: "true", "nvidia.com/gpu.present": "true"},
			v1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: v1.TaintEffectNoSchedule}),
		node(rdmaNode, map[string]string{rdmaLabel: "true"}),
		node(broadcomNode, map[string]string{broadcomLabel: "true"}),
		node(nfdRdmaNode, map[string]string{rdmaCapableLabel: "true"}),
		node(cpuNode, nil),
		node(controlPlaneNode, map[string]string{rdmaLabel: "true", "node-role.kubernetes.io/control-plane": ""},
			v1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: v1.TaintEffectNoSchedule}),
	}
}

// addReadyNode creates the node as a joined, Ready node looks (createReadyNode); it fails the test
// when the server refuses.
func addReadyNode(t *testing.T, c kubernetes.Interface, n *v1.Node) {
	t.Helper()
	if err := createReadyNode(context.Background(), c, n); err != nil {
		t.Fatal(err)
	}
}

// createReadyNode creates the node as a joined, Ready node looks: the API server's
// TaintNodesByCondition admission gives every new node node.kubernetes.io/not-ready:NoSchedule,
// which a DaemonSet pod does not tolerate (only not-ready:NoExecute); on a real cluster the
// kubelet then reports Ready and the node lifecycle controller lifts the taint. Neither runs
// here, so this does both. Safe to call from several goroutines.
func createReadyNode(ctx context.Context, c kubernetes.Interface, n *v1.Node) error {
	created, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	now := metav1.Now()
	created.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue,
		Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	// What a kubelet reports, so that the scheduler's resource fit has room for the pods.
	room := v1.ResourceList{v1.ResourceCPU: resource.MustParse("64"),
		v1.ResourceMemory: resource.MustParse("256Gi"), v1.ResourcePods: resource.MustParse("110")}
	created.Status.Capacity, created.Status.Allocatable = room, room
	if created, err = c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", n.Name, err)
	}
	var taints []v1.Taint
	for _, taint := range created.Spec.Taints {
		if taint.Key != v1.TaintNodeNotReady {
			taints = append(taints, taint)
		}
	}
	created.Spec.Taints = taints
	if _, err := c.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s taints: %w", n.Name, err)
	}
	return nil
}

// repoRoot is the repository this file is in (test/kubelet/controlplane/).
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// helmBinary: $RDP_HELM, PATH, then <repo>/build/tools/bin/helm (scripts/get-helm.sh).
func helmBinary(t *testing.T) string {
	if h := os.Getenv("RDP_HELM"); h != "" {
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	h := filepath.Join(repoRoot(), "build", "tools", "bin", "helm")
	if _, err := os.Stat(h); err != nil {
		t.Skip("helm not found (RDP_HELM, PATH, build/tools/bin/helm): run scripts/get-helm.sh build/tools/bin")
	}
	return h
}

// helm runs the real helm binary against the control plane, with its own cache and config
// directories, under a deadline.
type helm struct {
	t          *testing.T
	bin, chart string
	env        []string
}

func newHelm(t *testing.T, cp *ControlPlane) *helm {
	home := t.TempDir()
	return &helm{t: t, bin: helmBinary(t), chart: filepath.Join(repoRoot(), "charts", "rdma-device-plugin"),
		env: append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig, "HELM_CACHE_HOME="+home+"/cache",
			"HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")}
}

// run returns helm's combined output and error.
func (h *helm) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env = h.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (h *helm) must(args ...string) string {
	h.t.Helper()
	out, err := h.run(args...)
	if err != nil {
		h.t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// placement is, per node, the modes of the release's DaemonSet pods bound to it; a pod the
// scheduler has not bound (yet) counts as "unbound:<the node its affinity names>".
type placement map[string][]string

func (p placement) String() string {
	nodes := make([]string, 0, len(p))
	for n := range p {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "%s=%v ", n, p[n])
	}
	return strings.TrimSpace(b.String())
}

func podPlacement(pods []v1.Pod) placement {
	p := placement{}
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || pod.Labels["app.kubernetes.io/component"] == "test" {
			continue
		}
		node := pod.Spec.NodeName
		if node == "" {
			target, err := daemonutil.GetTargetNodeName(pod)
			if err != nil {
				target = "?" + pod.Name
			}
			node = "unbound:" + target
		}
		p[node] = append(p[node], pod.Labels["app.kubernetes.io/component"])
		sort.Strings(p[node])
	}
	return p
}

func releasePods(ctx context.Context, c kubernetes.Interface, ns, release string) ([]v1.Pod, error) {
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// waitFor polls cond every 100 ms until it holds or the deadline passes; the last explanation
// is the failure message.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true,
		func(ctx context.Context) (bool, error) {
			ok, why, err := cond(ctx)
			if err != nil && ctx.Err() != nil { // the deadline passed during this check
				return false, nil
			}
			last = why
			return ok, err
		})
	if err != nil {
		t.Fatalf("%s: not within %v: %v; last seen: %s", what, timeout, err, last)
	}
}

// waitSettled waits until the release's DaemonSets have been synced by the controller at their
// current generation, every pod runs the current template, and the pods are bound as want says
// (nil: wherever the DaemonSets desire, every pod bound; check is then not applied).
func waitSettled(t *testing.T, c kubernetes.Interface, ns, release string, want placement, check func(*v1.Pod) string) {
	t.Helper()
	waitFor(t, settle, fmt.Sprintf("release %s/%s settles at %v", ns, release, want),
		func(ctx context.Context) (bool, string, error) {
			dss, err := c.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
			if err != nil {
				return false, "", err
			}
			pods, err := releasePods(ctx, c, ns, release)
			if err != nil {
				return false, "", err
			}
			desired := map[string]int32{}
			for _, ds := range dss.Items {
				st := ds.Status
				if st.ObservedGeneration != ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled ||
					st.CurrentNumberScheduled != st.DesiredNumberScheduled {
					return false, fmt.Sprintf("%s status %+v at generation %d", ds.Name, st, ds.Generation), nil
				}
				if st.DesiredNumberScheduled > 0 {
					desired[ds.Labels["app.kubernetes.io/component"]] = st.DesiredNumberScheduled
				}
			}
			got := podPlacement(pods)
			if want == nil { // whatever the DaemonSets desire, every pod bound
				var scheduled int32
				for _, d := range desired {
					scheduled += d
				}
				n := 0
				for node, modes := range got {
					if strings.HasPrefix(node, "unbound:") {
						return false, fmt.Sprintf("placement %v: not every pod bound", got), nil
					}
					n += len(modes)
				}
				return int32(n) == scheduled, fmt.Sprintf("placement %v, desired per DaemonSet %v", got, desired), nil
			}
			if got.String() != want.String() {
				return false, fmt.Sprintf("placement %v, desired per DaemonSet %v", got, desired), nil
			}
			wantDesired := map[string]int32{}
			for _, modes := range want {
				for _, m := range modes {
					wantDesired[m]++
				}
			}
			if fmt.Sprint(desired) != fmt.Sprint(wantDesired) {
				return false, fmt.Sprintf("desired per DaemonSet %v, want %v", desired, wantDesired), nil
			}
			if check != nil {
				for i := range pods {
					if why := check(&pods[i]); why != "" {
						return false, pods[i].Name + ": " + why, nil
					}
				}
			}
			return true, "", nil
		})
}

func setExclusiveLabel(t *testing.T, c kubernetes.Interface, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, exclusiveKey)
	if !on {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, exclusiveKey)
	}
	if _, err := c.CoreV1().Nodes().Patch(context.Background(), node, "application/merge-patch+json",
		[]byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("label %s: %v", node, err)
	}
}

// bothModesSeen watches the release's pods and reports, when stopped, the nodes that at some
// moment had a live pod of each DaemonSet.
func bothModesSeen(t *testing.T, c kubernetes.Interface, ns, release string) (stop func() []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release,
		ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]v1.Pod{}
	for _, p := range list.Items {
		live[p.Name] = p
	}
	both := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*v1.Pod)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted {
				delete(live, pod.Name)
			} else {
				live[pod.Name] = *pod
			}
			pods := make([]v1.Pod, 0, len(live))
			for _, p := range live {
				pods = append(pods, p)
			}
			for node, modes := range podPlacement(pods) {
				if len(modes) > 1 {
					both[node] = true
				}
			}
		}
	}()
	return func() []string {
		cancel()
		w.Stop()
		<-done
		var nodes []string
		for n := range both {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		return nodes
	}
}

// renderTestPod renders the chart's helm test hook with extra helm flags.
func (h *helm) renderTestPod(args ...string) *v1.Pod {
	h.t.Helper()
	out := h.must(append([]string{"template", "rdp", h.chart, "-n", "kube-system", "--set", "image.repository=" + testRepository,
		"--show-only", "templates/tests/check-pod.yaml"}, args...)...)
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(out), nil, nil)
	if err != nil {
		h.t.Fatalf("decode the test hook: %v\n%s", err, out)
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		h.t.Fatalf("the test hook is a %T", obj)
	}
	return pod
}

// schedulableOn is the nodes whose labels the pod's required node affinity matches and whose
// NoSchedule/NoExecute taints it tolerates: where the scheduler could place it.
func schedulableOn(t *testing.T, pod *v1.Pod, nodes []*v1.Node) []string {
	var out []string
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	for _, n := range nodes {
		ok, err := affinity.Match(n)
		if err != nil {
			t.Fatalf("affinity of %s: %v", pod.Name, err)
		}
		_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), n.Spec.Taints, pod.Spec.Tolerations,
			func(taint *v1.Taint) bool {
				return taint.Effect == v1.TaintEffectNoSchedule || taint.Effect == v1.TaintEffectNoExecute
			}, false)
		if ok && !untolerated {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}

// leftovers lists every object of every listable resource, cluster-wide, that carries the
// release's instance label, plus helm's own release records.
func leftovers(ctx context.Context, cp *ControlPlane, release string) ([]string, error) {
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	lists, err := cp.Client.Discovery().ServerPreferredResources()
	if err != nil {
		return nil, err
	}
	var found []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			return nil, err
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !contains(r.Verbs, "list") {
				continue
			}
			for _, selector := range []string{"app.kubernetes.io/instance=" + release, "owner=helm,name=" + release} {
				items, err := dyn.Resource(gv.WithResource(r.Name)).List(ctx, metav1.ListOptions{LabelSelector: selector})
				if err != nil {
					if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
						continue
					}
					return nil, fmt.Errorf("list %s: %w", r.Name, err)
				}
				for _, it := range items.Items {
					found = append(found, fmt.Sprintf("%s %s/%s", r.Kind, it.GetNamespace(), it.GetName()))
				}
			}
		}
	}
	return found, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// previousChart extracts, from git history, the chart as it was at the last commit whose
// Chart.yaml had another version than the working tree's; it returns the directory and version.
func previousChart(t *testing.T) (string, string) {
	t.Helper()
	root := repoRoot()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not found: the previous chart version comes from the repository's history")
	}
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skip("not a git checkout: the previous chart version comes from the repository's history")
	}
	version := func(chartYAML []byte) string {
		m := regexp.MustCompile(`(?m)^version:\s*"?([^"\s]+)`).FindSubmatch(chartYAML)
		if m == nil {
			return ""
		}
		return string(m[1])
	}
	current, err := os.ReadFile(filepath.Join(root, "charts", "rdma-device-plugin", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) []byte {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return out
	}
	for _, commit := range strings.Fields(string(git("log", "--format=%H", "--", "charts/rdma-device-plugin/Chart.yaml"))) {
		old := git("show", commit+":charts/rdma-device-plugin/Chart.yaml")
		if v := version(old); v != "" && v != version(current) {
			dir := t.TempDir()
			archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit, "charts/rdma-device-plugin")
			tar := exec.Command("tar", "-x", "-C", dir)
			var err error
			if tar.Stdin, err = archive.StdoutPipe(); err != nil {
				t.Fatal(err)
			}
			if err := archive.Start(); err != nil {
				t.Fatal(err)
			}
			if out, err := tar.CombinedOutput(); err != nil {
				t.Fatalf("extract chart %s at %s: %v %s", v, commit, err, out)
			}
			if err := archive.Wait(); err != nil {
				t.Fatal(err)
			}
			t.Logf("previous chart: version %s at %s", v, commit[:12])
			return filepath.Join(dir, "charts", "rdma-device-plugin"), v
		}
	}
	t.Fatalf("no earlier chart version in git history (a shallow clone?)")
	return "", ""
}

// TestHelmControlPlane installs, upgrades and uninstalls the chart with the real helm against a
// real kube-apiserver with the DaemonSet controller and the garbage collector (Start): every
// object is validated and admitted by the server, and the DaemonSet controller decides where
// pods go. The subtests run in order on one control plane.
func TestHelmControlPlane(t *testing.T) {
	helmBinary(t) // skips before starting anything when there is no helm
	cp := Start(t)
	h := newHelm(t, cp)
	c := cp.Client
	ctx := context.Background()
	nodes := testNodes()
	for _, n := range nodes {
		addReadyNode(t, c, n)
	}
	repo := "image.repository=" + testRepository
	defaults := placement{gpuNode: {"exclusive"}, rdmaNode: {"shared"}, broadcomNode: {"shared"},
		nfdRdmaNode: {"shared"}}

	t.Run("InstallDefaults", func(t *testing.T) {
		h.t = t
		out := h.must("install", "rdp", h.chart, "-n", "kube-system", "--set", repo)
		if !strings.Contains(out, "STATUS: deployed") {
			t.Fatalf("helm install: %s", out)
		}
		// The exclusive DaemonSet on the exclusive GPU node only, the shared one on the unlabelled
		// RDMA node only; the CPU-only and tainted control-plane nodes get neither.
		waitSettled(t, c, "kube-system", "rdp", defaults, nil)
	})

	t.Run("DaemonSetRelabel", func(t *testing.T) {
		// Each relabel moves the node from one DaemonSet to the other: the controller deletes
		// the old mode's pod and creates the new one's. Both DaemonSets' scheduling decisions
		// are complementary at every step (waitSettled checks each one's desired count); the two
		// pod objects may coexist for a moment, since each DaemonSet is synced on its own, which
		// the per-mode socket names make harmless on the node (docs/install.md).
		stop := bothModesSeen(t, c, "kube-system", "rdp")
		setExclusiveLabel(t, c, rdmaNode, true)
		waitSettled(t, c, "kube-system", "rdp", placement{gpuNode: {"exclusive"}, rdmaNode: {"exclusive"},
			broadcomNode: {"shared"}, nfdRdmaNode: {"shared"}}, nil)
		setExclusiveLabel(t, c, rdmaNode, false)
		waitSettled(t, c, "kube-system", "rdp", defaults, nil)
		if both := stop(); len(both) > 0 {
			t.Logf("nodes that briefly had a pod object of each mode during a swap: %v", both)
		}
	})

	t.Run("HelmTestPodTargetsItsMode", func(t *testing.T) {
		h.t = t
		for _, tc := range []struct {
			args []string
			want []string
		}{
			{nil, []string{gpuNode}},
			{[]string{"--set", "test.mode=shared"}, []string{broadcomNode, nfdRdmaNode, rdmaNode}},
			{[]string{"--set", "modes={shared}"}, []string{broadcomNode, nfdRdmaNode, rdmaNode}},
		} {
			pod := h.renderTestPod(tc.args...)
			if pod.Spec.ActiveDeadlineSeconds == nil || *pod.Spec.ActiveDeadlineSeconds <= 0 {
				t.Errorf("%v: the test pod has no deadline", tc.args)
			}
			if got := schedulableOn(t, pod, nodes); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("%v: the test pod can land on %v, want %v", tc.args, got, tc.want)
			}
			// Admitted as it is (validation, Pod Security, service account, priority class).
			if _, err := c.CoreV1().Pods("kube-system").Create(ctx, pod,
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				t.Errorf("%v: the server refuses the test pod: %v", tc.args, err)
			}
		}
	})

	t.Run("HelmUpgradeValues", func(t *testing.T) {
		h.t = t
		before, err := releasePods(ctx, c, "kube-system", "rdp")
		if err != nil {
			t.Fatal(err)
		}
		old := map[string]bool{}
		for _, p := range before {
			old[string(p.UID)] = true
		}
		h.must("upgrade", "rdp", h.chart, "-n", "kube-system", "--reuse-values",
			"--set", "image.tag=9.9.9-test", "--set", "logLevel=debug", "--set", "healthInterval=10s")
		waitSettled(t, c, "kube-system", "rdp", defaults, func(p *v1.Pod) string {
			ctr := p.Spec.Containers[0]
			args := strings.Join(ctr.Args, " ")
			switch {
			case old[string(p.UID)]:
				return "not replaced"
			case ctr.Image != testRepository+":9.9.9-test":
				return "image " + ctr.Image
			case !strings.Contains(args, "--log-level=debug") || !strings.Contains(args, "--health-interval=10s"):
				return "args " + args
			}
			return ""
		})
	})

	t.Run("HelmUninstall", func(t *testing.T) {
		h.t = t
		h.must("uninstall", "rdp", "-n", "kube-system", "--wait", "--timeout", "60s")
		waitForNothingLeft(t, cp, "rdp")
	})

	t.Run("HelmUpgradeFromPreviousVersion", func(t *testing.T) {
		h.t = t
		prev, version := previousChart(t)
		h.must("install", "prev", prev, "-n", "kube-system", "--set", repo)
		// Wherever that version's defaults place it (older charts ran the shared DaemonSet on
		// every node); the upgrade must then land on today's placement.
		waitSettled(t, c, "kube-system", "prev", nil, nil)
		h.must("upgrade", "prev", h.chart, "-n", "kube-system", "--set", repo)
		chartLabel := "rdma-device-plugin-" + chartVersion(t)
		waitSettled(t, c, "kube-system", "prev", defaults, func(p *v1.Pod) string {
			if v := p.Labels["app.kubernetes.io/version"]; v == version {
				return "still at " + v
			}
			return ""
		})
		dss, err := c.AppsV1().DaemonSets("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=prev"})
		if err != nil {
			t.Fatal(err)
		}
		for _, ds := range dss.Items {
			if ds.Labels["helm.sh/chart"] != chartLabel {
				t.Errorf("%s: chart label %q after the upgrade, want %q", ds.Name, ds.Labels["helm.sh/chart"], chartLabel)
			}
		}
		h.must("uninstall", "prev", "-n", "kube-system", "--wait", "--timeout", "60s")
		waitForNothingLeft(t, cp, "prev")
	})

	t.Run("InstallPodSecurity", func(t *testing.T) {
		h.t = t
		for _, level := range []string{"baseline", "restricted", "privileged"} {
			ns := "rdma-" + level
			if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
				Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// Refused before anything is created, with a message that says why and what to do.
		for _, level := range []string{"baseline", "restricted"} {
			ns := "rdma-" + level
			out, err := h.run("install", "rdp-"+level, h.chart, "-n", ns, "--set", repo)
			want := fmt.Sprintf("namespace %q enforces Pod Security level %q, which refuses the plugin's hostPath volumes", ns, level)
			if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "pod-security.kubernetes.io/enforce=privileged") {
				t.Errorf("install into %s: err=%v, want a failure saying %q; output:\n%s", ns, err, want, out)
			}
			if dss, err := c.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{}); err != nil || len(dss.Items) != 0 {
				t.Errorf("%s: DaemonSets after a refused install: %v %v", ns, dss, err)
			}
		}
		// Why the check exists: without it the DaemonSets are accepted, and Pod Security
		// admission refuses every pod the controller creates.
		h.must("install", "unchecked", h.chart, "-n", "rdma-baseline", "--set", repo, "--set", "podSecurityCheck=false")
		waitFor(t, settle, "the DaemonSet controller's pods refused by Pod Security in rdma-baseline",
			func(ctx context.Context) (bool, string, error) {
				events, err := c.CoreV1().Events("rdma-baseline").List(ctx, metav1.ListOptions{})
				if err != nil {
					return false, "", err
				}
				for _, e := range events.Items {
					if e.Reason == "FailedCreate" && strings.Contains(e.Message, "violates PodSecurity") &&
						strings.Contains(e.Message, "hostPath") {
						return true, "", nil
					}
				}
				return false, fmt.Sprintf("%d events, none FailedCreate ... violates PodSecurity ... hostPath", len(events.Items)), nil
			})
		if pods, err := releasePods(ctx, c, "rdma-baseline", "unchecked"); err != nil || len(pods) != 0 {
			t.Errorf("pods admitted in a baseline namespace: %d %v", len(pods), err)
		}
		h.must("uninstall", "unchecked", "-n", "rdma-baseline", "--wait", "--timeout", "60s")
		// A privileged namespace works like kube-system.
		h.must("install", "rdp-privileged", h.chart, "-n", "rdma-privileged", "--set", repo)
		waitSettled(t, c, "rdma-privileged", "rdp-privileged", defaults, nil)
		h.must("uninstall", "rdp-privileged", "-n", "rdma-privileged", "--wait", "--timeout", "60s")
		waitForNothingLeft(t, cp, "rdp-privileged")
	})

	t.Run("InstallDryRunServerValueSets", func(t *testing.T) {
		h.t = t
		// The value sets the chart tests render (test/chart/test_chart.py, chart_test.go), each
		// sent to the server for validation and admission without being stored.
		for name, args := range map[string][]string{
			"defaults":          nil,
			"exclusive-only":    {"--set", "modes={exclusive}"},
			"shared-only":       {"--set", "modes={shared}", "--set", "logLevel=debug"},
			"custom-label":      {"--set", "exclusiveLabel.key=example.com/rdma-x", "--set", "exclusiveLabel.value=yes"},
			"every-node":        {"--set-json", "rdmaNodeLabels=[]", "--set-json", `tolerations=[{"operator":"Exists"}]`},
			"node-pool":         {"--set-json", `rdmaNodeRequirements=[{"key":"pool","operator":"In","values":["gpu"]}]`},
			"nri-off":           {"--set", "nri.enabled=false"},
			"no-proc-driver":    {"--set", "hostPaths.procDriver=", "--set", "test.enabled=false"},
			"overrides":         {"--set", "image.tag=1.2.3", "--set", "image.pullPolicy=Always", "--set", "sharedDevices=64", "--set", "healthInterval=2s", "--set", "gpuResources={nvidia.com/gpu}", "--set-json", `extraArgs=["--topology-xml=/etc/rdp/node.xml"]`, "--set-json", `extraEnv=[{"name":"RDP_X","value":"1"}]`, "--set-json", `podAnnotations={"a":"b"}`},
			"custom-affinity":   {"--set-json", `affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}]}}}`, "--set-json", `nodeSelector={"kubernetes.io/os":"linux"}`},
			"maxUnavailable-10": {"--set", "updateStrategy.rollingUpdate.maxUnavailable=10%"},
			"dra":               {"--set", "driver=dra"},
			"metrics-off":       {"--set", "metrics.enabled=false"},
			"dra-no-extended":   {"--set", "driver=dra", "--set", "dra.deviceClass.extendedResource=false"},
			"dra-no-pods":       {"--set", "driver=dra", "--set", "dra.readPods=false", "--set", "dra.restrictClaimStatusWrites=false"},
		} {
			out, err := h.run(append([]string{"install", "dry-" + strings.ToLower(name), h.chart,
				"-n", "kube-system", "--dry-run=server", "--set", repo}, args...)...)
			if err != nil {
				t.Errorf("%s: helm install --dry-run=server: %v\n%s", name, err, out)
			}
		}
	})
}

// The chart in DRA mode, as the real API server admits it: the DeviceClass (CEL
// selector compiled and extendedResourceName validated by the server), the DaemonSets placed as
// in device-plugin mode, and the ServiceAccount allowed exactly what the driver does, asked of
// the server's RBAC authorizer (SubjectAccessReview), not read off the manifest.
func TestHelmControlPlaneDRA(t *testing.T) {
	helmBinary(t)
	cp := Start(t)
	h := newHelm(t, cp)
	c := cp.Client
	ctx := context.Background()
	for _, n := range testNodes() {
		addReadyNode(t, c, n)
	}
	h.must("install", "rdp", h.chart, "-n", "kube-system", "--set", "image.repository="+testRepository, "--set", "driver=dra")
	waitSettled(t, c, "kube-system", "rdp", placement{gpuNode: {"exclusive"}, rdmaNode: {"shared"},
		broadcomNode: {"shared"}, nfdRdmaNode: {"shared"}}, func(p *v1.Pod) string {
		if len(p.Spec.Containers[0].Args) == 0 || p.Spec.Containers[0].Args[0] != "dra" {
			return fmt.Sprintf("runs %v, not dra", p.Spec.Containers[0].Args)
		}
		return ""
	})
	// hca.<driver> for claims (every HCA); hca-exclusive.<driver> carries the extended resource
	// (exclusive-mode HCAs only: docs/dra.md, "Shared mode").
	for name, want := range map[string]string{"hca.rdma.network.alibabacloud.com": "", "hca-exclusive.rdma.network.alibabacloud.com": "rdma/hca"} {
		class, err := c.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("DeviceClass %s: %v", name, err)
		}
		got := ""
		if class.Spec.ExtendedResourceName != nil {
			got = *class.Spec.ExtendedResourceName
		}
		if got != want {
			t.Errorf("DeviceClass %s extendedResourceName = %q, want %q", name, got, want)
		}
	}
	sa := "system:serviceaccount:kube-system:rdp-rdma-device-plugin"
	for _, tc := range []struct {
		group, resource, verb string
		allowed               bool
		subresource, name     string
	}{
		{"resource.k8s.io", "resourceslices", "create", true, "", ""},
		{"resource.k8s.io", "resourceslices", "list", true, "", ""},
		{"resource.k8s.io", "resourceslices", "watch", true, "", ""},
		{"resource.k8s.io", "resourceslices", "update", true, "", ""},
		{"resource.k8s.io", "resourceslices", "delete", true, "", ""},
		{"resource.k8s.io", "resourceclaims", "get", true, "", ""},
		{"", "nodes", "get", true, "", ""},
		{"", "pods", "get", true, "", ""},
		{"resource.k8s.io", "resourceclaims", "update", false, "", ""},
		// status.devices: the claim's status, and (Kubernetes >= 1.36) the driver's synthetic
		// subresource, for claims on the token's own node only.
		{"resource.k8s.io", "resourceclaims", "update", true, "status", ""},
		{"resource.k8s.io", "resourceclaims", "patch", false, "status", ""},
		{"resource.k8s.io", "resourceclaims", "associated-node:update", true, "driver", draDriver},
		{"resource.k8s.io", "resourceclaims", "associated-node:update", false, "driver", "gpu.example.com"},
		{"resource.k8s.io", "resourceclaims", "arbitrary-node:update", false, "driver", draDriver},
		{"resource.k8s.io", "deviceclasses", "create", false, "", ""},
		{"", "nodes", "update", false, "", ""},
		{"", "secrets", "get", false, "", ""},
		{"", "pods", "list", false, "", ""},
	} {
		review, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Group: tc.group, Resource: tc.resource, Subresource: tc.subresource, Name: tc.name, Verb: tc.verb, Namespace: "default"},
			}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != tc.allowed {
			t.Errorf("%s %s.%s/%s %s: allowed=%v, want %v (%s)", tc.verb, tc.resource, tc.group, tc.subresource, tc.name, review.Status.Allowed, tc.allowed, review.Status.Reason)
		}
	}
	h.must("uninstall", "rdp", "-n", "kube-system", "--wait", "--timeout", "60s")
	waitForNothingLeft(t, cp, "rdp")
}

func chartVersion(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "charts", "rdma-device-plugin", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version string `json:"version"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	return chart.Version
}

// waitForNothingLeft waits until no object of the release remains anywhere (the garbage
// collector removes the DaemonSets' pods and ControllerRevisions after helm deletes them).
func waitForNothingLeft(t *testing.T, cp *ControlPlane, release string) {
	t.Helper()
	waitFor(t, settle, "nothing of release "+release+" left", func(ctx context.Context) (bool, string, error) {
		left, err := leftovers(ctx, cp, release)
		if err != nil {
			return false, "", err
		}
		return len(left) == 0, strings.Join(left, ", "), nil
	})
}
