#pragma once

// The resources file of `serve --config FILE` (docs/config.md): which resources the node's HCAs
// are sold as. Two formats are read from one path: ours (a top-level `resources:` list, YAML or
// JSON, strict) and the Mellanox RDMA shared device plugin's config.json (recognised by its
// `configList` key, read with that plugin's semantics, lenient about unknown keys).

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "resources/resources.h"
#include "topology/topology.h"

namespace rdp::resources {

// The most shared units one resource advertises (sharedDevices, rdmaHcaMax, --shared-devices).
inline constexpr int kMaxSharedDevices = 100000;

enum class ConfigFormat {
  kDefault,         // no file: DefaultConfig
  kResources,       // ours: `resources:`
  kMellanoxShared,  // the Mellanox shared plugin's `configList`
};

struct Config {
  std::vector<Resource> resources;  // at least one; names unique
  // The Mellanox config's periodicUpdateInterval: how often it rescans the node. 0 is that
  // plugin's "never". Absent in our format and when the file does not set it.
  std::optional<absl::Duration> update_interval;
  ConfigFormat format = ConfigFormat::kDefault;
  // What was read but not used (a Mellanox config's unknown keys), each naming the file and the
  // key; the caller logs them.
  std::vector<std::string> warnings;
};

// OK when `name` is "<domain>/<name>" (one '/', neither side empty), the form the kubelet
// registers; else InvalidArgument saying so. One rule for --resource-name and the file's names.
absl::Status ValidateResourceName(absl::string_view name);

// The config at `path`. InvalidArgument naming the file, the key path
// ("resources[1].selector.linkLayers[0]") and, where the parser knows it, the line, when a
// value is wrong, a key of our format is unknown, a list is expected and something else is
// written, or a name is repeated; NotFound / InvalidArgument naming the file when it cannot be
// read or parsed. Nothing is returned half-read.
absl::StatusOr<Config> LoadConfig(const std::string& path);

// No file: one resource `resource_name` (not validated here), the node's physical functions.
Config DefaultConfig(std::string resource_name);

// OK when no HCA of `hcas` is selected by two resources that are not always_shared (exclusive
// mode sells each HCA once); else InvalidArgument naming the first such HCA (name and PCI
// address) and both resources.
absl::Status CheckExclusiveOverlap(const std::vector<Resource>& resources,
                                   const std::vector<topology::Hca>& hcas);

}  // namespace rdp::resources
