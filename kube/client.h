#pragma once

// A small Kubernetes REST client (issue 16): what the DRA driver needs of the API server (GET a
// claim or a Node, LIST, create, update and delete ResourceSlices) and nothing more. JSON in and
// out (nlohmann), one HTTP exchange at a time through a Transport seam (libcurl in the product,
// a fake in unit tests), a Clock seam for the retry back-off, and every request bounded by a
// deadline.
//
// Status mapping of a request (KubeClient::Do):
//   2xx                               -> the response
//   no HTTP answer (refused, reset,   -> Unavailable (retried)
//     DNS, TLS handshake)
//   the deadline passed               -> DeadlineExceeded
//   400, 413, 415, 422                -> InvalidArgument, with the server's message
//   401, 403                          -> PermissionDenied, with the server's message
//   404                               -> NotFound
//   409 on POST (AlreadyExists)       -> AlreadyExists
//   409 otherwise (Conflict), 410     -> Aborted (re-read and try again)
//   429                               -> ResourceExhausted (retried)
//   5xx but 501                       -> Unavailable (retried)
//   anything else (501, 3xx, ...)     -> Unknown
//   a 2xx body that is not JSON       -> Internal
//   a bad server URL                  -> InvalidArgument
//   an answer over 64 MiB             -> ResourceExhausted
//   the token file unreadable before  -> Unauthenticated (nothing sent)
//     any token was read
//   a token for an http:// server     -> FailedPrecondition (nothing sent: CheckCredentialsSafe)

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace rdp::dra {

// Where the API server is and who we are to it.
struct KubeConfig {
  std::string server;  // "https://10.96.0.1:443", "https://[fd00::1]:6443"
  // The CA that signs the server's certificate: a PEM file or PEM bytes; neither = the system's.
  std::string ca_file;
  std::string ca_data;
  // tls-server-name: the name the server's certificate must carry when it is not the host of
  // `server` (an IP address, a load balancer).
  std::string tls_server_name;
  bool insecure_skip_tls_verify = false;
  // A bearer token, or a file holding one (re-read when it changes: projected service-account
  // tokens rotate); token_file wins when both are set.
  std::string token;
  std::string token_file;
  // A client certificate and key (PEM), files or bytes.
  std::string client_cert_file;
  std::string client_cert_data;
  std::string client_key_file;
  std::string client_key_data;
  // Where this configuration came from, for messages ("kubeconfig /root/.kube/config").
  std::string source;
};

// FailedPrecondition when `config` would send a credential in clear: a bearer token (token or
// token_file) to an http:// server. A client certificate cannot go over plain HTTP at all.
absl::Status CheckCredentialsSafe(const KubeConfig& config);

// Looks an environment variable up; nullopt when unset.
using GetEnvFunc = std::function<std::optional<std::string>(const std::string&)>;

// The service-account identity of a pod: <root>/var/run/secrets/kubernetes.io/serviceaccount/
// {token,ca.crt} and KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT (an IPv6 host is
// bracketed). FailedPrecondition naming the variable or file that is missing or empty. The token
// is not kept: it is read from its file at each request.
absl::StatusOr<KubeConfig> InClusterConfig(const std::string& root);
absl::StatusOr<KubeConfig> InClusterConfig(const std::string& root, const GetEnvFunc& getenv);

// The current context of a kubeconfig file: its cluster's server, certificate-authority(-data),
// tls-server-name, insecure-skip-tls-verify and its user's token, tokenFile,
// client-certificate(-data), client-key(-data). Relative file names are relative to the
// kubeconfig's directory, as kubectl reads them. The file is YAML, as kubectl writes it, or JSON
// (yaml-cpp; plain true/false/yes/no/on/off are booleans, every other scalar a string; a build
// without yaml-cpp, the arm64 cross build, reads JSON only and says so).
// Errors name the file and the field: NotFound (no file), InvalidArgument (neither JSON nor YAML,
// with the line; not a mapping; a missing context, cluster or user, bad base64), Unimplemented
// (exec and auth-provider users).
absl::StatusOr<KubeConfig> LoadKubeconfig(const std::string& path);

// One HTTP exchange.
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

// libcurl, TLS as `config` says (CA, client certificate, server name). Connections are kept alive
// and reused (a pool of easy handles, each keeping its connection), so that a steady driver does
// not pay a TCP and TLS handshake per request; a stream's connection sends TCP keep-alives so that
// a dead peer ends it. Reads the CA and client-certificate files for each new connection.
// Thread-safe.
std::unique_ptr<Transport> NewCurlTransport(const KubeConfig& config);

// A flag set once to end every wait on it early (a client's Shutdown). Thread-safe.
class WaitEnder {
 public:
  void End();
  bool Ended() const { return ended_.load(std::memory_order_acquire); }
  // Waits until `until` on the real clock, or until End; true when ended.
  bool WaitUntil(absl::Time until);

 private:
  std::atomic<bool> ended_{false};
  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled by End; a CondVar loop, not Mutex::Await (await_rule)
};

// Time and waiting, so that unit tests of the back-off do not sleep.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // Waits `d` of this clock's time, or less when `ender` ends it; true when it was ended.
  virtual bool SleepFor(absl::Duration d, WaitEnder& ender) = 0;
};

// The real clock (absl::Now; a wait on the WaitEnder's condition variable). Thread-safe; never
// destroyed.
Clock* RealClock();

// Exponential back-off with jitter for the retriable outcomes (Unavailable, 429, 5xx): the n-th
// wait is drawn uniformly from [b/2, b] with b = min(initial * multiplier^(n-1), max), and never
// shorter than the server's Retry-After; no wait ends past the request's deadline (the last
// error is returned instead).
struct RetryPolicy {
  absl::Duration initial = absl::Milliseconds(200);
  double multiplier = 2.0;
  absl::Duration max = absl::Seconds(5);
  // Attempts at most, the first included; the deadline usually ends them first.
  int max_attempts = 20;
};

// An answer with a 2xx status.
struct KubeResponse {
  int status = 0;
  nlohmann::json body;  // null when the body was empty
};

class KubeClient {
 public:
  struct Options {
    Clock* clock = RealClock();  // not owned; outlives the client
    RetryPolicy retry;
    std::uint64_t jitter_seed = 0;  // 0: from std::random_device
  };

  // `transport` does the exchanges; `config` gives the server and the credentials.
  KubeClient(KubeConfig config, std::unique_ptr<Transport> transport);
  KubeClient(KubeConfig config, std::unique_ptr<Transport> transport, Options options);

  // `path` begins with "/" ("/api/v1/nodes/n1") and is sent as is: the caller escapes it.
  // A null `body` sends none. Returns a 2xx answer or the status of the table above, with the
  // method, the path and the server's message in it. Retries as RetryPolicy says, all within
  // `deadline`. Thread-safe.
  absl::StatusOr<KubeResponse> Do(const std::string& method, const std::string& path,
                                  const nlohmann::json& body, absl::Time deadline);
  absl::StatusOr<KubeResponse> Get(const std::string& path, absl::Time deadline) {
    return Do("GET", path, nullptr, deadline);
  }
  absl::StatusOr<KubeResponse> Post(const std::string& path, const nlohmann::json& body,
                                    absl::Time deadline) {
    return Do("POST", path, body, deadline);
  }
  absl::StatusOr<KubeResponse> Put(const std::string& path, const nlohmann::json& body,
                                   absl::Time deadline) {
    return Do("PUT", path, body, deadline);
  }
  // `body`: DeleteOptions (preconditions, ...) or null.
  absl::StatusOr<KubeResponse> Delete(const std::string& path, const nlohmann::json& body,
                                      absl::Time deadline) {
    return Do("DELETE", path, body, deadline);
  }

  // A watch: GET `path` (which carries watch=true and the resourceVersion to start from) and
  // `on_event` with each event ({"type": ADDED|MODIFIED|DELETED|BOOKMARK, "object": ...}) until
  // the server ends the watch (OK: its timeoutSeconds passed), `on_event` returns false or
  // `cancelled` returns true (Cancelled), or `timeout` passes (DeadlineExceeded). `on_open` is
  // called once the server accepted the watch. An ERROR event is the status of its Status object
  // as the table maps its code (410 Gone, the version too old: Aborted); not retried.
  absl::Status Watch(const std::string& path, absl::Duration timeout,
                     const std::function<bool()>& cancelled, const std::function<void()>& on_open,
                     const std::function<bool(const nlohmann::json& event)>& on_event);

  const KubeConfig& config() const { return config_; }

  // The process is stopping: every call in flight or made from now on ends at once (Cancelled,
  // "the driver is stopping"): an exchange in progress is abandoned (the transport polls about
  // once a second), a retry's wait ends, no further attempt is made. So that SIGTERM is not held
  // up by a Prepare, a publish or a status write waiting out an unreachable API server. Never
  // undone. Thread-safe.
  void Shutdown();

 private:
  // The "Authorization: Bearer" header's token, from the file when there is one; the last token
  // read when the file cannot be read now (a rotation in progress).
  absl::StatusOr<std::string> Token();
  absl::Duration Backoff(int attempt);
  // Accept, User-Agent, Content-Type (with a body) and Authorization (with a token).
  absl::StatusOr<std::vector<std::string>> Headers(bool with_body);

  const KubeConfig config_;
  const std::unique_ptr<Transport> transport_;
  const Options options_;
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  // Shutdown: the flag the exchanges poll, and what ends the retry waits on any clock.
  WaitEnder shut_down_;
  bool ShutDown() const { return shut_down_.Ended(); }
};

// `s` percent-encoded for a URL's query value or path segment (RFC 3986 unreserved kept).
std::string PercentEncode(const std::string& s);

// The "<code> <reason>: <message>" of an API server's Status body, or the body itself (cut).
std::string ServerMessage(int status, const std::string& body);

}  // namespace rdp::dra
