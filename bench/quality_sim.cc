// quality_sim: replays pod streams against a node the way the kubelet's device manager and
// Topology Manager would, and measures how well each HCA policy places HCAs.
//
// Modelled from the kubelet (pkg/kubelet/cm/devicemanager and cm/topologymanager):
// - per-resource NUMA hints as generateDeviceTopologyHints makes them (every NUMA mask with
//   enough free devices; preferred when the mask is as narrow as the request allows on the
//   whole node);
// - the merge of GPU and HCA hints (every permutation ANDed; preferred beats non-preferred, then
//   narrower), under best-effort, restricted and single-numa-node (admission fails when the
//   merged hint is not preferred; single-numa-node first drops multi-NUMA hints);
// - devicesToAllocate: the aligned/unaligned split, GetPreferredAllocation on the aligned set
//   when it has more than needed, otherwise all aligned first and the plugin's answer for the
//   rest, then unaligned and no-affinity devices in sorted order;
// - GPUs and HCAs allocated in random order per pod, GPUs by a plugin that packs within a NUMA
//   node; pods arrive and leave.
// HCA policies compared: ours (ExclusiveAllocator, with the container's GPUs as context only
// when they were allocated first, as the server can know them), a greedy NUMA-only policy, and
// the kubelet's default (no preferred answer). Results and command: docs/allocator.md.

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "allocator/allocator.h"
#include "test/support/node_builder.h"
#include "topology/discovery.h"

namespace rdp::bench {
namespace {

using testing::DgxH100Like;
using testing::DistinctHcas;
using testing::FewerHcasThanGpus;
using testing::FourNuma;
using testing::GpuIds;
using testing::HcaIds;
using testing::ScaledDgx;
using testing::TwoLevelSwitches;

using Mask = unsigned;  // NUMA nodes by position in Topology::numa_nodes()

struct Hint {
  std::optional<Mask> affinity;  // nullopt: no preference (any NUMA node)
  bool preferred = true;
};

int Bits(Mask m) { return __builtin_popcount(m); }

// One kind of device: its IDs (sorted, as the kubelet's sets.List sorts them) and NUMA masks.
struct Resource {
  std::vector<std::string> ids;
  std::vector<Mask> numa;  // 0: no topology
  std::set<int> free;      // indices into ids
};

// generateDeviceTopologyHints for `request` devices.
std::vector<Hint> DeviceHints(const Resource& r, int numa_nodes, int request) {
  std::vector<Hint> hints;
  int min_size = numa_nodes;
  for (Mask mask = 1; mask < (1u << numa_nodes); ++mask) {
    int in_mask = 0, free_in_mask = 0;
    for (size_t d = 0; d < r.ids.size(); ++d) {
      if ((r.numa[d] & mask) == 0) continue;
      ++in_mask;
      free_in_mask += r.free.count(static_cast<int>(d));
    }
    if (in_mask >= request && Bits(mask) < min_size) min_size = Bits(mask);
    if (free_in_mask >= request) hints.push_back({mask, false});
  }
  for (Hint& h : hints) h.preferred = Bits(*h.affinity) == min_size;
  return hints;
}

enum class TmPolicy { kNone, kBestEffort, kRestricted, kSingleNuma };

// The Topology Manager's merge over the providers' hint lists. Returns the merged hint and
// whether the pod is admitted.
std::pair<Hint, bool> Merge(std::vector<std::vector<Hint>> providers, int numa_nodes,
                            TmPolicy policy) {
  Mask all = (1u << numa_nodes) - 1;
  if (policy == TmPolicy::kNone) return {{std::nullopt, true}, true};
  for (std::vector<Hint>& hints : providers) {
    if (hints.empty()) hints = {{std::nullopt, false}};  // no possible affinity
    if (policy == TmPolicy::kSingleNuma) {
      std::vector<Hint> single;
      for (const Hint& h : hints) {
        if (h.preferred && (!h.affinity || Bits(*h.affinity) == 1)) single.push_back(h);
      }
      hints = single.empty() ? std::vector<Hint>{{std::nullopt, false}} : single;
    }
  }
  Hint best{all, false};
  std::vector<size_t> pick(providers.size(), 0);
  while (true) {
    Hint merged{all, true};
    for (size_t p = 0; p < providers.size(); ++p) {
      const Hint& h = providers[p][pick[p]];
      merged.affinity = *merged.affinity & h.affinity.value_or(all);
      merged.preferred = merged.preferred && h.preferred;
    }
    if (*merged.affinity != 0) {
      bool narrower = Bits(*merged.affinity) < Bits(*best.affinity) ||
                      (Bits(*merged.affinity) == Bits(*best.affinity) &&
                       *merged.affinity < *best.affinity);
      if ((merged.preferred && !best.preferred) ||
          (merged.preferred == best.preferred && narrower)) {
        best = merged;
      }
    }
    size_t p = 0;
    while (p < providers.size() && ++pick[p] == providers[p].size()) pick[p++] = 0;
    if (p == providers.size()) break;
  }
  bool admit = policy == TmPolicy::kBestEffort ||
               (best.preferred && (policy != TmPolicy::kSingleNuma || Bits(*best.affinity) == 1));
  return {best, admit};
}

// GetPreferredAllocation: (available, must_include, size) -> preferred indices.
using Prefer = std::function<std::vector<int>(const std::vector<int>&, const std::vector<int>&,
                                              int)>;

// devicesToAllocate for one container and resource; removes the result from r.free.
std::vector<int> DevicesToAllocate(Resource& r, int needed, const Hint& hint,
                                   const Prefer& prefer) {
  std::set<int> allocated;
  auto take_from = [&](const std::vector<int>& devices) {
    for (int d : devices) {
      if (needed == 0) return true;
      if (r.free.count(d) == 0 || allocated.count(d) != 0) continue;
      allocated.insert(d);
      --needed;
    }
    return needed == 0;
  };
  const int size = needed;
  std::vector<int> aligned, unaligned, no_affinity;
  for (int d : r.free) {
    if (!hint.affinity || r.numa[d] == 0) {
      no_affinity.push_back(d);
    } else if (r.numa[d] & *hint.affinity) {
      aligned.push_back(d);
    } else {
      unaligned.push_back(d);
    }
  }
  auto ask = [&](const std::vector<int>& from) {
    std::vector<int> available = from;
    std::vector<int> must(allocated.begin(), allocated.end());
    std::vector<int> answer = prefer ? prefer(available, must, size) : std::vector<int>{};
    std::sort(answer.begin(), answer.end());  // the kubelet iterates a sorted set
    return answer;
  };
  auto done = [&]() {
    for (int d : allocated) r.free.erase(d);
    return std::vector<int>(allocated.begin(), allocated.end());
  };
  if (needed < static_cast<int>(aligned.size())) {
    std::vector<int> answer = ask(aligned), in_aligned;
    for (int d : answer) {
      if (std::binary_search(aligned.begin(), aligned.end(), d)) in_aligned.push_back(d);
    }
    if (take_from(in_aligned) || take_from(aligned)) return done();
  }
  if (take_from(aligned)) return done();
  std::vector<int> all(r.free.begin(), r.free.end());
  if (take_from(ask(all)) || take_from(unaligned) || take_from(no_affinity)) return done();
  return done();
}

struct Node {
  std::string name;
  topology::TopologyPtr topology;
};

struct Pod {
  int gpus = 0, hcas = 0;
  int leaves_at = 0;       // arrival index at which it leaves
  bool gpus_first = true;  // allocation order of the two resources
};

std::vector<Pod> Stream(const Node& node, int count, unsigned seed) {
  // Shapes of real GPU jobs: (GPUs, HCAs), scaled down to what the node has.
  static const std::pair<int, int> kShapes[] = {{1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 2},
                                                {4, 4}, {8, 2}, {8, 4}, {8, 8}, {0, 1}};
  std::mt19937 rng(seed);
  int gpus = static_cast<int>(node.topology->gpus().size());
  int hcas = static_cast<int>(node.topology->hcas().size());
  std::vector<Pod> pods;
  for (int i = 0; i < count; ++i) {
    auto [g, h] = kShapes[rng() % std::size(kShapes)];
    Pod p;
    p.gpus = std::min(g, gpus);
    p.hcas = std::min(h, hcas);
    p.leaves_at = i + 1 + static_cast<int>(rng() % 12);
    p.gpus_first = rng() % 2 == 0;
    pods.push_back(p);
  }
  return pods;
}

struct Tally {
  long near = 0, near_possible = 0;     // HCAs at PIX/PXB to a pod GPU / when one was free
  long covered = 0, multi = 0;          // multi-HCA pods covering their GPUs' NUMA nodes
  long rejected = 0, admitted = 0, unschedulable = 0;
};

enum class HcaPolicy { kOurs, kNumaGreedy, kKubeletDefault };
const char* Name(HcaPolicy p) {
  switch (p) {
    case HcaPolicy::kOurs: return "ours";
    case HcaPolicy::kNumaGreedy: return "greedy NUMA-only";
    case HcaPolicy::kKubeletDefault: return "kubelet default";
  }
  return "";
}

class Simulation {
 public:
  Simulation(const Node& node, HcaPolicy policy, TmPolicy tm)
      : t_(*node.topology), allocator_(node.topology), policy_(policy), tm_(tm) {
    numa_nodes_ = static_cast<int>(t_.numa_nodes().size());
    auto fill = [&](Resource& r, const auto& devices) {
      for (const auto& d : devices) {
        r.ids.push_back(d.place.pci);
        r.numa.push_back(MaskOf(d.place.numa));
        r.free.insert(static_cast<int>(r.ids.size()) - 1);
      }
    };
    fill(gpus_, t_.gpus());
    fill(hcas_, t_.hcas());
  }

  Tally Run(const std::vector<Pod>& pods) {
    Tally tally;
    std::multimap<int, std::pair<std::vector<int>, std::vector<int>>> running;
    for (int i = 0; i < static_cast<int>(pods.size()); ++i) {
      for (auto it = running.begin(); it != running.end() && it->first <= i;) {
        for (int g : it->second.first) gpus_.free.insert(g);
        for (int h : it->second.second) hcas_.free.insert(h);
        it = running.erase(it);
      }
      const Pod& pod = pods[i];
      if (static_cast<int>(gpus_.free.size()) < pod.gpus ||
          static_cast<int>(hcas_.free.size()) < pod.hcas) {
        ++tally.unschedulable;  // the scheduler would not bind it here
        continue;
      }
      std::vector<std::vector<Hint>> providers;
      if (pod.gpus > 0) providers.push_back(DeviceHints(gpus_, numa_nodes_, pod.gpus));
      providers.push_back(DeviceHints(hcas_, numa_nodes_, pod.hcas));
      auto [hint, admit] = Merge(providers, numa_nodes_, tm_);
      if (!admit) {
        ++tally.rejected;
        continue;
      }
      ++tally.admitted;
      std::vector<int> pod_gpus, pod_hcas;
      std::set<int> hcas_free_then;
      auto allocate_gpus = [&]() {
        if (pod.gpus > 0) pod_gpus = DevicesToAllocate(gpus_, pod.gpus, hint, PackGpus());
      };
      auto allocate_hcas = [&]() {
        hcas_free_then = hcas_.free;
        pod_hcas = DevicesToAllocate(hcas_, pod.hcas, hint, HcaPrefer(pod_gpus));
      };
      if (pod.gpus_first) {
        allocate_gpus();
        allocate_hcas();
      } else {
        allocate_hcas();
        allocate_gpus();
      }
      Measure(pod_gpus, pod_hcas, hcas_free_then, tally);
      running.emplace(pod.leaves_at, std::make_pair(pod_gpus, pod_hcas));
    }
    return tally;
  }

 private:
  Mask MaskOf(const std::optional<int>& numa) const {
    if (!numa) return 0;
    const std::vector<int>& nodes = t_.numa_nodes();
    auto it = std::find(nodes.begin(), nodes.end(), *numa);
    return it == nodes.end() ? 0 : 1u << (it - nodes.begin());
  }

  bool Near(int hca, int gpu) const {
    return t_.Path(hca, gpu) <= topology::PathClass::kPXB;
  }

  void Measure(const std::vector<int>& gpus, const std::vector<int>& hcas,
               const std::set<int>& hcas_free_then, Tally& tally) const {
    if (gpus.empty()) return;
    auto near_any = [&](int h) {
      return std::any_of(gpus.begin(), gpus.end(), [&](int g) { return Near(h, g); });
    };
    long possible = std::count_if(hcas_free_then.begin(), hcas_free_then.end(), near_any);
    long got = std::count_if(hcas.begin(), hcas.end(), near_any);
    tally.near_possible += std::min<long>(possible, hcas.size());
    tally.near += std::min<long>(got, std::min<long>(possible, hcas.size()));
    if (hcas.size() >= 2) {
      Mask gpu_numa = 0, hca_numa = 0;
      for (int g : gpus) gpu_numa |= gpus_.numa[g];
      for (int h : hcas) hca_numa |= hcas_.numa[h];
      ++tally.multi;
      tally.covered += (gpu_numa & ~hca_numa) == 0;
    }
  }

  // The GPU plugin: keeps must_include, then packs: the NUMA node with the fewest free GPUs
  // that still fits the rest (else the fullest first), inside it the switch with the fewest
  // free GPUs, then the lowest address.
  Prefer PackGpus() const {
    return [this](const std::vector<int>& available, const std::vector<int>& must, int size) {
      std::vector<int> out = must;
      std::map<Mask, int> per_numa;
      std::map<std::string, int> per_switch;
      for (int d : available) {
        ++per_numa[gpus_.numa[d]];
        ++per_switch[t_.gpus()[d].place.Switch()];
      }
      int want = size - static_cast<int>(must.size());
      std::vector<int> rest;
      for (int d : available) {
        if (std::find(must.begin(), must.end(), d) == must.end()) rest.push_back(d);
      }
      auto key = [&](int d) {
        int numa_free = per_numa[gpus_.numa[d]];
        bool fits = numa_free >= want;
        return std::make_tuple(!fits, fits ? numa_free : -numa_free, gpus_.numa[d],
                               per_switch[t_.gpus()[d].place.Switch()], d);
      };
      std::sort(rest.begin(), rest.end(), [&](int a, int b) { return key(a) < key(b); });
      for (int i = 0; i < want && i < static_cast<int>(rest.size()); ++i) out.push_back(rest[i]);
      return out;
    };
  }

  Prefer HcaPrefer(const std::vector<int>& pod_gpus) const {
    if (policy_ == HcaPolicy::kKubeletDefault) return nullptr;
    return [this, pod_gpus](const std::vector<int>& available, const std::vector<int>& must,
                            int size) {
      allocator::Request r;
      for (int d : available) r.available.push_back(hcas_.ids[d]);
      for (int d : must) r.must_include.push_back(hcas_.ids[d]);
      r.size = size;
      for (int g : pod_gpus) r.gpus.container_gpus.push_back(gpus_.ids[g]);
      r.gpus.free_gpus_known = true;
      for (int g : gpus_.free) r.gpus.free_gpus.push_back(gpus_.ids[g]);
      std::vector<int> out;
      if (policy_ == HcaPolicy::kOurs) {
        std::vector<std::string> ids = allocator_.Prefer(r).value();
        for (const std::string& id : ids) out.push_back(t_.HcaIndex(id));
        return out;
      }
      return NumaGreedy(available, must, size, pod_gpus);
    };
  }

  // Greedy NUMA-only: must_include, then NUMA nodes by how many of the container's GPUs they
  // hold, then by free HCAs; lowest addresses within. Sees NUMA nodes, not the PCIe tree.
  std::vector<int> NumaGreedy(const std::vector<int>& available, const std::vector<int>& must,
                              int size, const std::vector<int>& pod_gpus) const {
    std::map<Mask, int> gpus_on, hcas_on;
    for (int g : pod_gpus) ++gpus_on[gpus_.numa[g]];
    for (int h : available) ++hcas_on[hcas_.numa[h]];
    std::vector<int> out = must, rest;
    for (int h : available) {
      if (std::find(must.begin(), must.end(), h) == must.end()) rest.push_back(h);
    }
    std::sort(rest.begin(), rest.end(), [&](int a, int b) {
      Mask na = hcas_.numa[a], nb = hcas_.numa[b];
      return std::make_tuple(-gpus_on[na], -hcas_on[na], na, a) <
             std::make_tuple(-gpus_on[nb], -hcas_on[nb], nb, b);
    });
    for (int i = 0; static_cast<int>(out.size()) < size; ++i) out.push_back(rest[i]);
    return out;
  }

  const topology::Topology& t_;
  allocator::ExclusiveAllocator allocator_;
  HcaPolicy policy_;
  TmPolicy tm_;
  int numa_nodes_ = 0;
  Resource gpus_, hcas_;
};

std::string Percent(long part, long whole) {
  if (whole == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * part / whole);
  return buf;
}

// How often the bounded search (greedy + local search) finds the exhaustive optimum, on nodes
// too large for the default exact search.
void SearchGap(unsigned seed) {
  std::printf("\n| node | requests | bounded search optimal | same GPU match |\n"
              "|---|---|---|---|\n");
  struct Case {
    const char* name;
    topology::TopologyPtr topology;
  };
  for (const Case& c : {Case{"scaled DGX, 32 HCAs", ScaledDgx(32)},
                        Case{"scaled DGX, 64 HCAs", ScaledDgx(64)},
                        Case{"64 distinct HCAs", DistinctHcas(64)}}) {
    allocator::ExclusiveAllocator bounded(c.topology);
    allocator::ExclusiveAllocator exhaustive(c.topology, allocator::Options{1 << 30, 1LL << 50});
    std::vector<std::string> hcas = HcaIds(*c.topology), gpus = GpuIds(*c.topology);
    std::mt19937 rng(seed);
    int optimal = 0, same_match = 0, total = 0;
    for (int i = 0; i < 100; ++i) {
      allocator::Request r;
      for (const std::string& h : hcas) {
        if (rng() % 4 != 0) r.available.push_back(h);
      }
      r.size = 1 + static_cast<int>(rng() % 4);
      if (rng() % 2 == 0) {
        size_t first = rng() % gpus.size(), stride = 1 + rng() % 3;
        for (size_t g = 0; g < 8; ++g) {
          r.gpus.container_gpus.push_back(gpus[(first + g * stride) % gpus.size()]);
        }
      }
      std::vector<std::string> a = bounded.Prefer(r).value();
      std::vector<std::string> b = exhaustive.Prefer(r).value();
      allocator::Score sa = bounded.Evaluate(r, a).value(), sb = bounded.Evaluate(r, b).value();
      ++total;
      optimal += !(sa < sb);
      same_match += sa.gpu_match == sb.gpu_match;
    }
    std::printf("| %s | %d | %d | %d |\n", c.name, total, optimal, same_match);
  }
}

}  // namespace
}  // namespace rdp::bench

int main(int argc, char** argv) {
  using namespace rdp::bench;
  CLI::App app{"Replays pod streams and compares HCA placement policies."};
  std::string xml = RDP_DEFAULT_TOPOLOGY_XML;
  int pods = 3000;
  unsigned seed = 1;
  app.add_option("--topology-xml", xml, "hwloc XML of the dgx-h100-like node");
  app.add_option("--pods", pods, "pod arrivals per stream");
  app.add_option("--seed", seed, "stream seed");
  CLI11_PARSE(app, argc, argv);

  std::vector<Node> nodes;
  rdp::topology::DiscoveryOptions options;
  options.topology_xml = xml;
  absl::StatusOr<rdp::topology::TopologyPtr> dgx = rdp::topology::Discover(options);
  if (dgx.ok() && !(*dgx)->hcas().empty()) {
    nodes.push_back({"dgx-h100-like.xml", *dgx});
  } else {
    std::cerr << "cannot load " << xml << " ("
              << (dgx.ok() ? "no HCAs" : dgx.status().ToString())
              << "); using the hand-built equivalent\n";
    nodes.push_back({"dgx-h100-like (by hand)", DgxH100Like()});
  }
  nodes.push_back({"two-level switches", TwoLevelSwitches()});
  nodes.push_back({"4 NUMA nodes", FourNuma()});
  nodes.push_back({"fewer HCAs than GPUs", FewerHcasThanGpus()});

  std::printf(
      "| topology | HCA policy | near HCAs, best-effort | near HCAs, none | NUMA cover, "
      "best-effort | NUMA cover, none | rejected, single-numa-node | rejected, restricted |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (const Node& node : nodes) {
    std::vector<Pod> stream = Stream(node, pods, seed);
    for (HcaPolicy policy :
         {HcaPolicy::kOurs, HcaPolicy::kNumaGreedy, HcaPolicy::kKubeletDefault}) {
      Tally best_effort = Simulation(node, policy, TmPolicy::kBestEffort).Run(stream);
      Tally none = Simulation(node, policy, TmPolicy::kNone).Run(stream);
      Tally single = Simulation(node, policy, TmPolicy::kSingleNuma).Run(stream);
      Tally restricted = Simulation(node, policy, TmPolicy::kRestricted).Run(stream);
      std::printf("| %s | %s | %s | %s | %s | %s | %ld / %ld | %ld / %ld |\n", node.name.c_str(),
                  Name(policy), Percent(best_effort.near, best_effort.near_possible).c_str(),
                  Percent(none.near, none.near_possible).c_str(),
                  Percent(best_effort.covered, best_effort.multi).c_str(),
                  Percent(none.covered, none.multi).c_str(), single.rejected,
                  single.rejected + single.admitted, restricted.rejected,
                  restricted.rejected + restricted.admitted);
    }
  }
  SearchGap(seed);
  return 0;
}
