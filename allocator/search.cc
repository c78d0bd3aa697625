// The scored search: objective evaluation (Scorer), the placeholder policy, exact enumeration
// over classes of interchangeable HCAs, and the bounded greedy + local search beyond it.

#include <algorithm>
#include <limits>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/types/span.h"
#include "allocator/model.h"

namespace rdp::allocator {
namespace {

// A candidate answer with its score. Better: higher score, then lower PCI addresses.
struct Scored {
  Score score;
  std::vector<int> set;  // sorted
};

// Higher score first, then the lower tie-break: a set's addresses, or one candidate's.
template <typename Tie>
bool Better(const Score& a, const Tie& a_tie, const Score& b, const Tie& b_tie) {
  if (b < a) return true;
  if (a < b) return false;
  return a_tie < b_tie;
}

bool Better(const Scored& a, const Scored& b) { return Better(a.score, a.set, b.score, b.set); }

// Without container GPUs, a candidate that shares no root and no switch with another candidate
// or a must-include HCA scores by what its groups are, not by which they are: its NUMA node,
// whether its root and each switch above it are intact, its degradation and its free-GPU
// affinity. Such candidates with equal keys are interchangeable although their groups differ
// (64 HCAs each on its own root are two classes, one per NUMA node, not 64). With container
// GPUs the switch a candidate covers matters by identity, so only the model's classes merge.
// IsolatedKeys fills key[h] for every HCA: the candidate's dense key, or -1; its scratch holds
// the group counts and the distinct keys (flat: a few per node), reused across calls.
struct IsolatedScratch {
  std::vector<int> per_root, per_switch, k, keys, key_start;
};

void IsolatedKeys(const Problem& p, std::vector<int>* key, IsolatedScratch& s) {
  const Model& m = *p.model;
  key->assign(m.hca_count, -1);
  if (!p.gpus.empty()) return;
  s.per_root.assign(m.root_size.size(), 0);
  s.per_switch.assign(m.switch_size.size(), 0);
  auto count = [&](int h) {
    if (m.hca_root[h] >= 0) ++s.per_root[m.hca_root[h]];
    for (int sw : m.hca_switches[h]) ++s.per_switch[sw];
  };
  for (int h : p.must) count(h);
  for (int h : p.candidates) count(h);
  s.keys.clear();
  s.key_start.assign(1, 0);
  for (int h : p.candidates) {
    const int root = m.hca_root[h];
    if (root >= 0 && s.per_root[root] > 1) continue;
    const std::vector<int>& chain = m.hca_switches[h];
    if (std::any_of(chain.begin(), chain.end(), [&](int sw) { return s.per_switch[sw] > 1; })) {
      continue;
    }
    s.k.assign({m.hca_numa[h], root < 0 ? -1 : p.root_intact[root], m.hca_degraded[h],
                p.free_affinity[h]});
    for (int sw : chain) s.k.push_back(p.switch_intact[sw]);
    int id = 0;
    const int distinct = static_cast<int>(s.key_start.size()) - 1;
    for (; id < distinct; ++id) {
      const auto from = s.keys.begin() + s.key_start[id], to = s.keys.begin() + s.key_start[id + 1];
      if (std::equal(from, to, s.k.begin(), s.k.end())) break;
    }
    if (id == distinct) {
      s.keys.insert(s.keys.end(), s.k.begin(), s.k.end());
      s.key_start.push_back(static_cast<int>(s.keys.size()));
    }
    (*key)[h] = id;
  }
}

// Classes of interchangeable candidates, flat: class i is members[start[i] .. start[i + 1]),
// lowest PCI address first; classes in the order of their lowest member, so that enumeration
// order is deterministic. Refilled in place, so a thread's lists stop allocating.
class ClassList {
 public:
  int size() const { return static_cast<int>(start_.size()) - 1; }
  absl::Span<const int> operator[](int i) const {
    return absl::MakeConstSpan(members_.data() + start_[i], start_[i + 1] - start_[i]);
  }

  // Groups `items` (ascending) by slot[item] (a dense id per group, any order).
  void Group(const std::vector<int>& items, const std::vector<int>& slot, int slots) {
    order_.assign(slots, -1);
    count_.assign(slots + 1, 0);
    int classes = 0;
    for (int h : items) {
      int& at = order_[slot[h]];
      if (at < 0) at = classes++;
      ++count_[at + 1];
    }
    start_.assign(count_.begin(), count_.begin() + classes + 1);
    for (int c = 0; c < classes; ++c) start_[c + 1] += start_[c];
    members_.resize(items.size());
    count_.assign(start_.begin(), start_.end());
    for (int h : items) members_[count_[order_[slot[h]]]++] = h;
  }

  // The classes of `from` for which keep(first member) holds.
  template <typename Keep>
  void Filter(const ClassList& from, Keep&& keep) {
    members_.clear();
    start_.assign(1, 0);
    for (int c = 0; c < from.size(); ++c) {
      absl::Span<const int> m = from[c];
      if (!keep(m.front())) continue;
      members_.insert(members_.end(), m.begin(), m.end());
      start_.push_back(static_cast<int>(members_.size()));
    }
  }

 private:
  std::vector<int> members_;
  std::vector<int> start_ = {0};
  std::vector<int> order_, count_;  // Group's scratch
};

std::vector<int> Sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Every count vector over the classes (how many of each class's lowest members to take),
// scored; the best with its score. Reusable: Run() starts afresh.
class ExactSearch {
 public:
  const Scored& Run(const Problem& p, const ClassList& classes, long long budget,
                    Scorer& scorer) {
    classes_ = &classes;
    scorer_ = &scorer;
    scorer.Reset(p);
    budget_ = budget;
    stopped_ = false;
    best_.set.clear();
    suffix_.assign(classes.size() + 1, 0);
    for (int i = classes.size(); i-- > 0;) suffix_[i] = suffix_[i + 1] + classes[i].size();
    current_.assign(p.must.begin(), p.must.end());
    Visit(0, p.size - static_cast<int>(p.must.size()));
    return best_;
  }
  // False when the work bound stopped the last Run early.
  bool complete() const { return !stopped_; }

 private:
  void Visit(int i, int want) {
    if (scorer_->work() >= budget_ && !best_.set.empty()) {  // the hard bound
      stopped_ = true;
      return;
    }
    if (want == 0) {
      leaf_.assign(current_.begin(), current_.end());
      std::sort(leaf_.begin(), leaf_.end());
      const Score score = scorer_->Evaluate(leaf_, best_.set.empty() ? nullptr : &best_.score);
      if (best_.set.empty() || Better(score, leaf_, best_.score, best_.set)) {
        best_.score = score;
        best_.set.assign(leaf_.begin(), leaf_.end());
      }
      return;
    }
    if (i == classes_->size() || suffix_[i] < static_cast<size_t>(want)) return;
    absl::Span<const int> members = (*classes_)[i];
    int most = std::min<int>(members.size(), want);
    for (int take = 0; take <= most; ++take) {
      if (take > 0) current_.push_back(members[take - 1]);
      Visit(i + 1, want - take);
    }
    current_.resize(current_.size() - most);
  }

  const ClassList* classes_ = nullptr;
  Scorer* scorer_ = nullptr;
  long long budget_ = 0;  // of Scorer::work()
  std::vector<size_t> suffix_;  // candidates in classes i..end
  std::vector<int> current_;
  std::vector<int> leaf_;  // current_, sorted: reused, so that a leaf allocates nothing
  Scored best_;
  bool stopped_ = false;
};

class LocalSearch {
 public:
  LocalSearch(const Problem& p, const ClassList& classes, long long budget, Scorer& scorer)
      : p_(p), classes_(classes), scorer_(scorer), budget_(budget),
        in_set_(p.model->hca_count, 0) {
    scorer_.Reset(p);
  }

  // Adds, one at a time, the candidate that scores best with those already chosen. Once the
  // budget is spent the rest come from `fallback` in order, unscored.
  std::vector<int> Greedy(const std::vector<int>& fallback) {
    std::vector<int> set = p_.must;
    for (int h : set) in_set_[h] = 1;
    while (set.size() < static_cast<size_t>(p_.size)) {
      int pick = -1;
      if (scorer_.work() < budget_) {
        Score best;
        for (int c = 0; c < classes_.size(); ++c) {
          int h = LowestFree(classes_[c]);
          if (h < 0) continue;
          set.push_back(h);
          const Score score = scorer_.Evaluate(set, pick < 0 ? nullptr : &best);
          set.pop_back();
          if (pick < 0 || Better(score, h, best, pick)) {
            best = score;
            pick = h;
          }
        }
      } else {
        for (int h : fallback) {
          if (!in_set_[h]) {
            pick = h;
            break;
          }
        }
      }
      set.push_back(pick);
      in_set_[pick] = 1;
    }
    for (int h : set) in_set_[h] = 0;
    return Sorted(set);
  }

  // Best-improvement swaps of one chosen candidate for one unchosen (the lowest free member of
  // each class), until none improves or the budget is spent.
  Scored Improve(std::vector<int> start) {
    Scored current{Score{}, std::move(start)};
    current.score = scorer_.Evaluate(current.set);
    for (int h : current.set) in_set_[h] = 1;
    while (scorer_.work() < budget_) {
      Scored best = current;
      int out = -1, in = -1;
      for (size_t i = 0; i < current.set.size() && scorer_.work() < budget_; ++i) {
        int x = current.set[i];
        if (std::binary_search(p_.must.begin(), p_.must.end(), x)) continue;
        for (int c = 0; c < classes_.size(); ++c) {
          int y = LowestFree(classes_[c]);
          if (y < 0 || scorer_.work() >= budget_) continue;
          // current.set with x swapped for y, still sorted: y goes where it belongs.
          next_.assign(current.set.begin(), current.set.end());
          next_.erase(next_.begin() + static_cast<std::ptrdiff_t>(i));
          next_.insert(std::lower_bound(next_.begin(), next_.end(), y), y);
          const Score score = scorer_.Evaluate(next_, &best.score);
          if (Better(score, next_, best.score, best.set)) {
            best.score = score;
            best.set = next_;
            out = x;
            in = y;
          }
        }
      }
      if (out < 0) break;
      in_set_[out] = 0;
      in_set_[in] = 1;
      current = std::move(best);
    }
    for (int h : current.set) in_set_[h] = 0;
    return current;
  }

 private:
  int LowestFree(absl::Span<const int> members) const {
    for (int h : members) {
      if (!in_set_[h]) return h;
    }
    return -1;
  }

  const Problem& p_;
  const ClassList& classes_;
  Scorer& scorer_;
  long long budget_;  // of Scorer::work()
  std::vector<char> in_set_;
  std::vector<int> next_;  // a swap's candidate set: reused, so that a swap allocates nothing
};

// Per-thread buffers of the search, reused by every request the thread serves: once it has
// served a request of a given shape, the exact paths allocate only the answer.
struct Scratch {
  Scorer scorer;
  ExactSearch exact;
  IsolatedScratch isolated;
  ClassList classes, reduced;
  std::vector<int> key, slot, best;
  std::vector<long long> ways, next;
};

// Interchangeable candidates: the same Model::hca_class, or the same IsolatedKeys key.
void Classes(const Problem& p, Scratch& s) {
  IsolatedKeys(p, &s.key, s.isolated);
  // Model class ids are dense (below hca_count), and so are isolated keys (after them).
  s.slot.resize(p.model->hca_count);
  for (int h : p.candidates) {
    s.slot[h] = s.key[h] >= 0 ? p.model->hca_count + s.key[h] : p.model->hca_class[h];
  }
  s.classes.Group(p.candidates, s.slot, 2 * p.model->hca_count);
}

// How many distinct answers the exact search would score (per class, how many members to
// take), saturating just above `limit`.
long long CountAnswers(const ClassList& classes, int want, long long limit, Scratch& s) {
  s.ways.assign(want + 1, 0);
  s.ways[0] = 1;
  for (int c = 0; c < classes.size(); ++c) {
    const int members = static_cast<int>(classes[c].size());
    s.next.assign(want + 1, 0);
    for (int total = 0; total <= want; ++total) {
      for (int take = 0; take <= std::min(members, total); ++take) {
        s.next[total] = std::min(limit + 1, s.next[total] + s.ways[total - take]);
      }
    }
    s.ways.swap(s.next);
  }
  return s.ways[want];
}

}  // namespace

Scorer::Scorer(const Problem& problem) { Reset(problem); }

void Scorer::Reset(const Problem& problem) {
  p_ = &problem;
  numa_count_.assign(problem.model->numa_size.size(), 0);
  stamp_root_.assign(problem.model->root_size.size(), 0);
  stamp_switch_.assign(problem.model->switch_size.size(), 0);
  stamp_ = 0;
  work_ = 0;
}

int Scorer::MaxAssignment(int n, int m) {
  // Hungarian method (potentials, O(n^2 m)) minimising -weight; every weight is >= 0, so the
  // best assignment of all n rows is also the best matching.
  constexpr int kInf = std::numeric_limits<int>::max() / 2;
  work_ += static_cast<long long>(n) * n * m;
  u_.assign(n + 1, 0);
  v_.assign(m + 1, 0);
  match_.assign(m + 1, 0);
  way_.assign(m + 1, 0);
  auto cost = [&](int i, int j) { return -matrix_[(i - 1) * m + (j - 1)]; };
  for (int i = 1; i <= n; ++i) {
    match_[0] = i;
    int j0 = 0;
    minv_.assign(m + 1, kInf);
    used_.assign(m + 1, 0);
    do {
      used_[j0] = 1;
      int i0 = match_[j0], delta = kInf, j1 = 0;
      for (int j = 1; j <= m; ++j) {
        if (used_[j]) continue;
        int cur = cost(i0, j) - u_[i0] - v_[j];
        if (cur < minv_[j]) {
          minv_[j] = cur;
          way_[j] = j0;
        }
        if (minv_[j] < delta) {
          delta = minv_[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= m; ++j) {
        if (used_[j]) {
          u_[match_[j]] += delta;
          v_[j] -= delta;
        } else {
          minv_[j] -= delta;
        }
      }
      j0 = j1;
    } while (match_[j0] != 0);
    do {
      int j1 = way_[j0];
      match_[j0] = match_[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  int total = 0;
  for (int j = 1; j <= m; ++j) {
    if (match_[j] != 0) total -= cost(match_[j], j);
  }
  return total;
}

void Scorer::BuildMatrix(const std::vector<int>& set, int* rows, int* cols) {
  const int gpus = static_cast<int>(p_->gpus.size());
  const int hcas = static_cast<int>(set.size());
  const bool by_hca = hcas <= gpus;
  *rows = by_hca ? hcas : gpus;
  *cols = by_hca ? gpus : hcas;
  matrix_.resize(static_cast<size_t>(*rows) * *cols);
  work_ += static_cast<long long>(*rows) * *cols;
  for (int h = 0; h < hcas; ++h) {
    const int* weights = p_->gpu_weight.row(set[h]).data();
    for (int g = 0; g < gpus; ++g) matrix_[by_hca ? h * *cols + g : g * *cols + h] = weights[g];
  }
}

int Scorer::ColumnBound(int rows, int cols) {
  work_ += static_cast<long long>(rows) * cols;
  int bound = 0;
  for (int c = 0; c < cols; ++c) {
    int best = 0;
    for (int r = 0; r < rows; ++r) best = std::max(best, matrix_[r * cols + c]);
    bound += best;
  }
  return bound;
}

int Scorer::Matching(const std::vector<int>& set, int bar) {
  // The greedy below on bits first, when the HCAs are the rows (no more of them than GPUs) and
  // there are at most 64 GPUs: each HCA takes the lowest free GPU at its row maximum, those
  // with the fewest such GPUs first. Reaching the sum of row maxima needs no matrix at all.
  const int gpus = static_cast<int>(p_->gpus.size());
  const int hcas = static_cast<int>(set.size());
  if (hcas <= gpus && gpus <= 64 && hcas <= kFastRows) {
    work_ += static_cast<long long>(hcas) * gpus;  // as BuildMatrix counts it
    std::pair<int, int> order[kFastRows];  // (GPUs at the row maximum, row)
    for (int r = 0; r < hcas; ++r) order[r] = {__builtin_popcountll(p_->gpu_best_columns[set[r]]), r};
    std::sort(order, order + hcas);
    std::uint64_t used = 0;
    int total = 0;
    bool reached = true;
    for (int i = 0; i < hcas && reached; ++i) {
      const int h = set[order[i].second];
      const std::uint64_t free = p_->gpu_best_columns[h] & ~used;
      reached = free != 0;
      used |= free & (~free + 1);
      total += p_->gpu_best[h];
    }
    if (reached) return total;
    work_ -= static_cast<long long>(hcas) * gpus;  // BuildMatrix counts it again
  }
  int rows = 0, cols = 0;
  BuildMatrix(set, &rows, &cols);
  // Usually every row can take a distinct column at its own maximum: then the sum of row
  // maxima, an upper bound, is reached and the Hungarian method is not needed. Rows with the
  // fewest columns at their maximum choose first, so that a flexible row does not take the
  // only column of a constrained one.
  order_.clear();
  for (int r = 0; r < rows; ++r) {
    const int* row = matrix_.data() + r * cols;
    int best = *std::max_element(row, row + cols);
    int choices = static_cast<int>(std::count(row, row + cols, best));
    order_.push_back({choices, r});
  }
  std::sort(order_.begin(), order_.end());
  used_.assign(cols, 0);
  int total = 0;
  for (const auto& [choices, r] : order_) {
    const int* row = matrix_.data() + r * cols;
    int best = *std::max_element(row, row + cols);
    int c = 0;
    while (c < cols && (used_[c] || row[c] != best)) ++c;
    if (c == cols) {
      int bound = ColumnBound(rows, cols);
      return bound < bar ? bound : MaxAssignment(rows, cols);
    }
    used_[c] = 1;
    total += best;
  }
  return total;
}

int Scorer::Transportation(const std::vector<int>& set, int capacity) {
  // Replicating each GPU `capacity` times for the Hungarian method would be O(k^3). Merging
  // HCAs with equal weight rows (far-away HCAs mostly share one row) into types and solving a
  // min-cost flow source -> type -> GPU -> sink keeps the network small.
  const int gpus = static_cast<int>(p_->gpus.size());
  types_.clear();
  for (int h : set) {
    const int* row = p_->gpu_weight.row(h).data();
    auto same = [&](const std::pair<int, int>& t) {
      return std::equal(row, row + gpus, p_->gpu_weight.row(t.first).data());
    };
    auto it = std::find_if(types_.begin(), types_.end(), same);
    if (it == types_.end()) {
      types_.push_back({h, 1});
    } else {
      ++it->second;
    }
  }
  const int types = static_cast<int>(types_.size());
  const int source = 0, sink = types + gpus + 1, nodes = types + gpus + 2;
  edges_.clear();
  head_.assign(nodes, -1);
  auto add = [&](int from, int to, int cap, int cost) {
    edges_.push_back({to, cap, cost, head_[from]});
    head_[from] = static_cast<int>(edges_.size()) - 1;
    edges_.push_back({from, 0, -cost, head_[to]});
    head_[to] = static_cast<int>(edges_.size()) - 1;
  };
  for (int t = 0; t < types; ++t) {
    add(source, 1 + t, types_[t].second, 0);
    const int* row = p_->gpu_weight.row(types_[t].first).data();
    for (int g = 0; g < gpus; ++g) add(1 + t, 1 + types + g, types_[t].second, -row[g]);
  }
  for (int g = 0; g < gpus; ++g) add(1 + types + g, sink, capacity, 0);

  // Successive shortest paths (Bellman-Ford queue: the type -> GPU costs are negative).
  constexpr int kInf = std::numeric_limits<int>::max() / 2;
  int total = 0;
  while (true) {
    dist_.assign(nodes, kInf);
    via_.assign(nodes, -1);
    used_.assign(nodes, 0);
    queue_.clear();
    dist_[source] = 0;
    queue_.push_back(source);
    for (size_t q = 0; q < queue_.size(); ++q) {
      int u = queue_[q];
      used_[u] = 0;
      for (int e = head_[u]; e >= 0; e = edges_[e].next) {
        work_ += 4;  // a relaxation costs about four matrix cells
        const FlowEdge& edge = edges_[e];
        if (edge.cap > 0 && dist_[u] + edge.cost < dist_[edge.to]) {
          dist_[edge.to] = dist_[u] + edge.cost;
          via_[edge.to] = e;
          if (!used_[edge.to]) {
            used_[edge.to] = 1;
            queue_.push_back(edge.to);
          }
        }
      }
    }
    if (dist_[sink] == kInf) break;
    int flow = kInf;
    for (int v = sink; v != source; v = edges_[via_[v] ^ 1].to) {
      flow = std::min(flow, edges_[via_[v]].cap);
    }
    for (int v = sink; v != source; v = edges_[via_[v] ^ 1].to) {
      edges_[via_[v]].cap -= flow;
      edges_[via_[v] ^ 1].cap += flow;
    }
    total -= flow * dist_[sink];
  }
  return total;
}

Score Scorer::Evaluate(const std::vector<int>& set, const Score* bar) {
  const Model& m = *p_->model;
  Score s;
  // Per HCA: group bookkeeping and GPU coverage; per call: copying, sorting and comparing the
  // candidate (calibrated so that a unit is a few nanoseconds whatever the request's shape).
  work_ += 32 + static_cast<long long>(set.size()) * (8 + p_->gpus.size());
  if (!p_->gpus.empty() && !set.empty()) {
    // The matchings are most of the cost, so a set that cannot reach the bar stops at an upper
    // bound: every HCA at its best GPU.
    int row_bound = 0;
    for (int h : set) row_bound += p_->gpu_best[h];
    s.gpu_match = row_bound;
    if (bar != nullptr && s.gpu_match < bar->gpu_match) return s;
    s.gpu_match = Matching(set, bar != nullptr ? bar->gpu_match : 0);
    if (bar != nullptr && s.gpu_match < bar->gpu_match) return s;
    s.gpu_spread_match = s.gpu_match;
    if (p_->gpu_capacity > 1) {
      bool tied = bar != nullptr && s.gpu_match == bar->gpu_match;
      s.gpu_spread_match = row_bound;
      if (tied && s.gpu_spread_match < bar->gpu_spread_match) return s;
      s.gpu_spread_match = Transportation(set, p_->gpu_capacity);
      if (tied && s.gpu_spread_match < bar->gpu_spread_match) return s;
    }
    for (int g = 0; g < static_cast<int>(p_->gpus.size()); ++g) {
      int best = 0;
      for (int h : set) best = std::max(best, p_->gpu_weight(h, g));
      s.gpu_coverage += best;
    }
    for (int target : p_->switch_targets) {
      bool covered = false;
      for (int h : set) {
        const std::vector<int>& chain = m.hca_switches[h];
        covered = covered || std::find(chain.begin(), chain.end(), target) != chain.end();
      }
      s.switch_cover += covered;
    }
  }

  std::fill(numa_count_.begin(), numa_count_.end(), 0);
  ++stamp_;
  for (int h : set) {
    if (m.hca_numa[h] >= 0) ++numa_count_[m.hca_numa[h]];
    int r = m.hca_root[h];
    if (r >= 0 && stamp_root_[r] != stamp_) {
      stamp_root_[r] = stamp_;
      ++s.touched_root_cost;
      s.broken_root_cost += p_->root_intact[r];
    }
    for (int sw : m.hca_switches[h]) {
      if (stamp_switch_[sw] == stamp_) continue;
      stamp_switch_[sw] = stamp_;
      ++s.touched_switch_cost;
      s.broken_switch_cost += p_->switch_intact[sw];
    }
    s.free_gpu_affinity += p_->free_affinity[h];
    s.degraded_cost += m.hca_degraded[h];
  }
  for (size_t n = 0; n < numa_count_.size(); ++n) {
    int count = numa_count_[n];
    if (count == 0) continue;
    s.numa_cover += p_->numa_target[n];
    s.broken_numa_cost += p_->numa_intact[n];
    if (p_->gpus.empty()) s.numa_balance -= count * count;
  }
  return s;
}

std::vector<int> PlaceholderPick(const Problem& p) {
  const Model& m = *p.model;
  std::vector<int> picked = p.must;
  // NUMA nodes, best first: those must_include already uses, then the most candidates, then
  // the lowest group; unknown NUMA last.
  std::map<int, int> per_numa;
  for (int h : p.candidates) ++per_numa[m.hca_numa[h]];
  std::vector<int> order;
  for (const auto& [numa, count] : per_numa) order.push_back(numa);
  auto used = [&](int numa) {
    return numa >= 0 && std::any_of(p.must.begin(), p.must.end(),
                                    [&](int h) { return m.hca_numa[h] == numa; });
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::make_tuple(a < 0, !used(a), -per_numa[a], a) <
           std::make_tuple(b < 0, !used(b), -per_numa[b], b);
  });
  for (int numa : order) {
    for (int h : p.candidates) {
      if (picked.size() == static_cast<size_t>(p.size)) break;
      if (m.hca_numa[h] == numa) picked.push_back(h);
    }
  }
  return Sorted(picked);
}

namespace {

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// ExactAmongReaching over s.classes, the problem's classes. gpu_match is at most the sum of the
// set's row maxima (Problem::gpu_best), so a candidate h can be in an answer reaching a bar only
// when the must-include HCAs, h and the best want - 1 other candidates, each at its row maximum,
// reach it. A candidate at least as good as the want-th best is among the top want, which reach
// any bar asked here; any other has the top want - 1 beside it. Members of a class share their
// row, so classes are kept or dropped whole (s.reduced).
std::optional<std::vector<int>> ExactAmongReaching(const Problem& p, int want,
                                                   const Options& options, Scratch& s) {
  if (p.gpus.empty() || want <= 0 || want > static_cast<int>(p.candidates.size())) {
    return std::nullopt;
  }
  s.best.clear();  // the candidates' row maxima, highest first
  for (int h : p.candidates) s.best.push_back(p.gpu_best[h]);
  std::sort(s.best.begin(), s.best.end(), std::greater<>());
  int must = 0;
  for (int h : p.must) must += p.gpu_best[h];
  int top = 0;  // the best want - 1
  for (int i = 0; i + 1 < want; ++i) top += s.best[i];
  const int kth = s.best[want - 1];
  int bar = must + top + kth;  // the best conceivable: every HCA at its row maximum
  for (int round = 0; round < 2; ++round) {
    const int need = std::min(kth, bar - must - top);
    s.reduced.Filter(s.classes, [&](int h) { return p.gpu_best[h] >= need; });
    if (CountAnswers(s.reduced, want, options.exact_limit, s) > options.exact_limit) break;
    const Scored& found = s.exact.Run(p, s.reduced, 2 * options.max_work, s.scorer);
    if (!s.exact.complete() || found.set.empty()) break;
    if (found.score.gpu_match >= bar) return found.set;
    bar = found.score.gpu_match;  // the optimum reaches it, so it is among those reaching it
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::vector<int>> ExactAmongReaching(const Problem& p, const Options& options) {
  Scratch& s = ThreadScratch();
  Classes(p, s);
  return ExactAmongReaching(p, p.size - static_cast<int>(p.must.size()), options, s);
}

std::vector<int> Search(const Problem& p, const Options& options) {
  int want = p.size - static_cast<int>(p.must.size());
  if (want == 0) return p.must;
  if (want == static_cast<int>(p.candidates.size())) return PlaceholderPick(p);
  Scratch& s = ThreadScratch();
  Classes(p, s);
  if (CountAnswers(s.classes, want, options.exact_limit, s) <= options.exact_limit) {
    const Scored& best = s.exact.Run(p, s.classes, 2 * options.max_work, s.scorer);
    if (s.exact.complete()) return best.set;
    // A few huge evaluations (dozens of HCAs against many GPUs) hit the bound: the best seen,
    // never worse than the placeholder.
    std::vector<int> placeholder = PlaceholderPick(p);
    Scored floor{s.scorer.Evaluate(placeholder), placeholder};
    return Better(floor, best) ? floor.set : best.set;
  }
  if (std::optional<std::vector<int>> exact = ExactAmongReaching(p, want, options, s)) {
    return *exact;
  }
  std::vector<int> placeholder = PlaceholderPick(p);
  LocalSearch search(p, s.classes, options.max_work, s.scorer);
  Scored best = search.Improve(search.Greedy(placeholder));
  // The placeholder is a second start, and the floor: Improve scores its start even when the
  // budget is spent, and never returns worse than it.
  Scored floor = search.Improve(placeholder);
  return Better(floor, best) ? floor.set : best.set;
}

}  // namespace rdp::allocator
