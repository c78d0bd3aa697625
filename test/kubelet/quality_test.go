package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// The allocation-quality replay (docs/allocator.md, "Allocation quality"). Settings come from
// the environment, so that they reach the isolated child processes:
//
//	RDP_QUALITY_PODS      arrivals per stream (default 60)
//	RDP_QUALITY_SEED      the stream's seed (default 1)
//	RDP_QUALITY_FIXTURES  comma-separated nodes (test/data/<node>.xml; default all of qualityNodes)
//	RDP_QUALITY_TABLE     also write the markdown table to this file
//
//	e.g. RDP_QUALITY_PODS=3000 RDP_QUALITY_TABLE=/tmp/quality.md \
//	  test/kubelet/run.sh build/cmd/rdma-device-plugin -run TestQualityReplay -timeout 1h
const (
	qualityPodsEnv     = "RDP_QUALITY_PODS"
	qualitySeedEnv     = "RDP_QUALITY_SEED"
	qualityFixturesEnv = "RDP_QUALITY_FIXTURES"
	qualityTableEnv    = "RDP_QUALITY_TABLE"
	qualityResultsEnv  = "RDP_QUALITY_RESULTS" // set by the parent: where each child leaves its tally
)

// qualityNodes are the replay's fixtures: test/data/<name>.xml.
var qualityNodes = append([]string{"dgx-h100-like"}, syntheticNodes...)

var hcaPolicies = []string{PolicyOurs, PolicyGreedyNUMA, PolicyKubeletDefault}

// Our plugin lists pod-resources once per admission (the GetPreferredAllocation's List, which
// its Allocate shares, or the Allocate's own when the kubelet or the tap calls none), and every
// 200 ms on its own (--health-interval in ServeArgs); the kubelet serves 100 calls a second
// (burst 10) and refuses the rest. The replay lets pods arrive at most this often, under every
// HCA policy, so that no list is refused (a refused one would leave the plugin without the
// container's GPUs, or Allocate without the newest pod list); it checks that none was.
const qualityArrivalsPerSecond = 50

func qualityFixtures(t *testing.T) []string {
	v := os.Getenv(qualityFixturesEnv)
	if v == "" || v == "all" {
		return qualityNodes
	}
	var out []string
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSuffix(strings.TrimSpace(f), ".xml")
		if _, err := os.Stat(filepath.Join(repoRoot(), "test", "data", f+".xml")); err != nil {
			t.Fatalf("%s: no test/data/%s.xml", qualityFixturesEnv, f)
		}
		out = append(out, f)
	}
	return out
}

// TestQualityReplay replays a seeded stream of GPU + HCA pods (QualityStream) through the
// kubelet's device manager and Topology Manager (container scope) for each node, Topology
// Manager policy and HCA policy: ours (the binary behind the tap), greedy NUMA-only (the tap
// answers with GreedyNUMA) and the kubelet's default (the tap says there is no
// GetPreferredAllocation). The GPU plugin packs (PackGPUs). The harness schedules: a pod is
// bound only when the node has enough free GPUs and HCAs. Order-independent checks, per run:
//   - every GetPreferredAllocation answer is valid and is what the kubelet allocated; no device
//     is held by two running pods; an admitted pod got what it asked for; under restricted and
//     single-numa-node its hint is preferred (one NUMA node for single-numa-node) and under
//     any policy but none a preferred hint holds all its devices;
//   - ours: of the answers made after the container's GPUs were allocated, with an HCA at
//     PIX/PXB to them in available (beyond must-include), at least 95% hold one; there are
//     at least 5 such answers on dgx-h100-like;
//   - no pod-resources call was refused by the kubelet's rate limit;
//   - the GPU plugin was asked to pack; under the kubelet default the kubelet made no
//     GetPreferredAllocation call;
//   - every admission took under 5 s.
//
// The measured shares, NUMA cover and rejections depend on the order in which the kubelet
// walks a container's resources (Go map order) and are only reported: the table (logged, and
// written to $RDP_QUALITY_TABLE) is docs/allocator.md's.
func TestQualityReplay(t *testing.T) {
	pods := EnvInt(t, qualityPodsEnv, 60)
	seed := EnvInt(t, qualitySeedEnv, 1)
	fixtures := qualityFixtures(t)
	child := os.Getenv(isolatedEnv) != ""
	if !child {
		t.Setenv(qualityResultsEnv, t.TempDir())
		// A child replays one stream: at 50 arrivals a second, plus the kubelet's own time.
		if need := time.Duration(pods) * 60 * time.Millisecond; need+2*time.Minute > childTimeout {
			old := childTimeout
			childTimeout = need + 2*time.Minute
			t.Cleanup(func() { childTimeout = old })
		}
	}
	var names []string
	for _, fixture := range fixtures {
		t.Run(fixture, func(t *testing.T) {
			for _, policy := range policies {
				t.Run(policy, func(t *testing.T) {
					for _, hca := range hcaPolicies {
						name := fixture + "/" + policy + "/" + hca
						t.Run(strings.ReplaceAll(hca, " ", "_"), func(t *testing.T) {
							if !Isolate(t) {
								names = append(names, name) // the child passed: its tally is there
								return
							}
							tally := replay(t, fixture, policy, hca, pods, uint64(seed))
							writeTally(t, name, tally)
						})
					}
				})
			}
		})
	}
	if child || t.Failed() {
		return
	}
	var tallies []QualityTally
	for _, name := range names {
		data, err := os.ReadFile(tallyPath(name))
		if err != nil {
			t.Fatalf("no result from %s: %v", name, err)
		}
		var tally QualityTally
		if err := json.Unmarshal(data, &tally); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		tallies = append(tallies, tally)
	}
	table := QualityTable(tallies)
	t.Logf("%d arrivals per stream, seed %d:\n%s", pods, seed, table)
	if path := os.Getenv(qualityTableEnv); path != "" {
		header := fmt.Sprintf("<!-- TestQualityReplay: %s=%d %s=%d %s=%s, plugin %s, %s -->\n\n", qualityPodsEnv, pods,
			qualitySeedEnv, seed, qualityFixturesEnv, strings.Join(fixtures, ","), binaryPath(),
			time.Now().UTC().Format(time.RFC3339))
		if err := os.WriteFile(path, []byte(header+table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func tallyPath(name string) string {
	return filepath.Join(os.Getenv(qualityResultsEnv), strings.NewReplacer("/", "_", " ", "_").Replace(name)+".json")
}

func writeTally(t *testing.T, name string, tally QualityTally) {
	if os.Getenv(qualityResultsEnv) == "" {
		return // run on its own: the log has it
	}
	data, err := json.Marshal(tally)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tallyPath(name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// running is a pod the replay bound and the kubelet admitted.
type running struct {
	pod        *v1.Pod
	gpus, hcas []string
	leavesAt   int
}

// qualityRun is one replay: a node under one Topology Manager policy and one HCA policy.
type qualityRun struct {
	t         *testing.T
	e         *Env
	hcaPolicy string
	tally     QualityTally
	pace      *rate.Limiter
	gpuOf     map[string]GPU
	hcaOf     map[string]HCA
	live      []running
	current   atomic.Pointer[v1.Pod] // the pod being admitted, for GreedyNUMA
}

func replay(t *testing.T, fixture, policy, hcaPolicy string, count int, seed uint64) QualityTally {
	start := time.Now()
	mode := map[string]TapMode{PolicyOurs: TapForward, PolicyGreedyNUMA: TapAnswer,
		PolicyKubeletDefault: TapNoPreference}[hcaPolicy]
	r := &qualityRun{t: t, hcaPolicy: hcaPolicy, gpuOf: map[string]GPU{}, hcaOf: map[string]HCA{},
		tally: QualityTally{Fixture: fixture, Policy: policy, HCAPolicy: hcaPolicy, Rejected: map[string]int{}},
		pace:  rate.NewLimiter(qualityArrivalsPerSecond, 1)}
	r.e = NewEnv(t, EnvOptions{Policy: policy, Scope: "container", Mode: "exclusive", Tap: true,
		TapMode: mode, PackGPUs: true, XML: filepath.Join(repoRoot(), "test", "data", fixture+".xml")})
	for _, g := range r.e.Node.GPUs {
		r.gpuOf[g.PCI] = g
	}
	for _, h := range r.e.Node.HCAs {
		r.hcaOf[h.PCI] = h
	}
	if hcaPolicy == PolicyGreedyNUMA {
		r.e.Tap.SetPrefer(func(available, mustInclude []string, size int) []string {
			var gpus []string
			if p := r.current.Load(); p != nil {
				gpus = r.e.Kubelet.Devices(p, "c", GPUResource)
			}
			return GreedyNUMA(r.e.Node, gpus, available, mustInclude, size)
		})
	}
	stream := QualityStream(r.e.Node, count, seed)
	r.tally.Arrivals = len(stream)
	for i, sp := range stream {
		r.arrive(i, sp)
	}
	r.finish()
	r.tally.Seconds = time.Since(start).Seconds()
	return r.tally
}

// held maps the devices of the running pods to their pods' names.
func (r *qualityRun) held() (gpus, hcas map[string]string) {
	gpus, hcas = map[string]string{}, map[string]string{}
	for _, p := range r.live {
		for _, id := range p.gpus {
			gpus[id] = p.pod.Name
		}
		for _, id := range p.hcas {
			hcas[id] = p.pod.Name
		}
	}
	return gpus, hcas
}

// arrive: departures first, then the scheduler's fit check on the free counts, admission, and
// the checks and scores of what the pod got.
func (r *qualityRun) arrive(i int, sp StreamPod) {
	t, e := r.t, r.e
	kept := r.live[:0]
	for _, p := range r.live {
		if p.leavesAt <= i {
			e.Kubelet.RemovePod(p.pod)
		} else {
			kept = append(kept, p)
		}
	}
	r.live = kept
	heldGPUs, heldHCAs := r.held()
	if len(e.Node.GPUs)-len(heldGPUs) < sp.GPUs || len(e.Node.HCAs)-len(heldHCAs) < sp.HCAs {
		r.tally.Unschedulable++
		return
	}
	r.tally.Bound++
	limits := map[string]int64{ResourceHCA: int64(sp.HCAs)}
	if sp.GPUs > 0 {
		limits[GPUResource] = int64(sp.GPUs)
	}
	pod := NewPod(fmt.Sprintf("q%04d", i), Ctr{Name: "c", Limits: limits})
	if err := r.pace.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	gpuBefore, tapBefore := len(e.GPU.Allocations(0)), len(e.Tap.Exchanges())
	r.current.Store(pod)
	a := e.Kubelet.Admit(pod)
	r.current.Store(nil)
	if a.Took >= 5*time.Second {
		t.Errorf("%s: admission took %v (bound 5s)", pod.Name, a.Took)
	}
	if !a.Admit {
		r.tally.Rejected[a.Reason]++
		return
	}
	r.tally.Admitted++
	gpus := e.Kubelet.Devices(pod, "c", GPUResource)
	hcas := e.Kubelet.Devices(pod, "c", ResourceHCA)
	desc := fmt.Sprintf("%s (%d GPUs + %d HCAs): GPUs %v, HCAs %v", pod.Name, sp.GPUs, sp.HCAs, gpus, hcas)
	if len(gpus) != sp.GPUs || len(hcas) != sp.HCAs {
		t.Errorf("%s: not what it asked for", desc)
	}
	for _, id := range gpus {
		if other, ok := heldGPUs[id]; ok {
			t.Errorf("%s: GPU %s is %s's", desc, id, other)
		}
	}
	for _, id := range hcas {
		if other, ok := heldHCAs[id]; ok {
			t.Errorf("%s: HCA %s is %s's", desc, id, other)
		}
	}
	checkHint(t, e, pod, desc, gpus, hcas)
	r.live = append(r.live, running{pod: pod, gpus: gpus, hcas: hcas, leavesAt: sp.LeavesAt})

	// Which came first: the container's GPU Allocate or its first HCA call.
	gpuAllocs, xs := e.GPU.Allocations(gpuBefore), e.Tap.Exchanges()[tapBefore:]
	if len(xs) != 1 || len(gpuAllocs) != min(sp.GPUs, 1) {
		t.Errorf("%s: %d HCA exchanges and %d GPU Allocates, want 1 and %d", desc, len(xs), len(gpuAllocs), min(sp.GPUs, 1))
		return
	}
	x := xs[0]
	hcaSeq := x.AllocSeq
	if x.GPA != nil {
		hcaSeq = x.GPA.Seq
		r.tally.GPACalls++
		checkAnswer(t, e, x, hcas, desc)
	}
	if sp.GPUs > 0 {
		r.score(pod, desc, gpus, hcas, heldHCAs, x, gpuAllocs[0].Seq < hcaSeq)
	}
}

// nearAny reports whether an HCA is at PIX/PXB to one of the GPUs.
func (r *qualityRun) nearAny(hca string, gpus []string) bool {
	for _, g := range gpus {
		if Near(r.gpuOf[g], r.hcaOf[hca]) {
			return true
		}
	}
	return false
}

// score counts one admitted pod with GPUs: its HCAs at PIX/PXB against those free before it
// came, its NUMA cover and, for ours, whether the answer held a near HCA when one was offered.
func (r *qualityRun) score(pod *v1.Pod, desc string, gpus, hcas []string, heldHCAs map[string]string, x Exchange, gpusFirst bool) {
	possible, near := 0, 0
	for _, h := range r.e.Node.HCAs {
		if _, held := heldHCAs[h.PCI]; !held && r.nearAny(h.PCI, gpus) {
			possible++
		}
	}
	for _, id := range hcas {
		if r.nearAny(id, gpus) {
			near++
		}
	}
	possible = min(possible, len(hcas))
	near = min(near, possible)
	tl := &r.tally
	if gpusFirst {
		tl.PodsGPUsFirst++
		tl.NearGPUsFirst += near
		tl.PossibleGPUsFirst += possible
		if near < possible {
			r.short(pod, desc, gpus, x, possible, near)
		}
	} else {
		tl.PodsHCAsFirst++
		tl.NearHCAsFirst += near
		tl.PossibleHCAsFirst += possible
	}
	if len(hcas) >= 2 {
		tl.MultiHCA++
		hcaNUMA := map[int]bool{}
		for _, id := range hcas {
			hcaNUMA[r.hcaOf[id].NUMA] = true
		}
		covered := true
		for _, g := range gpus {
			covered = covered && hcaNUMA[r.gpuOf[g].NUMA]
		}
		if covered {
			tl.Covered++
		}
	}
	// Ours, asked with the container's GPUs known and room for a choice: when available (beyond
	// must-include) holds an HCA at PIX/PXB to them, the answer holds one.
	g := x.GPA
	if r.hcaPolicy != PolicyOurs || g == nil || !gpusFirst || len(g.MustInclude) >= g.Size {
		return
	}
	must := map[string]bool{}
	for _, id := range g.MustInclude {
		must[id] = true
	}
	offered, got := false, false
	for _, id := range g.Available {
		offered = offered || (!must[id] && r.nearAny(id, gpus))
	}
	for _, id := range g.Answer {
		got = got || (!must[id] && r.nearAny(id, gpus))
	}
	if !offered {
		return
	}
	tl.AnswerCases++
	if got {
		tl.AnswerNear++
	} else {
		r.t.Logf("%s: GPUs first, available %v (must %v) holds an HCA at PIX/PXB to them; answer %v has none",
			desc, g.Available, g.MustInclude, g.Answer)
	}
}

// short splits the HCAs a GPUs-first pod got short of possible into those the HCA policy could
// have had (the kubelet offered them, beyond must-include, with room) and those it could not:
// without a GetPreferredAllocation, or with the near HCAs outside available, or the room
// taken by must-include.
func (r *qualityRun) short(pod *v1.Pod, desc string, gpus []string, x Exchange, possible, near int) {
	best := near
	how := "no GetPreferredAllocation"
	if g := x.GPA; g != nil {
		must := map[string]bool{}
		mustNear, offered := 0, 0
		for _, id := range g.MustInclude {
			must[id] = true
			if r.nearAny(id, gpus) {
				mustNear++
			}
		}
		for _, id := range g.Available {
			if !must[id] && r.nearAny(id, gpus) {
				offered++
			}
		}
		best = min(possible, g.Size, mustNear+min(g.Size-len(g.MustInclude), offered))
		how = fmt.Sprintf("GetPreferredAllocation(available %v, must %v) = %v", g.Available, g.MustInclude, g.Answer)
	}
	byPolicy := max(0, best-near)
	r.tally.ShortOffered += byPolicy
	r.tally.ShortNotOffered += possible - near - byPolicy
	if r.hcaPolicy == PolicyOurs {
		hint := r.e.Kubelet.TM.GetAffinity(klog.FromContext(r.e.Kubelet.Context()), string(pod.UID), "c")
		r.t.Logf("%s: GPUs first, %d HCAs at PIX/PXB free, got %d (%d of them on offer); hint %v; %s",
			desc, possible, near, best, hint, how)
	}
}

// finish checks what holds for the whole run and logs its tally.
func (r *qualityRun) finish() {
	t, e, tl := r.t, r.e, &r.tally
	calls, refused := e.Kubelet.PodResourcesCalls()
	tl.PodResourcesRefused = int(refused)
	if refused > 0 {
		t.Errorf("the kubelet's rate limit refused %d of %d pod-resources calls: the plugin answered some calls without the pod list", refused, calls)
	}
	if e.GPU.Preferred() == 0 && tl.Admitted > 0 {
		t.Errorf("the kubelet never asked the GPU plugin for a preferred allocation: GPUs were not packed")
	}
	if r.hcaPolicy == PolicyKubeletDefault && tl.GPACalls > 0 {
		t.Errorf("the kubelet called GetPreferredAllocation %d times, though the tap said there is none", tl.GPACalls)
	}
	if r.hcaPolicy == PolicyOurs {
		if tl.AnswerCases > 0 && 100*tl.AnswerNear < 95*tl.AnswerCases {
			t.Errorf("GPUs first and an HCA at PIX/PXB to them available: %d of %d answers hold one (want >= 95%%)",
				tl.AnswerNear, tl.AnswerCases)
		}
		if tl.Fixture == "dgx-h100-like" && tl.AnswerCases < 5 {
			t.Errorf("only %d answers made with the container's GPUs and a PIX/PXB HCA on offer: the stream tests little", tl.AnswerCases)
		}
	}
	t.Logf("%s %s %s: %d arrivals, %d bound, %d admitted, rejected %v; PIX/PXB GPUs first %s, HCAs first %s; NUMA cover %s; "+
		"answers with GPUs known and a near HCA offered: %d of %d near; %d GetPreferredAllocation; pod-resources %d calls",
		tl.Fixture, tl.Policy, tl.HCAPolicy, tl.Arrivals, tl.Bound, tl.Admitted, tl.Rejected,
		share(tl.NearGPUsFirst, tl.PossibleGPUsFirst), share(tl.NearHCAsFirst, tl.PossibleHCAsFirst),
		share(tl.Covered, tl.MultiHCA), tl.AnswerNear, tl.AnswerCases, tl.GPACalls, calls)
}

// checkAnswer: a GetPreferredAllocation answer is valid, and the kubelet allocated exactly it
// (`hcas`). A valid answer is taken whole: from the aligned set when the hint left enough there
// (available = aligned), otherwise after the aligned devices (passed as must-include).
func checkAnswer(t *testing.T, e *Env, x Exchange, hcas []string, desc string) {
	t.Helper()
	g := x.GPA
	if g.Err != nil {
		t.Errorf("%s: GetPreferredAllocation%+v failed: %v", desc, *g, g.Err)
		return
	}
	if err := e.validAnswer(g); err != nil {
		t.Errorf("%s: GetPreferredAllocation(available %v, must %v, size %d) = %v: %v",
			desc, g.Available, g.MustInclude, g.Size, g.Answer, err)
		return
	}
	if strings.Join(g.Answer, ",") != strings.Join(hcas, ",") {
		t.Errorf("%s: kubelet allocated %v, our GetPreferredAllocation said %v (available %v, must %v)",
			desc, hcas, g.Answer, g.Available, g.MustInclude)
	}
}

// checkHint: the Topology Manager's hint for the container against the policy and the devices.
func checkHint(t *testing.T, e *Env, pod *v1.Pod, desc string, gpus, hcas []string) {
	t.Helper()
	policy := e.Opts.Policy
	if policy == "none" {
		return
	}
	hint := e.Kubelet.TM.GetAffinity(klog.FromContext(e.Kubelet.Context()), string(pod.UID), "c")
	if policy != "best-effort" && !hint.Preferred {
		t.Errorf("%s: admitted under %s with a hint that is not preferred (%v)", desc, policy, hint)
	}
	if policy == "single-numa-node" && (hint.NUMANodeAffinity == nil || hint.NUMANodeAffinity.Count() != 1) {
		t.Errorf("%s: single-numa-node hint %v is not one NUMA node", desc, hint)
	}
	if !hint.Preferred || hint.NUMANodeAffinity == nil {
		return
	}
	for _, n := range append(e.numaOf(ResourceHCA, hcas), e.numaOf(GPUResource, gpus)...) {
		if n >= 0 && !hint.NUMANodeAffinity.IsSet(n) {
			t.Errorf("%s: a device on NUMA %d is outside the preferred hint %v", desc, n, hint)
			return
		}
	}
}

// Greedy NUMA-only: the container's GPUs' NUMA node, else the node with the most HCAs.
func TestGreedyNUMA(t *testing.T) {
	dgx := loadNode(t, "dgx-h100-like")
	var all []string
	for _, h := range dgx.HCAs {
		all = append(all, h.PCI)
	}
	cases := []struct {
		name              string
		gpus, avail, must []string
		size              int
		want              string
	}{
		{"no GPUs: the node with the most HCAs", nil, all, nil, 2, "0000:9f:00.0,0000:a0:00.0"},
		{"the GPUs' node", []string{"0000:3a:00.0"}, all, nil, 2, "0000:1a:00.0,0000:1b:00.0"},
		{"must-include kept", []string{"0000:18:00.0"}, all, []string{"0000:c9:00.0"}, 2, "0000:1a:00.0,0000:c9:00.0"},
		{"the GPUs' node before the fuller one", []string{"0000:18:00.0", "0000:9d:00.0", "0000:9e:00.0"}, all, nil, 1, "0000:9f:00.0"},
	}
	for _, c := range cases {
		if got := strings.Join(GreedyNUMA(dgx, c.gpus, c.avail, c.must, c.size), ","); got != c.want {
			t.Errorf("%s: GreedyNUMA = %s, want %s", c.name, got, c.want)
		}
	}
}

// The stream is a function of the seed and the node: shapes capped at the node, departures
// 1-12 arrivals later.
func TestQualityStream(t *testing.T) {
	n := loadNode(t, "fewer-hcas-than-gpus")
	a, b, c := QualityStream(n, 500, 1), QualityStream(n, 500, 1), QualityStream(n, 500, 2)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Error("the same seed gave two streams")
	}
	if fmt.Sprint(a) == fmt.Sprint(c) {
		t.Error("seeds 1 and 2 gave the same stream")
	}
	shapes := map[[2]int]int{}
	for i, p := range a {
		shapes[[2]int{p.GPUs, p.HCAs}]++
		if p.GPUs > len(n.GPUs) || p.HCAs > len(n.HCAs) || p.HCAs < 1 || p.LeavesAt <= i || p.LeavesAt > i+12 {
			t.Fatalf("arrival %d: %+v", i, p)
		}
	}
	if len(shapes) != 9 { // (8,4) and (8,8) both become (8,4) on 4 HCAs
		t.Errorf("shapes %v, want the 10 of the stream capped to 9", shapes)
	}
}
