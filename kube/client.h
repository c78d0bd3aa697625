#pragma once

// A small Kubernetes REST client: the verbs (GET, POST, PUT, DELETE) and watches, JSON in and
// out (nlohmann), one HTTP exchange at a time through a Transport seam (kube/transport.h), a
// Clock seam for the retry back-off, and every request bounded by a deadline.
//
// Status mapping of a request (Client::Do):
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
//   a 2xx body that is not JSON       -> Internal, naming its Content-Type
//   a bad server URL                  -> InvalidArgument
//   an answer over 64 MiB             -> ResourceExhausted
//   the token file unreadable before  -> Unauthenticated (nothing sent)
//     any token was read
//   a token for an http:// server     -> FailedPrecondition (nothing sent: CheckCredentialsSafe)

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kube/config.h"
#include "kube/transport.h"
#include "nlohmann/json.hpp"

namespace rdp::kube {

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
struct Response {
  int status = 0;
  nlohmann::json body;  // null when the body was empty
};

class Client {
 public:
  struct Options {
    Clock* clock = RealClock();  // not owned; outlives the client
    RetryPolicy retry;
    std::uint64_t jitter_seed = 0;  // 0: from std::random_device
  };

  // `transport` does the exchanges; `config` gives the server and the credentials.
  Client(Config config, std::unique_ptr<Transport> transport);
  Client(Config config, std::unique_ptr<Transport> transport, Options options);

  // `path` begins with "/" ("/api/v1/nodes/n1") and is sent as is: the caller escapes it.
  // A null `body` sends none. Returns a 2xx answer or the status of the table above, with the
  // method, the path and the server's message in it. Retries as RetryPolicy says, all within
  // `deadline`. Thread-safe.
  absl::StatusOr<Response> Do(const std::string& method, const std::string& path,
                                  const nlohmann::json& body, absl::Time deadline);
  absl::StatusOr<Response> Get(const std::string& path, absl::Time deadline) {
    return Do("GET", path, nullptr, deadline);
  }
  absl::StatusOr<Response> Post(const std::string& path, const nlohmann::json& body,
                                    absl::Time deadline) {
    return Do("POST", path, body, deadline);
  }
  absl::StatusOr<Response> Put(const std::string& path, const nlohmann::json& body,
                                   absl::Time deadline) {
    return Do("PUT", path, body, deadline);
  }
  // `body`: DeleteOptions (preconditions, ...) or null.
  absl::StatusOr<Response> Delete(const std::string& path, const nlohmann::json& body,
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

  const Config& config() const { return config_; }

  // The process is stopping: every call in flight or made from now on ends at once (Cancelled,
  // "the client is shut down"): an exchange in progress is abandoned (the transport polls about
  // once a second), a retry's wait ends, no further attempt is made. So that SIGTERM is not held
  // up by a call waiting out an unreachable API server. Never undone. Thread-safe.
  void Shutdown();

 private:
  // The "Authorization: Bearer" header's token, from the file when there is one; the last token
  // read when the file cannot be read now (a rotation in progress).
  absl::StatusOr<std::string> Token();
  absl::Duration Backoff(int attempt);
  // Accept, User-Agent, Content-Type (with a body) and Authorization (with a token).
  absl::StatusOr<std::vector<std::string>> Headers(bool with_body);

  const Config config_;
  const std::unique_ptr<Transport> transport_;
  const Options options_;
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  // Shutdown: the flag the exchanges poll, and what ends the retry waits on any clock.
  WaitEnder shut_down_;
  bool ShutDown() const { return shut_down_.Ended(); }
};

// The client of the API server this process is configured for: the kubeconfig at `kubeconfig`,
// or, when that is empty, the pod's service account under `root` (InClusterConfig, the variables
// from `getenv`; the real environment and "/" in the first form), over the curl transport.
// The errors of LoadKubeconfig and InClusterConfig, and CheckCredentialsSafe's when the
// configuration would send a token in clear. Sends nothing.
absl::StatusOr<std::unique_ptr<Client>> NewClient(const std::string& kubeconfig);
absl::StatusOr<std::unique_ptr<Client>> NewClient(const std::string& kubeconfig,
                                                  const std::string& root,
                                                  const GetEnvFunc& getenv);

// `s` percent-encoded for a URL's query value or path segment (RFC 3986 unreserved kept).
std::string PercentEncode(const std::string& s);

// The "<code> <reason>: <message>" of an API server's Status body, or the body itself (cut).
std::string ServerMessage(int status, const std::string& body);

}  // namespace rdp::kube
