// The scored search: objective evaluation (Scorer), the placeholder policy, exact enumeration
// over classes of interchangeable HCAs, and the bounded greedy + local search beyond it.

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

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

// Interchangeable candidates (same Model::hca_class), lowest PCI address first; classes ordered
// by their lowest member so that enumeration order is deterministic.
std::vector<std::vector<int>> Classes(const Problem& p) {
  // Class ids are dense (below hca_count): a position per class, -1 until it has a member.
  std::vector<int> index(p.model->hca_count, -1);
  std::vector<std::vector<int>> classes;
  for (int h : p.candidates) {
    int& at = index[p.model->hca_class[h]];
    if (at < 0) {
      at = static_cast<int>(classes.size());
      classes.emplace_back();
    }
    classes[at].push_back(h);
  }
  return classes;
}

// How many distinct answers the exact search would score (per class, how many members to
// take), saturating just above `limit`.
long long CountAnswers(const std::vector<std::vector<int>>& classes, int want, long long limit) {
  std::vector<long long> ways(want + 1, 0);
  ways[0] = 1;
  for (const std::vector<int>& members : classes) {
    std::vector<long long> next(want + 1, 0);
    for (int total = 0; total <= want; ++total) {
      for (int take = 0; take <= std::min<int>(members.size(), total); ++take) {
        next[total] = std::min(limit + 1, next[total] + ways[total - take]);
      }
    }
    ways.swap(next);
  }
  return ways[want];
}

std::vector<int> Sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

class ExactSearch {
 public:
  ExactSearch(const Problem& p, const std::vector<std::vector<int>>& classes, long long budget)
      : p_(p), classes_(classes), scorer_(p), budget_(budget), suffix_(classes.size() + 1, 0) {
    for (size_t i = classes.size(); i-- > 0;) suffix_[i] = suffix_[i + 1] + classes[i].size();
  }

  Scored Run() {
    current_ = p_.must;
    Visit(0, p_.size - static_cast<int>(p_.must.size()));
    return best_;
  }
  // False when the work bound stopped the enumeration early.
  bool complete() const { return !stopped_; }

 private:
  void Visit(size_t i, int want) {
    if (scorer_.work() >= budget_ && !best_.set.empty()) {  // the hard bound
      stopped_ = true;
      return;
    }
    if (want == 0) {
      leaf_.assign(current_.begin(), current_.end());
      std::sort(leaf_.begin(), leaf_.end());
      const Score score = scorer_.Evaluate(leaf_, best_.set.empty() ? nullptr : &best_.score);
      if (best_.set.empty() || Better(score, leaf_, best_.score, best_.set)) {
        best_.score = score;
        best_.set = leaf_;
      }
      return;
    }
    if (i == classes_.size() || suffix_[i] < static_cast<size_t>(want)) return;
    const std::vector<int>& members = classes_[i];
    int most = std::min<int>(members.size(), want);
    for (int take = 0; take <= most; ++take) {
      if (take > 0) current_.push_back(members[take - 1]);
      Visit(i + 1, want - take);
    }
    current_.resize(current_.size() - most);
  }

  const Problem& p_;
  const std::vector<std::vector<int>>& classes_;
  Scorer scorer_;
  long long budget_;  // of Scorer::work()
  std::vector<size_t> suffix_;  // candidates in classes i..end
  std::vector<int> current_;
  std::vector<int> leaf_;  // current_, sorted: reused, so that a leaf allocates nothing
  Scored best_;
  bool stopped_ = false;
};

class LocalSearch {
 public:
  LocalSearch(const Problem& p, const std::vector<std::vector<int>>& classes, long long budget)
      : p_(p), classes_(classes), scorer_(p), budget_(budget), in_set_(p.model->hca_count, 0) {}

  // Adds, one at a time, the candidate that scores best with those already chosen. Once the
  // budget is spent the rest come from `fallback` in order, unscored.
  std::vector<int> Greedy(const std::vector<int>& fallback) {
    std::vector<int> set = p_.must;
    for (int h : set) in_set_[h] = 1;
    while (set.size() < static_cast<size_t>(p_.size)) {
      int pick = -1;
      if (scorer_.work() < budget_) {
        Score best;
        for (const std::vector<int>& members : classes_) {
          int h = LowestFree(members);
          if (h < 0) continue;
          set.push_back(h);
          const Score score = Score_(set, pick < 0 ? nullptr : &best);
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
    current.score = Score_(current.set);
    for (int h : current.set) in_set_[h] = 1;
    while (scorer_.work() < budget_) {
      Scored best = current;
      int out = -1, in = -1;
      for (size_t i = 0; i < current.set.size() && scorer_.work() < budget_; ++i) {
        int x = current.set[i];
        if (std::binary_search(p_.must.begin(), p_.must.end(), x)) continue;
        for (const std::vector<int>& members : classes_) {
          int y = LowestFree(members);
          if (y < 0 || scorer_.work() >= budget_) continue;
          // current.set with x swapped for y, still sorted: y goes where it belongs.
          next_.assign(current.set.begin(), current.set.end());
          next_.erase(next_.begin() + static_cast<std::ptrdiff_t>(i));
          next_.insert(std::lower_bound(next_.begin(), next_.end(), y), y);
          const Score score = Score_(next_, &best.score);
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
  int LowestFree(const std::vector<int>& members) const {
    for (int h : members) {
      if (!in_set_[h]) return h;
    }
    return -1;
  }

  Score Score_(const std::vector<int>& set, const Score* bar = nullptr) {
    return scorer_.Evaluate(set, bar);
  }

  const Problem& p_;
  const std::vector<std::vector<int>>& classes_;
  Scorer scorer_;
  long long budget_;  // of Scorer::work()
  std::vector<char> in_set_;
  std::vector<int> next_;  // a swap's candidate set: reused, so that a swap allocates nothing
};

}  // namespace

Scorer::Scorer(const Problem& problem)
    : p_(problem),
      numa_count_(problem.model->numa_size.size(), 0),
      stamp_root_(problem.model->root_size.size(), 0),
      stamp_switch_(problem.model->switch_size.size(), 0) {}

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
  const int gpus = static_cast<int>(p_.gpus.size());
  const int hcas = static_cast<int>(set.size());
  const bool by_hca = hcas <= gpus;
  *rows = by_hca ? hcas : gpus;
  *cols = by_hca ? gpus : hcas;
  matrix_.resize(static_cast<size_t>(*rows) * *cols);
  work_ += static_cast<long long>(*rows) * *cols;
  for (int h = 0; h < hcas; ++h) {
    const int* weights = p_.gpu_weight.row(set[h]).data();
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
  const int gpus = static_cast<int>(p_.gpus.size());
  types_.clear();
  for (int h : set) {
    const int* row = p_.gpu_weight.row(h).data();
    auto same = [&](const std::pair<int, int>& t) {
      return std::equal(row, row + gpus, p_.gpu_weight.row(t.first).data());
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
    const int* row = p_.gpu_weight.row(types_[t].first).data();
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
  const Model& m = *p_.model;
  Score s;
  // Per HCA: group bookkeeping and GPU coverage; per call: copying, sorting and comparing the
  // candidate (calibrated so that a unit is a few nanoseconds whatever the request's shape).
  work_ += 32 + static_cast<long long>(set.size()) * (8 + p_.gpus.size());
  if (!p_.gpus.empty() && !set.empty()) {
    // The matchings are most of the cost, so a set that cannot reach the bar stops at an upper
    // bound: every HCA at its best GPU.
    int row_bound = 0;
    for (int h : set) row_bound += p_.gpu_best[h];
    s.gpu_match = row_bound;
    if (bar != nullptr && s.gpu_match < bar->gpu_match) return s;
    s.gpu_match = Matching(set, bar != nullptr ? bar->gpu_match : 0);
    if (bar != nullptr && s.gpu_match < bar->gpu_match) return s;
    s.gpu_spread_match = s.gpu_match;
    if (p_.gpu_capacity > 1) {
      bool tied = bar != nullptr && s.gpu_match == bar->gpu_match;
      s.gpu_spread_match = row_bound;
      if (tied && s.gpu_spread_match < bar->gpu_spread_match) return s;
      s.gpu_spread_match = Transportation(set, p_.gpu_capacity);
      if (tied && s.gpu_spread_match < bar->gpu_spread_match) return s;
    }
    for (int g = 0; g < static_cast<int>(p_.gpus.size()); ++g) {
      int best = 0;
      for (int h : set) best = std::max(best, p_.gpu_weight(h, g));
      s.gpu_coverage += best;
    }
    for (int target : p_.switch_targets) {
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
      s.broken_root_cost += p_.root_intact[r];
    }
    for (int sw : m.hca_switches[h]) {
      if (stamp_switch_[sw] == stamp_) continue;
      stamp_switch_[sw] = stamp_;
      ++s.touched_switch_cost;
      s.broken_switch_cost += p_.switch_intact[sw];
    }
    s.free_gpu_affinity += p_.free_affinity[h];
    s.degraded_cost += m.hca_degraded[h];
  }
  for (size_t n = 0; n < numa_count_.size(); ++n) {
    int count = numa_count_[n];
    if (count == 0) continue;
    s.numa_cover += p_.numa_target[n];
    s.broken_numa_cost += p_.numa_intact[n];
    if (p_.gpus.empty()) s.numa_balance -= count * count;
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

std::vector<int> Search(const Problem& p, const Options& options) {
  int want = p.size - static_cast<int>(p.must.size());
  if (want == 0) return p.must;
  if (want == static_cast<int>(p.candidates.size())) return PlaceholderPick(p);
  std::vector<std::vector<int>> classes = Classes(p);
  std::vector<int> placeholder = PlaceholderPick(p);
  if (CountAnswers(classes, want, options.exact_limit) <= options.exact_limit) {
    ExactSearch exact(p, classes, 2 * options.max_work);
    Scored best = exact.Run();
    if (exact.complete()) return best.set;
    // A few huge evaluations (dozens of HCAs against many GPUs) hit the bound: the best seen,
    // never worse than the placeholder.
    Scored floor{Scorer(p).Evaluate(placeholder), placeholder};
    return Better(floor, best) ? floor.set : best.set;
  }
  LocalSearch search(p, classes, options.max_work);
  Scored best = search.Improve(search.Greedy(placeholder));
  // The placeholder is a second start, and the floor: Improve scores its start even when the
  // budget is spent, and never returns worse than it.
  Scored floor = search.Improve(placeholder);
  return Better(floor, best) ? floor.set : best.set;
}

}  // namespace rdp::allocator
