#pragma once

// One HTTP exchange with the API server, behind a seam: libcurl in the product, a function in
// unit tests.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/config.h"

namespace rdp::kube {

struct HttpRequest {
  std::string method;  // "GET", "POST", "PUT", "DELETE"
  std::string url;     // the server's URL + the request path
  std::vector<std::string> headers;  // "Name: value"
  std::string body;
  // The whole exchange, connecting included, ends within this time.
  absl::Duration timeout = absl::Seconds(10);
  // Stream: polled about once a second while the exchange runs; true ends it (Cancelled).
  std::function<bool()> cancelled;
};

struct HttpResponse {
  int status = 0;
  std::string body;
  // The Retry-After header (seconds form) when the server sent one.
  std::optional<absl::Duration> retry_after;
  // The Content-Type header; empty when the server sent none.
  std::string content_type;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Sends `request` and returns the server's answer, whatever its status code.
  //   Unavailable: no HTTP answer (connection refused or reset, name resolution, TLS);
  //   DeadlineExceeded: request.timeout passed.
  // Thread-safe: several exchanges may run at once.
  virtual absl::StatusOr<HttpResponse> RoundTrip(const HttpRequest& request) = 0;

  // A long answer read as it comes (a watch): `on_open` is called once with the status code when
  // the headers are in; a 2xx body goes to `on_data` piece by piece (false from it ends the
  // exchange: Cancelled), any other status's body is returned in the response (then without a
  // body of `on_data`'s). The errors of RoundTrip, and Cancelled when request.cancelled said so.
  // Unimplemented when the transport cannot stream (the caller polls instead).
  virtual absl::StatusOr<HttpResponse> Stream(
      const HttpRequest& request, const std::function<void(int status)>& on_open,
      const std::function<bool(std::string_view data)>& on_data) {
    (void)request, (void)on_open, (void)on_data;
    return absl::UnimplementedError("this transport does not stream");
  }
};

// libcurl, TLS as `config` says (CA, client certificate, server name); its server is not used
// (a request carries its whole URL). Connections are kept alive and reused (a pool of easy
// handles, each keeping its connection), so that a steady client does not pay a TCP and TLS
// handshake per request; a stream's connection sends TCP keep-alives so that a dead peer ends it.
// Reads the CA and client-certificate files for each new connection. Thread-safe.
std::unique_ptr<Transport> NewCurlTransport(const Config& config);

}  // namespace rdp::kube
