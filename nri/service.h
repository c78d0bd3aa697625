#pragma once

// The NRI Plugin service as the runtime calls it (proto/nri.proto): Configure, Synchronize,
// Shutdown, CreateContainer. A thin layer, as a gRPC service would be: it decodes the request,
// asks the memlock rule (nri/memlock.h), logs what it did and answers. Protobuf stays here and
// in nri/session.cc.
//
// It must never stop a container from being created: the runtime fails the creation when a
// plugin answers CreateContainer with an error, so every failure to understand a request is
// logged, counted and answered OK without an adjustment.

#include <cstdint>
#include <string>
#include <string_view>

#include "metrics/metrics.h"

namespace rdp::nri {

// The plugin's instruments (docs/metrics.md, "NRI"). Thread-safe, lock-free.
struct NriMetrics {
  metrics::Counter registrations;  // registrations the runtime accepted (re-connections add up)
  metrics::Counter adjustments;    // containers whose RLIMIT_MEMLOCK was raised
  metrics::Counter errors;         // CreateContainer calls answered unadjusted after an error
  std::atomic<bool> connected{false};  // registered and synchronized with the runtime now

  // Writes the families (zeros included, so that rate() sees them start).
  void Write(metrics::Exposition& out) const;
};

// A gRPC-style status code and message; code 0 is OK.
struct CallResult {
  int code = 0;
  std::string message;
  std::string payload;  // the serialized response message when code is 0
};

class PluginService {
 public:
  // `memlock`: the RLIMIT_MEMLOCK containers with one of our devices get (ParseMemlock).
  // `metrics` must outlive the service.
  PluginService(std::uint64_t memlock, NriMetrics& metrics) : memlock_(memlock), metrics_(metrics) {}

  // Answers one call: `service` and `method` as the ttrpc Request names them, `payload` its
  // serialized request. Unimplemented (12) for a method we do not serve. Never throws.
  CallResult Handle(std::string_view service, std::string_view method, const std::string& payload);

  bool synchronized() const { return synchronized_; }

 private:
  CallResult Configure(const std::string& payload);
  CallResult Synchronize(const std::string& payload);
  CallResult CreateContainer(const std::string& payload);

  const std::uint64_t memlock_;
  NriMetrics& metrics_;
  bool synchronized_ = false;
  int sync_containers_ = 0;  // containers seen in the Synchronize parts so far
  int sync_holders_ = 0;     // those of them with a verbs device
};

// The full ttrpc service name of the Plugin service.
inline constexpr char kPluginService[] = "nri.pkg.api.v1alpha1.Plugin";
inline constexpr char kRuntimeService[] = "nri.pkg.api.v1alpha1.Runtime";

}  // namespace rdp::nri
