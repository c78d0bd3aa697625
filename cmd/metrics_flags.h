#pragma once

// The metrics endpoint's flags, which both serving subcommands (serve, dra) take:
// --metrics-address, --metrics-allow, --metrics-threads, --metrics-request-timeout, each also
// an environment variable (RDP_METRICS_ADDRESS, ...).

#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "metrics/http_server.h"

namespace rdp::cmd {

struct MetricsFlags {
  std::string address;  // empty: no endpoint
  std::string allow;    // comma-separated IPv4 addresses or CIDRs; empty: every client
  int threads = 4;
  std::string request_timeout = "2s";

  void Register(CLI::App* app);
  // The validated options (address "" when the endpoint is off); InvalidArgument naming the flag.
  absl::StatusOr<metrics::HttpOptions> Options() const;
};

}  // namespace rdp::cmd
