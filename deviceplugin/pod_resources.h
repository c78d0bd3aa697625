#pragma once

// The kubelet's pod-resources API as this plugin uses it: which running container holds which
// devices. The client is a seam (PodResourcesSource) so that tests need no kubelet; what the
// plugin concludes from a list lives in withholding.h and gpu_context.h.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace v1 {
class ListPodResourcesResponse;
}  // namespace v1

namespace rdp::deviceplugin {

// One running container and its device-plugin devices.
struct ContainerDevices {
  std::string key;  // "<namespace>/<pod>/<container>"
  std::map<std::string, std::vector<std::string>> devices;  // resource name -> device IDs
};
using PodList = std::vector<ContainerDevices>;

class PodResourcesSource {
 public:
  using Done = std::function<void(absl::StatusOr<PodList>)>;
  virtual ~PodResourcesSource() = default;
  // Starts one List that gives up after `timeout`. `done` runs exactly once, on any thread (on
  // this one, before List returns, when the answer is at hand), within about `timeout`.
  // Thread-safe.
  virtual void List(absl::Duration timeout, Done done) = 0;
  // Shutdown: the Lists in flight finish at once (failed), and so does every later one.
  virtual void Cancel() {}
};

// The containers of a List answer, keyed "<namespace>/<pod>/<container>"; a resource named in
// several entries of one container has its IDs merged.
PodList ToPodList(const v1::ListPodResourcesResponse& response);

// A gRPC client of v1.PodResourcesLister on the unix socket `socket_path`. It dials lazily, at
// the first List, and keeps retrying the connection every second at most, so that a socket that
// appears (or is created anew by a restarted kubelet) after the plugin started is picked up.
// It accepts answers up to kMaxListBytes, as the kubelet's own pod-resources clients do.
inline constexpr int kMaxListBytes = 16 * 1024 * 1024;
std::unique_ptr<PodResourcesSource> NewGrpcPodResources(const std::string& socket_path);

// The IDs of `resource` that any container holds.
std::vector<std::string> HeldIds(const PodList& pods, const std::string& resource);

}  // namespace rdp::deviceplugin
