#include "allocator/allocator.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "allocator/model.h"

namespace rdp::allocator {
namespace {

bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// Leading decimal number of a sysfs rate ("400 Gb/sec (4X NDR)" -> 400), 0 when none.
double RateGbps(const std::string& rate) {
  double value = 0;
  size_t i = 0;
  while (i < rate.size() && IsDigit(rate[i])) value = value * 10 + (rate[i++] - '0');
  return value;
}

double HcaRate(const topology::Hca& hca) {
  double best = 0;
  for (const topology::Port& port : hca.ports) {
    if (port.Active()) best = std::max(best, RateGbps(port.rate));
  }
  return best;
}

// Dense ids for strings, in order of first appearance; "" stays unknown (-1).
class Interner {
 public:
  int Id(const std::string& key) {
    if (key.empty()) return -1;
    auto [it, inserted] = ids_.emplace(key, static_cast<int>(ids_.size()));
    return it->second;
  }
  int size() const { return static_cast<int>(ids_.size()); }

 private:
  std::map<std::string, int> ids_;
};

// The switches above a device, outermost first. A device on a root port with no switch above
// it counts the root port as its switch: what hangs off one root port is one PIX domain too,
// and without this an HCA there would look free to take (it would break no switch group).
std::vector<std::string> SwitchChain(const topology::PciPlacement& place) {
  std::vector<std::string> chain;
  for (const topology::Bridge& bridge : place.bridges) {
    if (!bridge.switch_id.empty() &&
        std::find(chain.begin(), chain.end(), bridge.switch_id) == chain.end()) {
      chain.push_back(bridge.switch_id);
    }
  }
  if (chain.empty() && place.bridges_known && !place.bridges.empty()) {
    chain.push_back("root-port:" + place.bridges.front().pci);
  }
  return chain;
}

std::vector<int> GroupSizes(const std::vector<int>& group_of, int groups) {
  std::vector<int> sizes(groups, 0);
  for (int g : group_of) {
    if (g >= 0) ++sizes[g];
  }
  return sizes;
}

// The snapshot's own spelling is looked up by its packed address; any other spelling
// ("1A:00.0", "0000:1A:00.0") goes through the snapshot's normalising lookup.
int Lookup(const PciIndex& exact, const std::string& id,
           int (topology::Topology::*slow)(std::string_view) const,
           const topology::Topology& topology) {
  const int index = exact.Find(id);
  return index >= 0 ? index : (topology.*slow)(id);
}

// The request's IDs as HCA indices, ascending, into `out`.
absl::Status HcaIndices(const topology::Topology& topology, const Model& model,
                        const std::vector<std::string>& ids, std::vector<int>* out) {
  out->clear();
  for (const std::string& id : ids) {
    int index = Lookup(model.hca_by_pci, id, &topology::Topology::HcaIndex, topology);
    if (index < 0) return absl::InvalidArgumentError("unknown device ID: " + id);
    out->push_back(index);
  }
  std::sort(out->begin(), out->end());
  // Two spellings of one address ("0000:1A:00.0" and "0000:1a:00.0") are one device.
  if (std::adjacent_find(out->begin(), out->end()) != out->end()) {
    return absl::InvalidArgumentError("one device named twice in the request");
  }
  return absl::OkStatus();
}

// The GPUs of the snapshot among `ids`, as indices, ascending and distinct, into `out`.
void GpuIndices(const topology::Topology& topology, const Model& model,
                const std::vector<std::string>& ids, std::vector<int>* out) {
  out->clear();
  for (const std::string& id : ids) {
    int index = Lookup(model.gpu_by_pci, id, &topology::Topology::GpuIndex, topology);
    if (index >= 0) out->push_back(index);
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

std::vector<std::string> Names(const topology::Topology& topology, const std::vector<int>& set) {
  std::vector<std::string> out;
  out.reserve(set.size());
  for (int h : set) out.push_back(topology.hcas()[h].place.pci);
  return out;
}

auto Key(const Score& s) {
  return std::make_tuple(s.gpu_match, s.gpu_spread_match, s.numa_cover, s.numa_balance,
                         s.switch_cover, s.gpu_coverage, s.free_gpu_affinity, -s.broken_numa_cost,
                         -s.broken_root_cost, -s.broken_switch_cost, -s.touched_switch_cost,
                         -s.touched_root_cost, -s.degraded_cost);
}

}  // namespace

bool operator<(const Score& a, const Score& b) { return Key(a) < Key(b); }
bool operator==(const Score& a, const Score& b) { return Key(a) == Key(b); }

namespace {

// The checks of ValidateRequest that need no look at the IDs.
absl::Status CheckSizes(std::size_t available, std::size_t must_include, int size) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("size must be at least 1, got ", size));
  if (static_cast<std::size_t>(size) > available) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", size, " exceeds the ", available, " available IDs"));
  }
  if (must_include > static_cast<std::size_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("must_include has ", must_include, " IDs, more than size ", size));
  }
  return absl::OkStatus();
}

absl::Status EmptyId(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("empty ID in ", what));
}
absl::Status DuplicateId(const char* what, std::string_view id) {
  return absl::InvalidArgumentError(absl::StrCat("duplicate ID in ", what, ": ", std::string(id)));
}
absl::Status MustNotAvailable(std::string_view id) {
  return absl::InvalidArgumentError(
      absl::StrCat("must_include ID not available: ", std::string(id)));
}

// Up to this many available IDs, the IDs are compared pairwise instead of hashed.
constexpr std::size_t kSmallRequest = 32;

// Equality of two IDs, compared from the end: device IDs share long prefixes ("0000:") and
// differ near the end.
bool SameId(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = a.size(); i-- > 0;) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// ValidateRequest's checks of the IDs, in its order (the first empty or repeated ID of
// `available`, then of `must_include`, then the first must_include ID not available), on strings
// or views.
template <typename Ids>
absl::Status CheckIds(const Ids& available, const Ids& must_include) {
  const bool small = available.size() <= kSmallRequest;
  auto distinct = [small](const Ids& ids, const char* what,
                          std::unordered_set<std::string_view>& seen) {
    for (std::size_t j = 0; j < ids.size(); ++j) {
      const std::string_view id = ids[j];
      if (id.empty()) return EmptyId(what);
      const bool repeated =
          small ? std::any_of(ids.begin(), ids.begin() + j,
                              [id](std::string_view other) { return SameId(other, id); })
                : !seen.insert(id).second;
      if (repeated) return DuplicateId(what, id);
    }
    return absl::OkStatus();
  };
  std::unordered_set<std::string_view> available_set, must_set;
  if (!small) available_set.reserve(available.size());
  if (absl::Status s = distinct(available, "available", available_set); !s.ok()) return s;
  if (absl::Status s = distinct(must_include, "must_include", must_set); !s.ok()) return s;
  for (const std::string_view id : must_include) {
    const bool there =
        small ? std::any_of(available.begin(), available.end(),
                            [id](std::string_view other) { return SameId(other, id); })
              : available_set.count(id) > 0;
    if (!there) return MustNotAvailable(id);
  }
  return absl::OkStatus();
}

// Marks bit `i`; false when it was set already.
bool Mark(std::vector<std::uint64_t>& bits, std::uint32_t i) {
  std::uint64_t& word = bits[i / 64];
  const std::uint64_t bit = std::uint64_t{1} << (i % 64);
  if (word & bit) return false;
  word |= bit;
  return true;
}

bool Marked(const std::vector<std::uint64_t>& bits, std::uint32_t i) {
  return (bits[i / 64] >> (i % 64) & 1) != 0;
}

// Whether `id` is one of `ids`.
bool Among(const std::vector<std::string_view>& ids, std::string_view id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

std::string SharedId(std::uint32_t index) {
  return std::string(kSharedIdPrefix) + std::to_string(index);
}

std::optional<std::uint32_t> SharedIndex(std::string_view id, std::string_view prefix) {
  // By hand, without allocating: a shared GetPreferredAllocation checks 1000 of these. Seven
  // digits hold every index below kMaxSharedIndex.
  if (id.size() <= prefix.size() || id.size() > prefix.size() + 7) return std::nullopt;
  if (id.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string_view digits = id.substr(prefix.size());
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  std::uint32_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (value >= kMaxSharedIndex) return std::nullopt;
  return value;
}

absl::Status ValidateRequest(const Request& request) {
  if (absl::Status s = CheckSizes(request.available.size(), request.must_include.size(),
                                  request.size);
      !s.ok()) {
    return s;
  }
  return CheckIds(request.available, request.must_include);
}

absl::StatusOr<std::vector<std::string>> AnswerShared(
    const std::vector<std::string_view>& available,
    const std::vector<std::string_view>& must_include, int size, std::uint32_t count) {
  if (absl::Status s = CheckSizes(available.size(), must_include.size(), size); !s.ok()) return s;
  // ValidateRequest's checks in its order, offered IDs on a bitmap of their indices (the
  // kubelet's usual request: no hashing), the others by name.
  const std::uint32_t limit = std::min(count, kMaxSharedIndex);
  constexpr std::uint32_t kNotOffered = UINT32_MAX;
  auto index_of = [limit](std::string_view id) {
    const std::optional<std::uint32_t> i = SharedIndex(id);
    return i && *i < limit ? *i : kNotOffered;
  };
  thread_local std::vector<std::uint64_t> available_bits, must_bits;
  available_bits.assign(limit / 64 + 1, 0);
  must_bits.assign(limit / 64 + 1, 0);
  std::vector<std::string_view> unknown;  // available, not offered, in the request's order
  std::unordered_set<std::string_view> unknown_set, unknown_must;
  for (const std::string_view id : available) {
    if (id.empty()) return EmptyId("available");
    if (const std::uint32_t i = index_of(id); i != kNotOffered) {
      if (!Mark(available_bits, i)) return DuplicateId("available", id);
    } else {
      if (!unknown_set.insert(id).second) return DuplicateId("available", id);
      unknown.push_back(id);
    }
  }
  for (const std::string_view id : must_include) {
    if (id.empty()) return EmptyId("must_include");
    const std::uint32_t i = index_of(id);
    if (i != kNotOffered ? !Mark(must_bits, i) : !unknown_must.insert(id).second) {
      return DuplicateId("must_include", id);
    }
  }
  std::vector<std::string> out;
  out.reserve(static_cast<std::size_t>(size));
  std::size_t known_must = 0;
  for (const std::string_view id : must_include) {
    const std::uint32_t i = index_of(id);
    if (i != kNotOffered ? !Marked(available_bits, i) : unknown_set.count(id) == 0) {
      return MustNotAvailable(id);
    }
    if (i != kNotOffered) {
      ++known_must;
    } else {
      out.emplace_back(id);  // kept as given
    }
  }
  // must_include and the lowest other offered indices, ascending (natural order).
  const std::size_t known =
      std::min(static_cast<std::size_t>(size) - out.size(), available.size() - unknown.size());
  std::size_t others = known - known_must;
  for (std::size_t w = 0, taken = 0; w < available_bits.size() && taken < known; ++w) {
    for (std::uint64_t bits = available_bits[w]; bits != 0 && taken < known; bits &= bits - 1) {
      const auto i = static_cast<std::uint32_t>(w * 64 + __builtin_ctzll(bits));
      if (!Marked(must_bits, i)) {
        if (others == 0) continue;
        --others;
      }
      out.push_back(SharedId(i));
      ++taken;
    }
  }
  // Too few offered: completed from the others, in the request's order.
  for (std::size_t u = 0; out.size() < static_cast<std::size_t>(size) && u < unknown.size(); ++u) {
    if (unknown_must.count(unknown[u]) == 0) out.emplace_back(unknown[u]);
  }
  return out;
}

namespace {

// An address as topology::NormalizePci spells it ("dddd:bb:dd.f", lower-case hex), its nine hex
// digits packed; -1 for any other spelling.
std::int64_t PackPci(std::string_view id) {
  if (!topology::IsCanonicalPci(id)) return -1;
  std::int64_t key = 0;
  for (char c : id) {
    if (c == ':' || c == '.') continue;
    key = key * 16 + (c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return key;
}

}  // namespace

void PciIndex::Add(const std::string& pci, int index) {
  const std::int64_t key = PackPci(pci);
  if (key < 0) {
    others_.emplace(pci, index);
    return;
  }
  auto at = std::lower_bound(packed_.begin(), packed_.end(), std::make_pair(key, index));
  packed_.insert(at, {key, index});
}

int PciIndex::Find(const std::string& id) const {
  if (PackPci(id) < 0) {
    auto it = others_.find(id);
    return it == others_.end() ? -1 : it->second;
  }
  return FindCanonical(id);
}

int PciIndex::FindCanonical(std::string_view id) const {
  const std::int64_t key = PackPci(id);
  if (key < 0) return -1;
  auto at = std::lower_bound(packed_.begin(), packed_.end(), std::make_pair(key, -1));
  return at != packed_.end() && at->first == key ? at->second : -1;
}

Model::Model(const topology::Topology& topology)
    : hca_count(static_cast<int>(topology.hcas().size())),
      gpu_count(static_cast<int>(topology.gpus().size())),
      weight(hca_count, gpu_count) {
  for (int h = 0; h < hca_count; ++h) hca_by_pci.Add(topology.hcas()[h].place.pci, h);
  for (int g = 0; g < gpu_count; ++g) gpu_by_pci.Add(topology.gpus()[g].place.pci, g);
  for (int h = 0; h < hca_count; ++h) {
    for (int g = 0; g < gpu_count; ++g) {
      weight(h, g) = kPathWeight[static_cast<int>(topology.Path(h, g))];
    }
  }
  Interner numa, roots, switches;
  auto numa_id = [&](const std::optional<int>& n) {
    return n ? numa.Id(std::to_string(*n)) : -1;
  };
  double fastest = 0;
  for (const topology::Hca& hca : topology.hcas()) fastest = std::max(fastest, HcaRate(hca));
  std::map<std::tuple<int, int, std::vector<int>, int, std::vector<int>>, int> classes;
  for (int h = 0; h < hca_count; ++h) {
    const topology::Hca& hca = topology.hcas()[h];
    hca_numa.push_back(numa_id(hca.place.numa));
    hca_root.push_back(roots.Id(hca.place.pcie_root));
    std::vector<int> chain;
    for (const std::string& id : SwitchChain(hca.place)) chain.push_back(switches.Id(id));
    hca_switches.push_back(chain);
    size_t active = std::count_if(hca.ports.begin(), hca.ports.end(),
                                  [](const topology::Port& p) { return p.Active(); });
    int degraded = 0;
    if (!hca.ports.empty() && active == 0) {
      degraded = 3;
    } else if (active < hca.ports.size()) {
      degraded = 2;
    } else if (HcaRate(hca) > 0 && HcaRate(hca) < fastest) {
      degraded = 1;
    }
    hca_degraded.push_back(degraded);
    std::vector<int> row(weight.row(h).data(), weight.row(h).data() + gpu_count);
    auto key = std::make_tuple(hca_numa[h], hca_root[h], chain, degraded, row);
    hca_class.push_back(classes.emplace(key, static_cast<int>(classes.size())).first->second);
  }
  for (const topology::Gpu& gpu : topology.gpus()) {
    gpu_numa.push_back(numa_id(gpu.place.numa));
    // A switch with no HCA under it gets an id too; no answer can cover it, so it shifts every
    // answer's switch_cover equally.
    std::vector<std::string> chain = SwitchChain(gpu.place);
    int s = chain.empty() ? -1 : switches.Id(chain.back());
    gpu_switch.push_back(s);
  }
  numa_size = GroupSizes(hca_numa, numa.size());
  root_size = GroupSizes(hca_root, roots.size());
  switch_size.assign(switches.size(), 0);
  for (const std::vector<int>& chain : hca_switches) {
    for (int s : chain) ++switch_size[s];
  }
}

absl::Status MakeProblem(const topology::Topology& topology, const Model& model,
                         const Request& request, Problem* out) {
  if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
  // A per-thread buffer for what does not outlive the call.
  thread_local std::vector<int> available;
  if (absl::Status s = HcaIndices(topology, model, request.available, &available); !s.ok()) {
    return s;
  }
  if (absl::Status s = HcaIndices(topology, model, request.must_include, &out->must); !s.ok()) {
    return s;
  }
  FillProblem(topology, model, available, request.size, request.gpus, out);
  return absl::OkStatus();
}

void FillProblem(const topology::Topology& topology, const Model& model,
                 const std::vector<int>& available, int size, const GpuContext& gpus_known,
                 Problem* out) {
  thread_local std::vector<int> free_gpus, others, numa_avail, root_avail, switch_avail;
  Problem& p = *out;
  p.model = &model;
  p.size = size;
  p.candidates.clear();
  std::set_difference(available.begin(), available.end(), p.must.begin(), p.must.end(),
                      std::back_inserter(p.candidates));
  GpuIndices(topology, model, gpus_known.container_gpus, &p.gpus);
  p.gpu_capacity = 1;
  if (!p.gpus.empty()) {
    p.gpu_capacity = (p.size + static_cast<int>(p.gpus.size()) - 1) /
                     static_cast<int>(p.gpus.size());
  }

  const int gpus = static_cast<int>(p.gpus.size());
  p.gpu_weight.resize(model.hca_count, gpus);
  p.gpu_best.assign(model.hca_count, 0);
  p.gpu_best_columns.assign(model.hca_count, 0);
  for (int h = 0; h < model.hca_count; ++h) {
    for (int g = 0; g < gpus; ++g) {
      p.gpu_weight(h, g) = model.weight(h, p.gpus[g]);
      p.gpu_best[h] = std::max(p.gpu_best[h], p.gpu_weight(h, g));
    }
    for (int g = 0; g < gpus && g < 64; ++g) {
      if (p.gpu_weight(h, g) == p.gpu_best[h]) p.gpu_best_columns[h] |= std::uint64_t{1} << g;
    }
  }

  if (gpus_known.free_gpus_known) {
    GpuIndices(topology, model, gpus_known.free_gpus, &free_gpus);
  } else {
    free_gpus.resize(model.gpu_count);
    for (int g = 0; g < model.gpu_count; ++g) free_gpus[g] = g;
  }
  // Without container GPUs the pod will get free GPUs: be near them. With them, HCAs near the
  // other free GPUs are better left for the pods that will get those GPUs.
  others.clear();
  std::set_difference(free_gpus.begin(), free_gpus.end(), p.gpus.begin(), p.gpus.end(),
                      std::back_inserter(others));
  int sign = p.gpus.empty() ? 1 : -1;
  p.free_affinity.assign(model.hca_count, 0);
  if (!others.empty()) {
    for (int h = 0; h < model.hca_count; ++h) {
      int best = 0;
      for (int g : others) best = std::max(best, model.weight(h, g));
      p.free_affinity[h] = sign * best;
    }
  }

  p.numa_target.assign(model.numa_size.size(), 0);
  p.switch_targets.clear();
  if (!p.gpus.empty()) {
    for (int g : p.gpus) {
      if (model.gpu_numa[g] >= 0) p.numa_target[model.gpu_numa[g]] = 1;
      if (model.gpu_switch[g] >= 0) p.switch_targets.push_back(model.gpu_switch[g]);
    }
    std::sort(p.switch_targets.begin(), p.switch_targets.end());
    p.switch_targets.erase(std::unique(p.switch_targets.begin(), p.switch_targets.end()),
                           p.switch_targets.end());
  } else {
    for (int h : available) {
      if (model.hca_numa[h] >= 0) p.numa_target[model.hca_numa[h]] = 1;
    }
  }

  numa_avail.assign(model.numa_size.size(), 0);
  root_avail.assign(model.root_size.size(), 0);
  switch_avail.assign(model.switch_size.size(), 0);
  for (int h : available) {
    if (model.hca_numa[h] >= 0) ++numa_avail[model.hca_numa[h]];
    if (model.hca_root[h] >= 0) ++root_avail[model.hca_root[h]];
    for (int s : model.hca_switches[h]) ++switch_avail[s];
  }
  auto intact = [](const std::vector<int>& avail, const std::vector<int>& size,
                   std::vector<char>* out) {
    out->resize(size.size());
    for (size_t i = 0; i < size.size(); ++i) (*out)[i] = avail[i] == size[i];
  };
  intact(numa_avail, model.numa_size, &p.numa_intact);
  intact(root_avail, model.root_size, &p.root_intact);
  intact(switch_avail, model.switch_size, &p.switch_intact);
}

absl::StatusOr<Problem> MakeProblem(const topology::Topology& topology, const Model& model,
                                    const Request& request) {
  Problem p;
  if (absl::Status s = MakeProblem(topology, model, request, &p); !s.ok()) return s;
  return p;
}

ExclusiveAllocator::ExclusiveAllocator(topology::TopologyPtr topology, Options options)
    : topology_(std::move(topology)),
      options_(options),
      model_(std::make_shared<const Model>(*topology_)) {}

absl::StatusOr<std::vector<std::string>> ExclusiveAllocator::Prefer(
    const Request& request) const {
  // The thread's problem of its last request: refilled, so a request allocates only its answer.
  thread_local Problem problem;
  if (absl::Status s = MakeProblem(*topology_, *model_, request, &problem); !s.ok()) return s;
  return Names(*topology_, Search(problem, options_));
}

absl::StatusOr<std::vector<std::string>> ExclusiveAllocator::Answer(
    const std::vector<std::string_view>& available,
    const std::vector<std::string_view>& must_include, int size, const GpuContext& gpus,
    const std::vector<bool>& degraded) const {
  if (absl::Status s = CheckSizes(available.size(), must_include.size(), size); !s.ok()) return s;
  if (absl::Status s = CheckIds(available, must_include); !s.ok()) return s;
  const Model& m = *model_;
  // Each ID resolved once: the snapshot's own spelling by its packed address, any other
  // through the snapshot's normalising lookup; -1 for an ID that is no HCA of it.
  auto resolve = [&](std::string_view id) {
    const int h = m.hca_by_pci.FindCanonical(id);
    return h >= 0 ? h : topology_->HcaIndex(id);
  };
  std::vector<std::size_t> at(m.hca_count, 0);  // per HCA: its position in `available` + 1
  std::vector<char> must(m.hca_count, 0);
  std::vector<std::string_view> unknown;  // available, not offered, in the request's order
  for (std::size_t i = 0; i < available.size(); ++i) {
    const int h = resolve(available[i]);
    if (h < 0) {
      unknown.push_back(available[i]);
      continue;
    }
    if (at[h] != 0) return absl::InvalidArgumentError("one device named twice in the request");
    at[h] = i + 1;
  }
  std::vector<std::string> out;
  out.reserve(static_cast<std::size_t>(size));
  for (const std::string_view id : must_include) {
    const int h = resolve(id);
    if (h < 0) {
      out.emplace_back(id);  // kept as given
    } else {
      must[h] = 1;
    }
  }
  std::vector<int> offered, known_must, first;  // ascending indices
  for (int h = 0; h < m.hca_count; ++h) {
    if (at[h] == 0) continue;
    offered.push_back(h);
    if (must[h]) known_must.push_back(h);
    const bool is_degraded = static_cast<std::size_t>(h) < degraded.size() && degraded[h];
    if (must[h] || !is_degraded) first.push_back(h);
  }
  const int known =
      std::min(size - static_cast<int>(out.size()), static_cast<int>(offered.size()));
  if (known > 0) {
    // Chosen among the HCAs not degraded first; only when those are too few does the answer
    // take degraded ones, the allocator completing a choice that holds all the others.
    thread_local Problem problem;
    const bool enough = static_cast<int>(first.size()) >= known;
    problem.must = enough ? known_must : first;
    FillProblem(*topology_, m, enough ? first : offered, known, gpus, &problem);
    for (const int h : Search(problem, options_)) out.emplace_back(available[at[h] - 1]);
  }
  // Too few offered: completed from the others, in the request's order.
  for (std::size_t u = 0; out.size() < static_cast<std::size_t>(size) && u < unknown.size(); ++u) {
    if (!Among(must_include, unknown[u])) out.emplace_back(unknown[u]);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ExclusiveAllocator::PreferPlaceholder(
    const Request& request) const {
  absl::StatusOr<Problem> problem = MakeProblem(*topology_, *model_, request);
  if (!problem.ok()) return problem.status();
  return Names(*topology_, PlaceholderPick(*problem));
}

absl::StatusOr<Score> ExclusiveAllocator::Evaluate(const Request& request,
                                                   const std::vector<std::string>& answer) const {
  absl::StatusOr<Problem> problem = MakeProblem(*topology_, *model_, request);
  if (!problem.ok()) return problem.status();
  absl::StatusOr<std::vector<int>> set = std::vector<int>();
  if (absl::Status s = HcaIndices(*topology_, *model_, answer, &*set); !s.ok()) return s;
  if (static_cast<int>(set->size()) != request.size) {
    return absl::InvalidArgumentError("answer has " + std::to_string(set->size()) +
                                      " IDs, not " + std::to_string(request.size));
  }
  std::vector<int> allowed = problem->must;
  allowed.insert(allowed.end(), problem->candidates.begin(), problem->candidates.end());
  std::sort(allowed.begin(), allowed.end());
  if (!std::includes(allowed.begin(), allowed.end(), set->begin(), set->end()) ||
      !std::includes(set->begin(), set->end(), problem->must.begin(), problem->must.end())) {
    return absl::InvalidArgumentError("answer is not within available or misses must_include");
  }
  return Scorer(*problem).Evaluate(*set);
}

}  // namespace rdp::allocator
