#include "cmd/metrics_flags.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cmd/flag_values.h"

namespace rdp::cmd {

void MetricsFlags::Register(CLI::App* app) {
  app->add_option("--metrics-address", address,
                  "HOST:PORT to serve Prometheus metrics (/metrics) and /healthz on, e.g. "
                  ":9478 or 127.0.0.1:0 (an ephemeral port, logged); empty: off. It listens "
                  "before the plugin registers: a port in use exits 2")
      ->envname("RDP_METRICS_ADDRESS");
  app->add_option("--metrics-allow", allow,
                  "Comma-separated IPv4 addresses or CIDRs that may use the metrics endpoint; "
                  "every other client is refused. Empty: every client")
      ->envname("RDP_METRICS_ALLOW");
  app->add_option("--metrics-threads", threads,
                  "Requests the metrics endpoint serves at once")
      ->envname("RDP_METRICS_THREADS")
      ->capture_default_str();
  app->add_option("--metrics-request-timeout", request_timeout,
                  "How long a metrics client may take to send its request and read the answer")
      ->envname("RDP_METRICS_REQUEST_TIMEOUT")
      ->capture_default_str();
}

absl::StatusOr<metrics::HttpOptions> MetricsFlags::Options() const {
  metrics::HttpOptions o;
  o.address = address;
  o.allow = absl::StrSplit(allow, ',', absl::SkipWhitespace());
  for (std::string& entry : o.allow) entry = std::string(absl::StripAsciiWhitespace(entry));
  o.threads = threads;
  absl::StatusOr<absl::Duration> timeout =
      DurationFlag("--metrics-request-timeout", request_timeout, /*positive=*/false);
  if (!timeout.ok()) return timeout.status();
  o.request_timeout = *timeout;
  if (address.empty()) return o;
  if (absl::Status s = metrics::Validate(o); !s.ok()) return s;
  return o;
}

}  // namespace rdp::cmd
