#pragma once

// The HTTP endpoint of --metrics-address: GET /metrics (the text exposition a callback renders),
// GET /healthz ("ok", or 503 and why when a health callback says the process is not well) and,
// where the door gives them, GET /livez and /readyz (what its liveness and readiness probes ask),
// served by civetweb (Debian's libcivetweb) on a few threads of its
// own, so that a scrape never runs on, nor waits for, a thread that serves the kubelet.
// Connections are not kept alive: a scraper holds a worker thread only for one request, and a
// client that sends its request slowly gives its thread up after the request timeout. The routes
// are in place before the port listens (no request is ever answered 404 for being early), and an
// access list (--metrics-allow) refuses other clients before any handler runs.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"

#include "absl/status/statusor.h"

struct mg_context;
struct mg_connection;

namespace rdp::metrics {

// "HOST:PORT" as --metrics-address takes it -> civetweb's listening_ports spelling. HOST is an
// IPv4 address, "localhost" (127.0.0.1), empty (every IPv4 interface) or a bracketed IPv6
// address when civetweb was built with IPv6; PORT is 0..65535, 0 for an ephemeral port.
// InvalidArgument naming --metrics-address and the value otherwise.
absl::StatusOr<std::string> ParseListenAddress(std::string_view address);

// --metrics-allow's entries (IPv4 addresses or CIDRs, "10.0.0.0/8") -> civetweb's
// access_control_list: every other client refused. Empty: "" (every client). InvalidArgument
// naming --metrics-allow and the entry otherwise.
absl::StatusOr<std::string> ParseAccessList(const std::vector<std::string>& allow);

// How the endpoint listens and what it lets a client take.
struct HttpOptions {
  std::string address;             // --metrics-address (ParseListenAddress)
  std::vector<std::string> allow;  // --metrics-allow (ParseAccessList); empty: every client
  int threads = 4;                 // --metrics-threads: requests served at once (1..64)
  // --metrics-request-timeout: how long a client may take to send its request and read the
  // answer before its thread is taken back.
  absl::Duration request_timeout = absl::Seconds(2);
};
// InvalidArgument naming the flag of the first bad field.
absl::Status Validate(const HttpOptions& options);

class MetricsHttpServer {
 public:
  using Render = std::function<std::string()>;
  // OK: /healthz answers 200 "ok"; an error: 503 with its message.
  using Health = std::function<absl::Status()>;
  // What the check routes answer, each alike: OK 200 "ok", an error 503 with its message. Null:
  // /healthz always OK; /livez and /readyz not served (404). They run on civetweb's threads,
  // possibly at once, and must outlive the server; a check that waits for anything does so with
  // a deadline shorter than a probe's timeout.
  struct Checks {
    Health healthz;
    Health livez;   // the kubelet's liveness (and startup) probe: an httpGet, no process started
    Health readyz;  // its readiness probe
  };

  // Listens on `address` (ParseListenAddress) and serves until destroyed. InvalidArgument for
  // a bad address, Unavailable when it cannot listen there (in use, not an address of this
  // host), each naming --metrics-address. `render` runs on civetweb's threads, possibly two at
  // once; it must be thread-safe and outlive the server.
  // `health` (optional: null is always OK) runs on civetweb's threads too, with the same rules.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(std::string_view address,
                                                                   Render render,
                                                                   Health health = nullptr);
  // The same with every option and check route; InvalidArgument (Validate) names the flag of a
  // bad option.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const HttpOptions& options,
                                                                   Render render,
                                                                   Checks checks = {});
  ~MetricsHttpServer();  // stops listening and waits for requests in flight
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // "HOST:PORT" it listens on (the ephemeral port when asked for port 0).
  std::string address() const { return host_ + ":" + std::to_string(port_); }

 private:
  MetricsHttpServer(Render render, Checks checks, std::string host)
      : render_(std::move(render)), checks_(std::move(checks)), host_(std::move(host)) {}
  // civetweb's begin_request: routes a request (set before the server starts).
  static int Route(struct mg_connection* conn);
  int HandleMetrics(struct mg_connection* conn) const;
  // One check route: `check` null answers `absent` (200 "ok" or 404).
  static int HandleCheck(struct mg_connection* conn, const char* route, const Health& check,
                         int absent);

  const Render render_;
  const Checks checks_;
  const std::string host_;
  int port_ = 0;
  mg_context* context_ = nullptr;
};

}  // namespace rdp::metrics
