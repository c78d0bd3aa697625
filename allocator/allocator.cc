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
#include "allocator/model.h"

namespace rdp::allocator {
namespace {

bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// Compares two digit runs by value; leading zeros do not count.
int CompareNumber(std::string_view a, std::string_view b) {
  auto strip = [](std::string_view s) {
    while (s.size() > 1 && s.front() == '0') s.remove_prefix(1);
    return s;
  };
  a = strip(a);
  b = strip(b);
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a.compare(b) < 0 ? -1 : (a == b ? 0 : 1);
}

std::string_view DigitRun(const std::string& s, size_t from) {
  size_t end = from;
  while (end < s.size() && IsDigit(s[end])) ++end;
  return std::string_view(s).substr(from, end - from);
}

// Rejects empty and repeated IDs, collecting them into `seen`.
absl::Status CheckIds(const std::vector<std::string>& ids, const char* what,
                      std::unordered_set<std::string_view>* seen) {
  for (const std::string& id : ids) {
    if (id.empty()) return absl::InvalidArgumentError(std::string("empty ID in ") + what);
    if (!seen->insert(id).second) {
      return absl::InvalidArgumentError(std::string("duplicate ID in ") + what + ": " + id);
    }
  }
  return absl::OkStatus();
}

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

bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (IsDigit(a[i]) && IsDigit(b[j])) {
      std::string_view x = DigitRun(a, i), y = DigitRun(b, j);
      if (int c = CompareNumber(x, y); c != 0) return c < 0;
      i += x.size();
      j += y.size();
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  if ((a.size() - i) != (b.size() - j)) return (a.size() - i) < (b.size() - j);
  // Equal as numbers ("x01" and "x1"): plain order keeps this a strict weak ordering.
  return a < b;
}

namespace {

// The checks of ValidateRequest that need no look at the IDs.
absl::Status CheckSizes(const Request& request) {
  if (request.size < 1) {
    return absl::InvalidArgumentError("size must be at least 1, got " +
                                      std::to_string(request.size));
  }
  if (static_cast<size_t>(request.size) > request.available.size()) {
    return absl::InvalidArgumentError("size " + std::to_string(request.size) + " exceeds the " +
                                      std::to_string(request.available.size()) +
                                      " available IDs");
  }
  if (request.must_include.size() > static_cast<size_t>(request.size)) {
    return absl::InvalidArgumentError("must_include has " +
                                      std::to_string(request.must_include.size()) +
                                      " IDs, more than size " + std::to_string(request.size));
  }
  return absl::OkStatus();
}

// Per-thread scratch, so that a shared answer allocates only its result.
struct IndexScratch {
  std::vector<std::uint32_t> available, must;
  std::vector<std::uint64_t> available_bits, must_bits;
};

bool Mark(std::vector<std::uint64_t>& bits, std::uint32_t i) {
  std::uint64_t& word = bits[i / 64];
  const std::uint64_t bit = std::uint64_t{1} << (i % 64);
  if (word & bit) return false;
  word |= bit;
  return true;
}

// Up to this many available IDs, ValidateRequest compares pairwise instead of hashing.
constexpr size_t kSmallRequest = 32;

// Equality of two IDs, compared from the end: device IDs share long prefixes ("0000:", a shared
// prefix) and differ near the end, and a short inline loop beats a call per pair.
bool SameId(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = a.size(); i-- > 0;) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

absl::Status CheckSmallIds(const Request& request) {
  auto check = [](const std::vector<std::string>& ids, const char* what) {
    for (size_t j = 0; j < ids.size(); ++j) {
      if (ids[j].empty()) return absl::InvalidArgumentError(std::string("empty ID in ") + what);
      for (size_t i = 0; i < j; ++i) {
        if (SameId(ids[i], ids[j])) {
          return absl::InvalidArgumentError(std::string("duplicate ID in ") + what + ": " +
                                            ids[j]);
        }
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check(request.available, "available"); !s.ok()) return s;
  if (absl::Status s = check(request.must_include, "must_include"); !s.ok()) return s;
  for (const std::string& id : request.must_include) {
    if (std::none_of(request.available.begin(), request.available.end(),
                     [&](const std::string& a) { return SameId(a, id); })) {
      return absl::InvalidArgumentError("must_include ID not available: " + id);
    }
  }
  return absl::OkStatus();
}

// PreferShared on indices, O(n + k) without hashing, for IDs all of SharedIndex's form with
// `prefix` and below `limit`: nullopt when one is not, or the request is invalid (then the
// string path answers, and names the problem). The sizes are checked already. `Ids`: a vector of
// strings (a Request's) or of views of the caller's strings (PreferSharedBelow).
template <typename Ids>
std::optional<std::vector<std::string>> PreferSharedByIndex(const Ids& available,
                                                            const Ids& must_include, size_t size,
                                                            std::string_view prefix,
                                                            std::uint32_t limit) {
  thread_local IndexScratch scratch;
  std::uint32_t top = 0;
  auto parse = [&](const Ids& ids, std::vector<std::uint32_t>& out) {
    out.clear();
    for (const auto& id : ids) {
      const std::optional<std::uint32_t> i = SharedIndex(id, prefix);
      if (!i || *i >= limit) return false;
      out.push_back(*i);
      top = std::max(top, *i);
    }
    return true;
  };
  if (!parse(available, scratch.available) || !parse(must_include, scratch.must)) {
    return std::nullopt;
  }
  const size_t words = top / 64 + 1;
  scratch.available_bits.assign(words, 0);
  scratch.must_bits.assign(words, 0);
  for (std::uint32_t i : scratch.available) {
    if (!Mark(scratch.available_bits, i)) return std::nullopt;  // a duplicate
  }
  for (std::uint32_t i : scratch.must) {
    if ((scratch.available_bits[i / 64] >> (i % 64) & 1) == 0) return std::nullopt;
    if (!Mark(scratch.must_bits, i)) return std::nullopt;
  }
  // Ascending indices: every must_include, and the lowest others until size.
  size_t others = size - scratch.must.size();
  std::vector<std::string> out;
  out.reserve(size);
  for (size_t w = 0; w < words && out.size() < size; ++w) {
    for (std::uint64_t bits = scratch.available_bits[w]; bits != 0 && out.size() < size;
         bits &= bits - 1) {
      const std::uint32_t i = static_cast<std::uint32_t>(w * 64 + __builtin_ctzll(bits));
      const bool must = scratch.must_bits[w] >> (i % 64) & 1;
      if (!must) {
        if (others == 0) continue;
        --others;
      }
      std::string id;
      id.reserve(prefix.size() + 7);
      id.append(prefix);
      id.append(std::to_string(i));
      out.push_back(std::move(id));
    }
  }
  return out;
}

// The prefix of `first` before its trailing digits: the one prefix a request of SharedIndex's
// form has.
std::string_view PrefixOf(const std::string& first) {
  size_t p = first.size();
  while (p > 0 && IsDigit(first[p - 1])) --p;
  return std::string_view(first.data(), p);
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
  if (absl::Status s = CheckSizes(request); !s.ok()) return s;
  // A node's few HCAs: pairwise comparison, no allocation; the same checks in the same order.
  if (request.available.size() <= kSmallRequest) return CheckSmallIds(request);
  // Hashing, not sorting: shared mode sends 1000 IDs with long common prefixes.
  std::unordered_set<std::string_view> available;
  available.reserve(request.available.size());
  if (absl::Status s = CheckIds(request.available, "available", &available); !s.ok()) return s;
  std::unordered_set<std::string_view> must;
  if (absl::Status s = CheckIds(request.must_include, "must_include", &must); !s.ok()) return s;
  for (const std::string& id : request.must_include) {
    if (available.count(id) == 0) {
      return absl::InvalidArgumentError("must_include ID not available: " + id);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> PreferShared(const Request& request) {
  if (absl::Status s = CheckSizes(request); !s.ok()) return s;
  if (std::optional<std::vector<std::string>> out = PreferSharedByIndex(
          request.available, request.must_include, static_cast<size_t>(request.size),
          PrefixOf(request.available.front()), kMaxSharedIndex)) {
    return *out;
  }
  return internal::PreferSharedByName(request);
}

std::optional<std::vector<std::string>> PreferSharedBelow(
    const std::vector<std::string_view>& available,
    const std::vector<std::string_view>& must_include, int size, std::uint32_t count) {
  if (size < 1 || static_cast<size_t>(size) > available.size() ||
      must_include.size() > static_cast<size_t>(size)) {
    return std::nullopt;
  }
  return PreferSharedByIndex(available, must_include, static_cast<size_t>(size), kSharedIdPrefix,
                             count);
}

namespace internal {

absl::StatusOr<std::vector<std::string>> PreferSharedByName(const Request& request) {
  if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
  std::vector<std::string> out = request.must_include;
  std::unordered_set<std::string_view> taken(out.begin(), out.end());
  // Pointers, not strings, through a linear-time selection: 1000 IDs per call.
  std::vector<const std::string*> rest;
  rest.reserve(request.available.size());
  for (const std::string& id : request.available) {
    if (taken.count(id) == 0) rest.push_back(&id);
  }
  auto less = [](const std::string* a, const std::string* b) { return NaturalLess(*a, *b); };
  size_t want = static_cast<size_t>(request.size) - out.size();
  if (want > 0 && want < rest.size()) {
    std::nth_element(rest.begin(), rest.begin() + (want - 1), rest.end(), less);
  }
  for (size_t i = 0; i < want; ++i) out.push_back(*rest[i]);
  std::sort(out.begin(), out.end(), NaturalLess);
  return out;
}

}  // namespace internal

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

std::optional<std::vector<std::string>> ExclusiveAllocator::PreferAdvertised(
    const std::vector<std::string_view>& available,
    const std::vector<std::string_view>& must_include, int size, const GpuContext& gpus) const {
  if (size < 1 || static_cast<size_t>(size) > available.size() ||
      must_include.size() > static_cast<size_t>(size)) {
    return std::nullopt;
  }
  thread_local Problem problem;
  thread_local std::vector<int> indices;
  thread_local std::vector<char> state;  // per HCA: 1 available, 2 must_include too
  const Model& m = *model_;
  state.assign(m.hca_count, 0);
  indices.clear();
  for (std::string_view id : available) {
    const int h = m.hca_by_pci.FindCanonical(id);
    if (h < 0 || state[h] != 0) return std::nullopt;  // not advertised as spelled; a duplicate
    state[h] = 1;
    indices.push_back(h);
  }
  problem.must.clear();
  for (std::string_view id : must_include) {
    const int h = m.hca_by_pci.FindCanonical(id);
    if (h < 0 || state[h] != 1) return std::nullopt;  // not available, or given twice
    state[h] = 2;
    problem.must.push_back(h);
  }
  std::sort(indices.begin(), indices.end());
  std::sort(problem.must.begin(), problem.must.end());
  FillProblem(*topology_, m, indices, size, gpus, &problem);
  return Names(*topology_, Search(problem, options_));
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
