package kubelet

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
)

// The allocation-quality replay (quality_test.go, docs/allocator.md "Allocation quality"): a
// seeded stream of GPU + HCA pods goes through the kubelet's own device manager and Topology
// Manager, and what each pod got is scored. This file holds what the replay needs besides the
// kubelet: the stream, the greedy NUMA-only HCA policy and the tally (the GPU plugin packs with
// PackGPUs, gpuplugin.go).

// StreamPod is one arrival of the stream: one container asking for GPUs and HCAs, leaving
// before arrival LeavesAt.
type StreamPod struct {
	GPUs, HCAs int
	LeavesAt   int
}

// qualityShapes are the (GPUs, HCAs) of the stream's pods: real GPU jobs' shapes, scaled down
// to what the node has.
var qualityShapes = [][2]int{{1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 2}, {4, 4}, {8, 2}, {8, 4}, {8, 8}, {0, 1}}

// QualityStream draws count arrivals for a node from a seed: each pod one of qualityShapes
// (uniformly), capped at the node's GPUs and HCAs, leaving 1-12 arrivals later. The same seed
// and node give the same stream.
func QualityStream(n *Node, count int, seed uint64) []StreamPod {
	rng := rand.New(rand.NewPCG(seed, 0x9d2c5680))
	pods := make([]StreamPod, 0, count)
	for i := 0; i < count; i++ {
		s := qualityShapes[rng.IntN(len(qualityShapes))]
		pods = append(pods, StreamPod{GPUs: min(s[0], len(n.GPUs)), HCAs: min(s[1], len(n.HCAs)),
			LeavesAt: i + 1 + rng.IntN(12)})
	}
	return pods
}

// GreedyNUMA is the replay's "greedy NUMA-only" HCA policy: must-include first, then the
// NUMA nodes ranked by how many of the container's GPUs they hold (the GPUs allocated to it so
// far, none when the HCAs come first), then by how many HCAs of available they have, then by
// number; the lowest PCI addresses within a node. It sees NUMA nodes, not the PCIe tree.
func GreedyNUMA(n *Node, containerGPUs, available, mustInclude []string, size int) []string {
	gpusOn, hcasOn := map[int]int{}, map[int]int{}
	for _, id := range containerGPUs {
		if g, ok := n.GPUByPCI(id); ok {
			gpusOn[g.NUMA]++
		}
	}
	must := map[string]bool{}
	for _, id := range mustInclude {
		must[id] = true
	}
	type cand struct {
		id   string
		numa int
	}
	var rest []cand
	for _, id := range available {
		numa := -1
		if h, ok := n.HCAByPCI(id); ok {
			numa = h.NUMA
		}
		hcasOn[numa]++
		if !must[id] {
			rest = append(rest, cand{id, numa})
		}
	}
	sort.Slice(rest, func(i, j int) bool {
		a, b := rest[i], rest[j]
		if gpusOn[a.numa] != gpusOn[b.numa] {
			return gpusOn[a.numa] > gpusOn[b.numa]
		}
		if hcasOn[a.numa] != hcasOn[b.numa] {
			return hcasOn[a.numa] > hcasOn[b.numa]
		}
		if a.numa != b.numa {
			return a.numa < b.numa
		}
		return a.id < b.id
	})
	out := sorted(mustInclude)
	for _, c := range rest {
		if len(out) >= size {
			break
		}
		out = append(out, c.id)
	}
	sort.Strings(out)
	return out
}

// HCA policies of the replay.
const (
	PolicyOurs           = "ours"
	PolicyGreedyNUMA     = "greedy NUMA-only"
	PolicyKubeletDefault = "kubelet default"
)

// QualityTally is what one replay (fixture x Topology Manager policy x HCA policy) measured.
// HCA counts are capped per pod: a pod that asked for k HCAs while m were free at PIX/PXB to
// its GPUs counts min(k, m) as possible and at most that many as near.
type QualityTally struct {
	Fixture, Policy, HCAPolicy string
	Arrivals                   int // pods of the stream
	Unschedulable              int // not enough free GPUs or HCAs on the node: not bound
	Bound, Admitted            int
	Rejected                   map[string]int // by the kubelet's reason

	// Pods with GPUs, by whether the device manager allocated their GPUs before their HCAs.
	PodsGPUsFirst, PodsHCAsFirst     int
	NearGPUsFirst, PossibleGPUsFirst int
	NearHCAsFirst, PossibleHCAsFirst int
	// HCAs short of possible, GPUs first: those the HCA policy could have had (the kubelet
	// offered an HCA at PIX/PXB to the pod's GPUs beyond must-include), and those it could not
	// (the kubelet did not ask, narrowed available to the hint, or filled the room with
	// must-include). For the kubelet default, which is never asked, all are the second kind.
	ShortOffered, ShortNotOffered int
	// Pods with GPUs and at least 2 HCAs, and those whose HCAs sit on every NUMA node their
	// GPUs use.
	MultiHCA, Covered int

	// Per GetPreferredAllocation answer (HCAs): those made after the container's GPUs were
	// allocated, with an HCA at PIX/PXB to them among available minus must-include and room
	// for it; and how many of those answers hold such an HCA.
	AnswerCases, AnswerNear       int
	GPACalls, PodResourcesRefused int
	Seconds                       float64
}

// RejectedTotal sums the rejections over reasons.
func (t QualityTally) RejectedTotal() int {
	n := 0
	for _, v := range t.Rejected {
		n += v
	}
	return n
}

func share(part, whole int) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%% (%d/%d)", 100*float64(part)/float64(whole), part, whole)
}

func rejectedCell(t QualityTally) string {
	s := fmt.Sprintf("%d / %d", t.RejectedTotal(), t.Bound)
	var other []string
	for reason, n := range t.Rejected {
		if reason != "TopologyAffinityError" {
			other = append(other, fmt.Sprintf("%d %s", n, reason))
		}
	}
	sort.Strings(other)
	if len(other) > 0 {
		s += " (" + strings.Join(other, ", ") + ")"
	}
	return s
}

// QualityTable renders the tallies as markdown: one row per fixture, Topology Manager policy
// and HCA policy, in the order given; then whether the goals hold.
func QualityTable(ts []QualityTally) string {
	var b strings.Builder
	b.WriteString("| node | TM policy | HCA policy | PIX/PXB, GPUs first | short: on offer / not | PIX/PXB, HCAs first | NUMA cover | rejected / bound |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, t := range ts {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d / %d | %s | %s | %s |\n", t.Fixture, t.Policy, t.HCAPolicy,
			share(t.NearGPUsFirst, t.PossibleGPUsFirst), t.ShortOffered, t.ShortNotOffered,
			share(t.NearHCAsFirst, t.PossibleHCAsFirst), share(t.Covered, t.MultiHCA), rejectedCell(t))
	}
	b.WriteString("\n")
	b.WriteString(QualityGoals(ts))
	return b.String()
}

// QualityGoals checks the two goals of the table for ours, per fixture and policy: at least
// 95% PIX/PXB when the GPUs came first and such an HCA was free; under restricted and
// single-numa-node no more rejections than the kubelet default.
func QualityGoals(ts []QualityTally) string {
	find := func(fixture, policy, hca string) (QualityTally, bool) {
		for _, t := range ts {
			if t.Fixture == fixture && t.Policy == policy && t.HCAPolicy == hca {
				return t, true
			}
		}
		return QualityTally{}, false
	}
	var b strings.Builder
	b.WriteString("| node | TM policy | ours >= 95% PIX/PXB, GPUs first | ours rejects <= kubelet default |\n")
	b.WriteString("|---|---|---|---|\n")
	for _, t := range ts {
		if t.HCAPolicy != PolicyOurs {
			continue
		}
		near := "no data"
		if t.PossibleGPUsFirst > 0 {
			pct := 100 * float64(t.NearGPUsFirst) / float64(t.PossibleGPUsFirst)
			near = fmt.Sprintf("%s (%.1f%%", yesNo(pct >= 95), pct)
			if t.ShortOffered+t.ShortNotOffered > 0 {
				near += fmt.Sprintf("; short %d with one on offer, %d without", t.ShortOffered, t.ShortNotOffered)
			}
			near += ")"
		}
		rej := "(not a goal)"
		if t.Policy == "restricted" || t.Policy == "single-numa-node" {
			rej = "no default run"
			if d, ok := find(t.Fixture, t.Policy, PolicyKubeletDefault); ok {
				rej = fmt.Sprintf("%s (%d vs %d)", yesNo(t.RejectedTotal() <= d.RejectedTotal()),
					t.RejectedTotal(), d.RejectedTotal())
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Fixture, t.Policy, near, rej)
	}
	return b.String()
}

func yesNo(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
