#include "kube/client.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "kube/internal/files.h"

namespace rdp::kube {

namespace {

class RealClockImpl : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  bool SleepFor(absl::Duration d, WaitEnder& ender) override {
    return ender.WaitUntil(absl::Now() + d);
  }
};

bool Retriable(int code) { return code == 429 || (code >= 500 && code != 501); }

// The table of kube/client.h for a non-2xx answer.
absl::Status MapStatus(const std::string& what, const std::string& method, int code,
                       const std::string& body) {
  const std::string message = absl::StrCat(what, ": ", ServerMessage(code, body));
  std::string reason;
  const auto doc = nlohmann::json::parse(body, nullptr, false);
  if (doc.is_object() && doc.contains("reason") && doc["reason"].is_string()) {
    reason = doc["reason"].get<std::string>();
  }
  switch (code) {
    case 400:
    case 413:
    case 415:
    case 422:
      return absl::InvalidArgumentError(message);
    case 401:
    case 403:
      return absl::PermissionDeniedError(message);
    case 404:
      return absl::NotFoundError(message);
    case 409:
      if (reason == "AlreadyExists" || (reason.empty() && method == "POST")) {
        return absl::AlreadyExistsError(message);
      }
      return absl::AbortedError(message);
    case 410:
      return absl::AbortedError(message);
    case 429:
      return absl::ResourceExhaustedError(message);
    default:
      break;
  }
  if (code >= 500 && code != 501) return absl::UnavailableError(message);
  return absl::UnknownError(message);
}

}  // namespace

void WaitEnder::End() {
  absl::MutexLock lock(&mu_);
  ended_.store(true, std::memory_order_release);
  cv_.SignalAll();
}

bool WaitEnder::WaitUntil(absl::Time until) {
  absl::MutexLock lock(&mu_);
  while (!Ended()) {
    if (cv_.WaitWithDeadline(&mu_, until)) return Ended();
  }
  return true;
}

Clock* RealClock() {
  static Clock* clock = new RealClockImpl;
  return clock;
}

std::string PercentEncode(const std::string& s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'%', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

std::string ServerMessage(int status, const std::string& body) {
  const auto doc = nlohmann::json::parse(body, nullptr, false);
  std::string text = absl::StrCat(status);
  if (doc.is_object() && doc.value("kind", "") == "Status") {
    if (doc.contains("reason") && doc["reason"].is_string()) {
      absl::StrAppend(&text, " ", doc["reason"].get<std::string>());
    }
    if (doc.contains("message") && doc["message"].is_string()) {
      absl::StrAppend(&text, ": ", doc["message"].get<std::string>());
    }
    return text;
  }
  // Not a Status (a proxy's page, a bare text): enough of it to recognise.
  constexpr std::size_t kMax = 256;
  std::string excerpt(absl::StripAsciiWhitespace(body.substr(0, kMax)));
  if (!excerpt.empty()) absl::StrAppend(&text, ": ", excerpt, body.size() > kMax ? "..." : "");
  return text;
}

Client::Client(Config config, std::unique_ptr<Transport> transport)
    : Client(std::move(config), std::move(transport), Options()) {}

Client::Client(Config config, std::unique_ptr<Transport> transport, Options options)
    : config_(std::move(config)),
      transport_(std::move(transport)),
      options_(options),
      rng_(options.jitter_seed != 0 ? options.jitter_seed : std::random_device()()) {
  token_ = config_.token;
}

absl::StatusOr<std::string> Client::Token() {
  absl::MutexLock lock(&mu_);
  if (config_.token_file.empty()) return token_;
  // Read at every request: a rotated projected token (kubelet swaps the file's ..data link) is
  // used from the next request on, and a read costs little next to a TLS exchange.
  auto content = internal::ReadSmallFile(config_.token_file);
  if (content.ok()) {
    std::string token(absl::StripAsciiWhitespace(*content));
    if (!token.empty()) {
      token_ = std::move(token);
      return token_;
    }
  }
  if (!token_.empty()) return token_;  // keep the last one through a rotation's instant
  return absl::UnauthenticatedError(absl::StrCat(
      "token file ", config_.token_file, ": ",
      content.ok() ? "empty" : std::string(content.status().message())));
}

absl::Duration Client::Backoff(int attempt) {
  const RetryPolicy& p = options_.retry;
  const double factor = std::pow(p.multiplier, std::max(0, attempt - 1));
  const absl::Duration bound = std::min(p.max, p.initial * factor);
  absl::MutexLock lock(&mu_);
  std::uniform_real_distribution<double> half_to_one(0.5, 1.0);
  return bound * half_to_one(rng_);
}

absl::StatusOr<std::vector<std::string>> Client::Headers(bool with_body) {
  if (absl::Status s = CheckCredentialsSafe(config_); !s.ok()) return s;
  auto token = Token();
  if (!token.ok()) return token.status();
  std::vector<std::string> headers = {"Accept: application/json",
                                      "User-Agent: rdma-device-plugin-dra"};
  if (with_body) headers.push_back("Content-Type: application/json");
  if (!token->empty()) headers.push_back("Authorization: Bearer " + *token);
  return headers;
}

absl::Status Client::Watch(const std::string& path, absl::Duration timeout,
                               const std::function<bool()>& cancelled,
                               const std::function<void()>& on_open,
                               const std::function<bool(const nlohmann::json&)>& on_event) {
  const std::string what = absl::StrCat("WATCH ", path);
  HttpRequest request;
  request.method = "GET";
  request.url = config_.server + path;
  auto headers = Headers(false);
  if (!headers.ok()) return headers.status();
  request.headers = *std::move(headers);
  request.timeout = timeout;
  request.cancelled = [this, cancelled] { return ShutDown() || (cancelled && cancelled()); };
  if (ShutDown()) return absl::CancelledError(absl::StrCat(what, ": the client is shut down"));
  std::string pending;  // a line not complete yet
  absl::Status ended;   // set by an ERROR event or a line that is not JSON
  auto on_data = [&](std::string_view data) {
    pending.append(data);
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string_view line(pending.data() + start, nl - start);
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const auto event = nlohmann::json::parse(line, nullptr, false);
      if (!event.is_object() || !event.contains("type") || !event["type"].is_string()) {
        ended = absl::InternalError(absl::StrCat(what, ": an event that is not JSON"));
        return false;
      }
      if (event["type"] == "ERROR") {
        const nlohmann::json& object = event.contains("object") ? event["object"] : event;
        const int code = object.is_object() && object.contains("code") &&
                                 object["code"].is_number_integer()
                             ? object["code"].get<int>()
                             : 500;
        ended = MapStatus(what, "GET", code, object.dump(-1, ' ', false,
                                                         nlohmann::json::error_handler_t::replace));
        return false;
      }
      if (!on_event(event)) {
        ended = absl::CancelledError(absl::StrCat(what, ": ended by its reader"));
        return false;
      }
    }
    pending.erase(0, start);
    return true;
  };
  auto response = transport_->Stream(
      request,
      [&](int status) {
        if (status >= 200 && status < 300 && on_open) on_open();
      },
      on_data);
  if (!ended.ok()) return ended;
  if (!response.ok()) {
    return absl::Status(response.status().code(),
                        absl::StrCat(what, ": ", response.status().message()));
  }
  if (response->status < 200 || response->status >= 300) {
    return MapStatus(what, "GET", response->status, response->body);
  }
  return absl::OkStatus();
}

absl::StatusOr<Response> Client::Do(const std::string& method, const std::string& path,
                                            const nlohmann::json& body, absl::Time deadline) {
  const std::string what = absl::StrCat(method, " ", path);
  Clock& clock = *options_.clock;
  HttpRequest request;
  request.method = method;
  request.url = config_.server + path;
  // replace: a string that is not UTF-8 (read from sysfs) must not make dump() throw on the
  // publishing thread; the server gets U+FFFD in its place.
  if (!body.is_null()) request.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  request.cancelled = [this] { return ShutDown(); };
  absl::Status last;
  for (int attempt = 1;; ++attempt) {
    if (ShutDown()) {
      return absl::CancelledError(
          absl::StrCat(what, ": the client is shut down", attempt == 1 ? "" : "; last: ",
                       attempt == 1 ? "" : last.message()));
    }
    const absl::Time now = clock.Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          attempt == 1 ? absl::StrCat(what, ": the deadline had passed")
                       : absl::StrCat(what, ": deadline reached after ", attempt - 1,
                                      " attempts; last: ", last.message()));
    }
    auto headers = Headers(!request.body.empty());
    if (!headers.ok()) return headers.status();
    request.headers = *std::move(headers);
    request.timeout = deadline - now;

    std::optional<absl::Duration> retry_after;
    auto response = transport_->RoundTrip(request);
    if (!response.ok()) {
      const absl::Status& s = response.status();
      if (s.code() != absl::StatusCode::kUnavailable) {
        return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
      }
      last = absl::UnavailableError(absl::StrCat(what, ": ", s.message()));
    } else if (response->status >= 200 && response->status < 300) {
      Response out;
      out.status = response->status;
      if (!response->body.empty()) {
        out.body = nlohmann::json::parse(response->body, nullptr, false);
        if (out.body.is_discarded()) {
          return absl::InternalError(absl::StrCat(
              what, ": ", response->status, " with a body that is not JSON (Content-Type: ",
              response->content_type.empty() ? "none" : response->content_type, ")"));
        }
      }
      return out;
    } else {
      last = MapStatus(what, method, response->status, response->body);
      if (!Retriable(response->status)) return last;
      retry_after = response->retry_after;
    }

    if (attempt >= options_.retry.max_attempts) {
      return absl::Status(last.code(),
                          absl::StrCat(last.message(), " (gave up after ", attempt, " attempts)"));
    }
    absl::Duration wait = Backoff(attempt);
    if (retry_after && *retry_after > wait) wait = *retry_after;
    if (clock.Now() + wait >= deadline) {
      return absl::Status(last.code(), absl::StrCat(last.message(), " (", attempt,
                                                    " attempts; no time left before the "
                                                    "deadline for another)"));
    }
    Logger("kube")->debug("api retry method={} path={} attempt={} wait={} error=\"{}\"", method,
                         path, attempt, absl::FormatDuration(wait), std::string(last.message()));
    clock.SleepFor(wait, shut_down_);  // the loop's next turn answers a Shutdown
  }
}

void Client::Shutdown() { shut_down_.End(); }

namespace {

absl::StatusOr<std::unique_ptr<Client>> ClientFor(absl::StatusOr<Config> config) {
  if (!config.ok()) return config.status();
  if (absl::Status s = CheckCredentialsSafe(*config); !s.ok()) return s;
  auto transport = NewCurlTransport(*config);
  return std::make_unique<Client>(*std::move(config), std::move(transport));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> NewClient(const std::string& kubeconfig) {
  return ClientFor(kubeconfig.empty() ? InClusterConfig("/") : LoadKubeconfig(kubeconfig));
}

absl::StatusOr<std::unique_ptr<Client>> NewClient(const std::string& kubeconfig,
                                                  const std::string& root,
                                                  const GetEnvFunc& getenv) {
  return ClientFor(kubeconfig.empty() ? InClusterConfig(root, getenv)
                                      : LoadKubeconfig(kubeconfig));
}

}  // namespace rdp::kube
