#pragma once

// The HTTP endpoint of --metrics-address: GET /metrics (the text exposition a callback renders)
// and GET /healthz ("ok", or 503 and why when a health callback says the process is not well),
// served by civetweb (Debian's libcivetweb) on a few threads of its
// own, so that a scrape never runs on, nor waits for, a thread that serves the kubelet.
// Connections are not kept alive: a scraper holds a worker thread only for one request.

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

struct mg_context;
struct mg_connection;

namespace rdp::metrics {

// "HOST:PORT" as --metrics-address takes it -> civetweb's listening_ports spelling. HOST is an
// IPv4 address, "localhost" (127.0.0.1), empty (every IPv4 interface) or a bracketed IPv6
// address when civetweb was built with IPv6; PORT is 0..65535, 0 for an ephemeral port.
// InvalidArgument naming --metrics-address and the value otherwise.
absl::StatusOr<std::string> ParseListenAddress(std::string_view address);

class MetricsHttpServer {
 public:
  using Render = std::function<std::string()>;
  // OK: /healthz answers 200 "ok"; an error: 503 with its message.
  using Health = std::function<absl::Status()>;

  // Listens on `address` (ParseListenAddress) and serves until destroyed. InvalidArgument for
  // a bad address, Unavailable when it cannot listen there (in use, not an address of this
  // host), each naming --metrics-address. `render` runs on civetweb's threads, possibly two at
  // once; it must be thread-safe and outlive the server.
  // `health` (optional: null is always OK) runs on civetweb's threads too, with the same rules.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(std::string_view address,
                                                                   Render render,
                                                                   Health health = nullptr);
  ~MetricsHttpServer();  // stops listening and waits for requests in flight
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The port it listens on (the ephemeral one when asked for port 0), and "HOST:PORT" with it.
  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }

 private:
  MetricsHttpServer(Render render, Health health, std::string host)
      : render_(std::move(render)), health_(std::move(health)), host_(std::move(host)) {}
  static int HandleMetrics(struct mg_connection* conn, void* self);
  static int HandleHealthz(struct mg_connection* conn, void* self);

  const Render render_;
  const Health health_;
  const std::string host_;
  int port_ = 0;
  mg_context* context_ = nullptr;
};

}  // namespace rdp::metrics
