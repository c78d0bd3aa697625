#include "resources/config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "resources/internal/document.h"

namespace rdp::resources {
namespace {

using internal::DocNode;

std::string Child(const std::string& path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string Item(const std::string& path, std::size_t i) { return absl::StrCat(path, "[", i, "]"); }

// Messages about one file: each names the file, the key path and the line where it is known.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  absl::Status Error(const std::string& path, const DocNode& at, absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat("config ", file_, ": ", Where(path, at), why));
  }
  std::string Warning(const std::string& path, const DocNode& at, absl::string_view why) const {
    return absl::StrCat("config ", file_, ": ", Where(path, at), why);
  }

 private:
  static std::string Where(const std::string& path, const DocNode& at) {
    std::string out = path;
    if (at.line > 0) absl::StrAppend(&out, out.empty() ? "" : " ", "(line ", at.line, ")");
    return out.empty() ? out : absl::StrCat(out, ": ");
  }

  std::string file_;
};

// A map's keys, checked: each at most once, each among `known` (else an error), or, with
// `warnings`, an unknown key is reported there and skipped. Keys are matched exactly, or with
// `any_case` ignoring case (as Go's encoding/json does). Returns the known keys' values by their
// canonical spelling.
absl::StatusOr<std::map<std::string, const DocNode*>> Fields(
    const Reader& r, const std::string& path, const DocNode& node,
    const std::vector<absl::string_view>& known, std::vector<std::string>* warnings = nullptr,
    bool any_case = false) {
  if (node.kind != DocNode::Kind::kMap) {
    return r.Error(path, node, "must be a mapping of keys to values");
  }
  std::map<std::string, const DocNode*> out;
  for (const auto& [key, value] : node.fields) {
    auto it = std::find_if(known.begin(), known.end(), [&, k = absl::string_view(key)](auto want) {
      return any_case ? absl::EqualsIgnoreCase(want, k) : want == k;
    });
    if (it == known.end()) {
      const std::string why = absl::StrCat("unknown key '", key, "' (known: ",
                                           absl::StrJoin(known, ", "), ")");
      if (warnings == nullptr) return r.Error(Child(path, key), value, why);
      warnings->push_back(r.Warning(Child(path, key), value, absl::StrCat(why, ": ignored")));
      continue;
    }
    if (!out.emplace(std::string(*it), &value).second) {
      return r.Error(Child(path, key), value, absl::StrCat("key '", *it, "' is given twice"));
    }
  }
  return out;
}

const DocNode* Find(const std::map<std::string, const DocNode*>& fields, const std::string& key) {
  auto it = fields.find(key);
  return it == fields.end() || it->second->kind == DocNode::Kind::kNull ? nullptr : it->second;
}

// The value of `key` in the mapping `node`, or the mapping itself (for a message's line).
const DocNode& FieldOr(const DocNode& node, absl::string_view key) {
  for (const auto& [k, v] : node.fields) {
    if (absl::EqualsIgnoreCase(k, key)) return v;
  }
  return node;
}

absl::StatusOr<std::string> String(const Reader& r, const std::string& path, const DocNode& node) {
  if (node.kind != DocNode::Kind::kScalar) return r.Error(path, node, "must be a string");
  return node.scalar;
}

absl::StatusOr<int> Int(const Reader& r, const std::string& path, const DocNode& node, int min,
                        int max) {
  int value = 0;
  if (node.kind != DocNode::Kind::kScalar) {
    return r.Error(path, node, absl::StrCat("must be an integer in ", min, "..", max));
  }
  if (!absl::SimpleAtoi(node.scalar, &value) || value < min || value > max) {
    return r.Error(path, node,
                   absl::StrCat("'", node.scalar, "' is not an integer in ", min, "..", max));
  }
  return value;
}

// A list of scalars; each checked (and canonicalised) by `check`, which returns why not or "".
template <typename T, typename Check>
absl::StatusOr<std::vector<T>> List(const Reader& r, const std::string& path, const DocNode* node,
                                    Check check) {
  std::vector<T> out;
  if (node == nullptr) return out;
  if (node->kind != DocNode::Kind::kList) {
    return r.Error(path, *node,
                   node->kind == DocNode::Kind::kScalar
                       ? absl::StrCat("must be a list; write [", node->scalar, "]")
                       : std::string("must be a list"));
  }
  for (std::size_t i = 0; i < node->items.size(); ++i) {
    const DocNode& item = node->items[i];
    if (item.kind != DocNode::Kind::kScalar || item.scalar.empty()) {
      return r.Error(Item(path, i), item, "must be a non-empty string");
    }
    T value{};
    if (std::string why = check(item.scalar, &value); !why.empty()) {
      return r.Error(Item(path, i), item, why);
    }
    out.push_back(std::move(value));
  }
  return out;
}

std::string AnyString(const std::string& s, std::string* out) {
  *out = s;
  return "";
}

// A PCI vendor or device ID: 4 hex digits without 0x, stored in lower case.
std::string HexId(const std::string& s, std::string* out) {
  if (absl::StartsWithIgnoreCase(s, "0x")) {
    return absl::StrCat("'", s, "': write the ID without 0x, e.g. '", s.substr(2), "'");
  }
  if (s.size() != 4 || !std::all_of(s.begin(), s.end(), absl::ascii_isxdigit)) {
    return absl::StrCat("'", s, "' is not 4 hex digits (e.g. 15b3)");
  }
  *out = absl::AsciiStrToLower(s);
  return "";
}

std::string LinkLayer(const std::string& s, std::string* out) {
  for (const char* known : {"InfiniBand", "Ethernet"}) {
    if (absl::EqualsIgnoreCase(s, known)) {
      *out = known;
      return "";
    }
  }
  return absl::StrCat("'", s, "' is not InfiniBand or Ethernet");
}

bool IsHex(absl::string_view s, std::size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), absl::ascii_isxdigit);
}

// "0000:1a:00.0", or "1a:00.0" for any domain.
std::string PciAddress(const std::string& s, std::string* out) {
  absl::string_view v = s;
  if (v.size() == 12 && v[4] == ':' && IsHex(v.substr(0, 4), 4)) v.remove_prefix(5);
  if (!(v.size() == 7 && IsHex(v.substr(0, 2), 2) && v[2] == ':' && IsHex(v.substr(3, 2), 2) &&
        v[5] == '.' && v[6] >= '0' && v[6] <= '7')) {
    return absl::StrCat("'", s, "' is not a PCI address (0000:1a:00.0 or 1a:00.0)");
  }
  *out = absl::AsciiStrToLower(s);
  return "";
}

std::string NumaNode(const std::string& s, int* out) {
  if (!absl::SimpleAtoi(s, out) || *out < 0) {
    return absl::StrCat("'", s, "' is not a NUMA node (an integer >= 0)");
  }
  return "";
}

absl::StatusOr<Selector> OurSelector(const Reader& r, const std::string& path,
                                     const DocNode& node) {
  auto f = Fields(r, path, node,
                  {"vendors", "deviceIDs", "drivers", "linkLayers", "hcaNames", "netdevs",
                   "pciAddresses", "numaNodes", "virtualFunctions"});
  if (!f.ok()) return f.status();
  Selector s;
  auto strings = [&](const char* key, auto check, std::vector<std::string>* out) -> absl::Status {
    auto v = List<std::string>(r, Child(path, key), Find(*f, key), check);
    if (!v.ok()) return v.status();
    *out = *std::move(v);
    return absl::OkStatus();
  };
  for (absl::Status st : {strings("vendors", HexId, &s.vendors),
                          strings("deviceIDs", HexId, &s.device_ids),
                          strings("drivers", AnyString, &s.drivers),
                          strings("linkLayers", LinkLayer, &s.link_layers),
                          strings("hcaNames", AnyString, &s.hca_names),
                          strings("netdevs", AnyString, &s.netdevs),
                          strings("pciAddresses", PciAddress, &s.pci_addresses)}) {
    if (!st.ok()) return st;
  }
  auto numa = List<int>(r, Child(path, "numaNodes"), Find(*f, "numaNodes"), NumaNode);
  if (!numa.ok()) return numa.status();
  s.numa_nodes = *std::move(numa);
  if (const DocNode* vf = Find(*f, "virtualFunctions")) {
    const std::string vf_path = Child(path, "virtualFunctions");
    auto v = String(r, vf_path, *vf);
    if (!v.ok()) return v.status();
    if (*v == "exclude") {
      s.virtual_functions = VirtualFunctions::kExclude;
    } else if (*v == "include") {
      s.virtual_functions = VirtualFunctions::kInclude;
    } else if (*v == "only") {
      s.virtual_functions = VirtualFunctions::kOnly;
    } else {
      return r.Error(vf_path, *vf, absl::StrCat("'", *v, "' is not exclude, include or only"));
    }
  }
  return s;
}

absl::StatusOr<Resource> OurResource(const Reader& r, const std::string& path,
                                     const DocNode& node) {
  auto f = Fields(r, path, node, {"name", "selector", "sharedDevices"});
  if (!f.ok()) return f.status();
  Resource res;
  const DocNode* name = Find(*f, "name");
  if (name == nullptr) return r.Error(path, node, "has no name (e.g. name: rdma/hca)");
  auto n = String(r, Child(path, "name"), *name);
  if (!n.ok()) return n.status();
  if (absl::Status st = ValidateResourceName(*n); !st.ok()) {
    return r.Error(Child(path, "name"), *name, st.message());
  }
  res.name = *n;
  if (const DocNode* sel = Find(*f, "selector")) {
    auto s = OurSelector(r, Child(path, "selector"), *sel);
    if (!s.ok()) return s.status();
    res.selector = *std::move(s);
  }
  if (const DocNode* shared = Find(*f, "sharedDevices")) {
    auto v = Int(r, Child(path, "sharedDevices"), *shared, 1, kMaxSharedDevices);
    if (!v.ok()) return v.status();
    res.shared_devices = *v;
  }
  return res;
}

// Each resource name once; `where` is each resource's key path and node, for the message.
absl::Status CheckUnique(const Reader& r, const std::vector<Resource>& resources,
                         const std::vector<std::pair<std::string, const DocNode*>>& where) {
  std::map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < resources.size(); ++i) {
    auto [it, fresh] = seen.emplace(resources[i].name, i);
    if (!fresh) {
      return r.Error(where[i].first, *where[i].second,
                     absl::StrCat("resource name '", resources[i].name, "' is also ",
                                  where[it->second].first, "'s"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> Ours(const Reader& r, const DocNode& root) {
  auto f = Fields(r, "", root, {"resources"});
  if (!f.ok()) return f.status();
  const DocNode* list = Find(*f, "resources");
  if (list == nullptr || (list->kind == DocNode::Kind::kList && list->items.empty())) {
    return r.Error("resources", list ? *list : root, "must list at least one resource");
  }
  if (list->kind != DocNode::Kind::kList) return r.Error("resources", *list, "must be a list");
  Config config;
  config.format = ConfigFormat::kResources;
  std::vector<std::pair<std::string, const DocNode*>> where;
  for (std::size_t i = 0; i < list->items.size(); ++i) {
    const DocNode& item = list->items[i];
    auto res = OurResource(r, Item("resources", i), item);
    if (!res.ok()) return res.status();
    config.resources.push_back(*std::move(res));
    where.emplace_back(Item("resources", i) + ".name", &FieldOr(item, "name"));
  }
  if (absl::Status st = CheckUnique(r, config.resources, where); !st.ok()) return st;
  return config;
}

bool IsMellanoxName(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '_';
  });
}

// One configList entry, with the Mellanox shared plugin's semantics: shared whatever the node's
// mode, VFs selected like any function, `devices` the older spelling of selectors.ifNames.
absl::StatusOr<Resource> MellanoxResource(const Reader& r, const std::string& path,
                                          const DocNode& node, std::vector<std::string>* warnings) {
  auto f = Fields(r, path, node,
                  {"resourceName", "resourcePrefix", "rdmaHcaMax", "devices", "selectors"},
                  warnings, /*any_case=*/true);
  if (!f.ok()) return f.status();
  Resource res;
  res.always_shared = true;
  res.selector.virtual_functions = VirtualFunctions::kInclude;
  const std::string name_path = Child(path, "resourceName");
  const DocNode* name = Find(*f, "resourceName");
  if (name == nullptr) return r.Error(path, node, "has no resourceName");
  auto n = String(r, name_path, *name);
  if (!n.ok()) return n.status();
  if (!IsMellanoxName(*n)) {
    return r.Error(name_path, *name,
                   absl::StrCat("'", *n, "' must match ^[a-zA-Z0-9_]+$ (the prefix is "
                                "resourcePrefix)"));
  }
  std::string prefix = "rdma";
  if (const DocNode* p = Find(*f, "resourcePrefix")) {
    auto v = String(r, Child(path, "resourcePrefix"), *p);
    if (!v.ok()) return v.status();
    if (!v->empty()) prefix = *v;
  }
  res.name = absl::StrCat(prefix, "/", *n);
  if (absl::Status st = ValidateResourceName(res.name); !st.ok()) {
    return r.Error(Child(path, "resourcePrefix"), FieldOr(node, "resourcePrefix"),
                   absl::StrCat("'", res.name, "' ", st.message()));
  }
  const DocNode* max = Find(*f, "rdmaHcaMax");
  if (max == nullptr) {
    return r.Error(Child(path, "rdmaHcaMax"), node,
                   absl::StrCat("is required: the units of ", res.name, ", 1..",
                                kMaxSharedDevices));
  }
  auto units = Int(r, Child(path, "rdmaHcaMax"), *max, 1, kMaxSharedDevices);
  if (!units.ok()) return units.status();
  res.shared_devices = *units;

  auto devices = List<std::string>(r, Child(path, "devices"), Find(*f, "devices"), AnyString);
  if (!devices.ok()) return devices.status();
  Selector& s = res.selector;
  if (const DocNode* sel = Find(*f, "selectors")) {
    const std::string sel_path = Child(path, "selectors");
    auto sf = Fields(r, sel_path, *sel, {"vendors", "deviceIDs", "drivers", "ifNames", "linkTypes"},
                     warnings, /*any_case=*/true);
    if (!sf.ok()) return sf.status();
    const std::pair<const char*, std::vector<std::string>*> keys[] = {
        {"vendors", &s.vendors},   {"deviceIDs", &s.device_ids}, {"drivers", &s.drivers},
        {"ifNames", &s.if_names},  {"linkTypes", &s.link_types}};
    for (const auto& [key, out] : keys) {
      auto v = List<std::string>(r, Child(sel_path, key), Find(*sf, key), AnyString);
      if (!v.ok()) return v.status();
      *out = *std::move(v);
    }
  }
  const bool empty_selector = s.vendors.empty() && s.device_ids.empty() && s.drivers.empty() &&
                              s.if_names.empty() && s.link_types.empty();
  if (empty_selector && devices->empty()) {
    return r.Error(path, node, "has neither selectors nor devices");
  }
  if (!empty_selector && !devices->empty()) {
    return r.Error(Child(path, "devices"), FieldOr(node, "devices"),
                   "cannot be given with selectors (write the names in selectors.ifNames)");
  }
  if (empty_selector) s.if_names = *std::move(devices);
  return res;
}

absl::StatusOr<Config> Mellanox(const Reader& r, const DocNode& root) {
  Config config;
  config.format = ConfigFormat::kMellanoxShared;
  auto f = Fields(r, "", root, {"periodicUpdateInterval", "configList"}, &config.warnings,
                  /*any_case=*/true);
  if (!f.ok()) return f.status();
  if (const DocNode* interval = Find(*f, "periodicUpdateInterval")) {
    auto seconds = Int(r, "periodicUpdateInterval", *interval, 0, 86400 * 365);
    if (!seconds.ok()) return seconds.status();
    config.update_interval = absl::Seconds(*seconds);
  }
  const DocNode* list = Find(*f, "configList");
  if (list == nullptr || list->kind != DocNode::Kind::kList || list->items.empty()) {
    return r.Error("configList", list ? *list : root, "must be a list of at least one resource");
  }
  std::vector<std::pair<std::string, const DocNode*>> where;
  for (std::size_t i = 0; i < list->items.size(); ++i) {
    const DocNode& item = list->items[i];
    auto res = MellanoxResource(r, Item("configList", i), item, &config.warnings);
    if (!res.ok()) return res.status();
    config.resources.push_back(*std::move(res));
    where.emplace_back(Item("configList", i) + ".resourceName", &FieldOr(item, "resourceName"));
  }
  if (absl::Status st = CheckUnique(r, config.resources, where); !st.ok()) return st;
  return config;
}

bool HasKey(const DocNode& node, absl::string_view key) {
  return node.kind == DocNode::Kind::kMap && &FieldOr(node, key) != &node;
}

}  // namespace

absl::Status ValidateResourceName(absl::string_view name) {
  const auto slash = name.find('/');
  if (slash == absl::string_view::npos || slash == 0 || slash + 1 == name.size() ||
      name.find('/', slash + 1) != absl::string_view::npos) {
    return absl::InvalidArgumentError("must be <domain>/<name>, e.g. rdma/hca");
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> LoadConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat("config ", path, ": cannot read: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(why) : absl::InvalidArgumentError(why);
  }
  std::ostringstream text;
  text << in.rdbuf();
  auto doc = internal::ParseDocument(text.str());
  if (!doc.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", doc.status().message()));
  }
  const Reader r(path);
  if (doc->kind != DocNode::Kind::kMap) {
    return r.Error("", *doc,
                   "must be a mapping with `resources:` (or the Mellanox plugin's `configList`)");
  }
  return HasKey(*doc, "configList") ? Mellanox(r, *doc) : Ours(r, *doc);
}

Config DefaultConfig(std::string resource_name) {
  Config config;
  Resource res;
  res.name = std::move(resource_name);
  config.resources.push_back(std::move(res));
  return config;
}

absl::Status CheckExclusiveOverlap(const std::vector<Resource>& resources,
                                   const std::vector<topology::Hca>& hcas) {
  std::vector<const Resource*> owner(hcas.size(), nullptr);
  for (const Resource& res : resources) {
    if (res.always_shared) continue;
    for (std::size_t i : Select(res.selector, hcas)) {
      if (owner[i] != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "HCA ", hcas[i].name, " (", hcas[i].place.pci, ") is selected by both resource ",
            owner[i]->name, " and resource ", res.name,
            ": in exclusive mode an HCA is sold by one resource; narrow one of the selectors"));
      }
      owner[i] = &res;
    }
  }
  return absl::OkStatus();
}

}  // namespace rdp::resources
