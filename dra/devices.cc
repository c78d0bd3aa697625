#include "dra/devices.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dra/kernel_pci.h"
#include "dra/taints.h"
#include "hca/hca.h"

namespace rdp::dra {
namespace {

constexpr char kStandardPrefix[] = "resource.kubernetes.io/";
constexpr std::size_t kMaxStringValue = 64;  // resource.DeviceAttributeMaxValueLength
constexpr char kDevicePrefix[] = "hca-";

// Whether `s` can be a JSON string, i.e. is well-formed UTF-8: nlohmann's own check, so that
// what passes here never makes a later dump() throw.
bool IsUtf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

void PutString(nlohmann::json& attrs, const std::string& name, const std::string& value) {
  if (!value.empty() && value.size() <= kMaxStringValue && IsUtf8(value)) {
    attrs[name] = {{"string", value}};
  }
}

// "400 Gb/sec (4X NDR)" -> 400, "2.5 Gb/sec (1X SDR)" -> 2; nullopt when there is no number.
std::optional<std::int64_t> RateGbps(const std::string& rate) {
  std::size_t end = 0;
  while (end < rate.size() && rate[end] >= '0' && rate[end] <= '9') ++end;
  std::int64_t gbps = 0;
  if (end == 0 || !absl::SimpleAtoi(rate.substr(0, end), &gbps)) return std::nullopt;
  return gbps;
}

// A non-negative integer as the API server writes a decimal Quantity back (1000 -> "1k",
// 1500 -> "1500"), so that a slice it stored equals the one the driver builds and a restarted
// driver writes nothing.
std::string CanonicalQuantity(std::int64_t value) {
  static constexpr const char* kSuffixes[] = {"", "k", "M", "G", "T", "P", "E"};
  std::size_t suffix = 0;
  while (value != 0 && value % 1000 == 0 && suffix + 1 < std::size(kSuffixes)) {
    value /= 1000;
    ++suffix;
  }
  return absl::StrCat(value, kSuffixes[suffix]);
}

// A resource.k8s.io/v1 DeviceCapacity of `value` whose request policy takes `def` for a claim
// that asks nothing and rounds a request up to a whole unit from `min`.
nlohmann::json ConsumableCapacity(std::int64_t value, std::int64_t def, std::int64_t min) {
  nlohmann::json range = {{"min", CanonicalQuantity(min)}};
  if (min + 1 <= value) range["step"] = "1";  // the API refuses a step beyond the value
  return {{"value", CanonicalQuantity(value)},
          {"requestPolicy",
           {{"default", CanonicalQuantity(def)}, {"validRange", std::move(range)}}}};
}

nlohmann::json SharedCapacity(const topology::Hca& hca, const DeviceOptions& opts) {
  nlohmann::json capacity = {
      {kPodsCapacity, ConsumableCapacity(std::max<std::int64_t>(1, opts.shared_units), 1, 1)}};
  const std::optional<std::int64_t> gbps =
      hca.ports.empty() ? std::nullopt : RateGbps(hca.ports.front().rate);
  if (gbps && *gbps > 0) capacity[kBandwidthCapacity] = ConsumableCapacity(*gbps, 0, 0);
  return capacity;
}

// The outermost switch above a device: the switch_id of the first bridge, from the root port
// down, that belongs to a switch. Under one level of switches it is PciPlacement::Switch().
std::string TopSwitch(const topology::PciPlacement& place) {
  for (const topology::Bridge& b : place.bridges) {
    if (!b.switch_id.empty()) return b.switch_id;
  }
  return "";
}

nlohmann::json Attributes(const topology::Hca& hca, const DeviceOptions& opts) {
  nlohmann::json attrs = nlohmann::json::object();
  const std::string std_prefix = kStandardPrefix;
  if (IsStandardBdf(hca.place.pci)) {
    std::string root = hca.place.pcie_root;
    std::optional<int> numa = hca.place.numa;
    if (auto it = opts.kernel.find(hca.place.pci); it != opts.kernel.end()) {
      root = it->second.pcie_root;
      numa = it->second.numa;
    }
    PutString(attrs, std_prefix + "pcieRoot", root);
    PutString(attrs, std_prefix + "pciBusID", hca.place.pci);
    if (numa && *numa >= 0) attrs[std_prefix + "numaNode"] = {{"int", *numa}};
  }
  const std::string own = opts.driver_name + "/";
  PutString(attrs, own + "hcaName", hca.name);
  PutString(attrs, own + "pcieSwitch", hca.place.Switch());
  PutString(attrs, own + "pcieTopSwitch", TopSwitch(hca.place));
  if (!hca.ports.empty()) {
    PutString(attrs, own + "linkLayer", hca.ports.front().link_layer);
    if (auto gbps = RateGbps(hca.ports.front().rate)) attrs[own + "rateGbps"] = {{"int", *gbps}};
  }
  PutString(attrs, own + "uverbs", hca.uverbs);
  attrs[own + "allPortsActive"] = {{"bool", hca.AllPortsActive()}};
  attrs[own + "mode"] = {{"string", std::string(hca::ModeName(opts.mode))}};
  if (opts.gpudirect_rdma) attrs[own + "gpuDirectRDMA"] = {{"bool", *opts.gpudirect_rdma}};
  // The identity a DeviceClass tells NICs apart by; PutString leaves out a value that is not
  // known (""), as for every string attribute.
  PutString(attrs, own + "pciVendorID", hca.vendor);
  PutString(attrs, own + "pciDeviceID", hca.device);
  PutString(attrs, own + "driver", hca.driver);
  PutString(attrs, own + "netdevs", absl::StrJoin(hca.netdevs, ","));
  PutString(attrs, own + "firmwareVersion", hca.firmware_version);
  PutString(attrs, own + "nodeGUID", hca.node_guid);
  attrs[own + "virtualFunction"] = {{"bool", hca.IsVirtualFunction()}};
  PutString(attrs, own + "physicalFunction", hca.physfn);
  return attrs;
}

// RFC 1123 subdomain: dot-separated labels of [a-z0-9-], each starting and ending with [a-z0-9].
absl::Status ValidateSubdomain(const std::string& name, std::size_t max) {
  if (name.empty()) return absl::InvalidArgumentError("must not be empty");
  if (name.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is longer than ", max, " characters"));
  }
  for (absl::string_view label : absl::StrSplit(name, '.')) {
    const bool ok = !label.empty() && absl::ascii_isalnum(label.front()) &&
                    absl::ascii_isalnum(label.back()) &&
                    std::all_of(label.begin(), label.end(), [](char c) {
                      return (c >= 'a' && c <= 'z') || absl::ascii_isdigit(c) || c == '-';
                    });
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", name, "' is not a lower-case DNS subdomain (labels of a-z, 0-9 and '-', separated "
          "by '.', each starting and ending with a letter or digit)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDriverName(std::string_view name) {
  return ValidateSubdomain(std::string(name), 63);
}
absl::Status ValidateNodeName(std::string_view name) {
  return ValidateSubdomain(std::string(name), 253);
}

std::string DeviceName(const topology::Hca& hca) { return DeviceNameOfPci(hca.place.pci); }

std::string DeviceNameOfPci(absl::string_view pci) {
  std::string name = absl::StrCat(kDevicePrefix, pci);
  for (char& c : name) {
    if (c == ':' || c == '.') c = '-';
  }
  return name;
}

int FindHca(const topology::Topology& topo, std::string_view device_name) {
  const auto& hcas = topo.hcas();
  for (std::size_t i = 0; i < hcas.size(); ++i) {
    if (DeviceName(hcas[i]) == device_name) return static_cast<int>(i);
  }
  return -1;
}

std::string UnhealthyTaintKey(std::string_view driver_name) {
  return std::string(driver_name) + "/unhealthy";
}

std::string DegradedTaintKey(std::string_view driver_name) {
  return std::string(driver_name) + "/degraded";
}

std::vector<nlohmann::json> BuildDevices(const node::View& node, const DeviceOptions& opts) {
  std::vector<nlohmann::json> devices;
  devices.reserve(node.topology->hcas().size());
  for (const topology::Hca& hca : node.topology->hcas()) {
    const std::optional<TaintedState> state = TaintedStateOf(node, hca);
    std::optional<DeviceTaint> taint;
    if (state) taint = TaintOf(*state, opts.driver_name);
    if (!opts.taints && !node.Verdict(hca).usable) continue;
    // A taint that only informs is left out where the control plane cannot hold it.
    if (taint && (!opts.taints || (taint->effect == kEffectNone && !opts.taint_effect_none))) {
      taint.reset();
    }
    nlohmann::json device = {{"name", DeviceName(hca)}, {"attributes", Attributes(hca, opts)}};
    if (taint) {
      device["taints"] = nlohmann::json::array(
          {{{"key", taint->key}, {"value", taint->value}, {"effect", taint->effect}}});
    }
    if (opts.mode == hca::Mode::kShared) {
      device["allowMultipleAllocations"] = true;
      device["capacity"] = SharedCapacity(hca, opts);
    }
    devices.push_back(std::move(device));
  }
  return devices;
}

}  // namespace rdp::dra
