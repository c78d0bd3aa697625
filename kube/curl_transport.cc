// Transport over libcurl (kube/transport.h): one easy handle per exchange, so that exchanges
// on several threads share nothing but curl's global state, initialised once.

#include <curl/curl.h>

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kube/transport.h"

namespace rdp::kube {

namespace {

// A LIST of a node's slices is kilobytes; anything near this is not an API server's answer.
constexpr std::size_t kMaxBody = 64 << 20;

// Idle handles kept for their connections: more than the driver's threads ever use at once.
constexpr std::size_t kMaxIdleHandles = 4;

struct Exchange {
  CURL* handle = nullptr;
  HttpResponse response;
  bool too_large = false;
  // A stream's: the status, once the headers are in (0 before), and the callbacks.
  int status = 0;
  const std::function<void(int)>* on_open = nullptr;
  const std::function<bool(std::string_view)>* on_data = nullptr;
  const std::function<bool()>* cancelled = nullptr;
  bool stopped = false;  // on_data or cancelled ended it
};

bool Success(int status) { return status >= 200 && status < 300; }

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* exchange = static_cast<Exchange*>(user);
  const size_t n = size * count;
  if (exchange->on_data != nullptr && Success(exchange->status)) {
    if (!(*exchange->on_data)(std::string_view(data, n))) {
      exchange->stopped = true;
      return 0;  // curl stops with CURLE_WRITE_ERROR
    }
    return n;
  }
  if (exchange->response.body.size() + n > kMaxBody) {
    exchange->too_large = true;
    return 0;  // curl stops with CURLE_WRITE_ERROR
  }
  exchange->response.body.append(data, n);
  return n;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* exchange = static_cast<Exchange*>(user);
  const size_t n = size * count;
  const absl::string_view line(data, n);
  if (line == "\r\n" || line == "\n") {  // the end of a header block
    long status = 0;
    curl_easy_getinfo(exchange->handle, CURLINFO_RESPONSE_CODE, &status);
    // 1xx blocks (100 Continue) come before the answer's own.
    if (status >= 200 && exchange->status == 0) {
      exchange->status = static_cast<int>(status);
      if (exchange->on_open != nullptr) (*exchange->on_open)(exchange->status);
    }
    return n;
  }
  constexpr absl::string_view kRetryAfter = "retry-after:";
  if (absl::StartsWithIgnoreCase(line, kRetryAfter)) {
    int seconds = 0;
    // The HTTP-date form is not used by the API server; only seconds are read.
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(kRetryAfter.size())), &seconds) &&
        seconds >= 0) {
      exchange->response.retry_after = absl::Seconds(seconds);
    }
  }
  return n;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* exchange = static_cast<Exchange*>(user);
  if (exchange->cancelled != nullptr && *exchange->cancelled && (*exchange->cancelled)()) {
    exchange->stopped = true;
    return 1;  // CURLE_ABORTED_BY_CALLBACK
  }
  return 0;
}

absl::Status MapCurlError(CURLcode code, const char* detail, const Exchange& exchange) {
  const std::string message =
      absl::StrCat(curl_easy_strerror(code), *detail != '\0' ? ": " : "", detail);
  if (exchange.stopped) return absl::CancelledError(message);
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      return absl::DeadlineExceededError(message);
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return absl::InvalidArgumentError(message);
    case CURLE_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(message);
    case CURLE_WRITE_ERROR:
      if (exchange.too_large) {
        return absl::ResourceExhaustedError(absl::StrCat("response larger than ", kMaxBody,
                                                         " bytes"));
      }
      return absl::InternalError(message);
    default:
      // Connecting, resolving, TLS (a CA being rotated), a reset: no HTTP answer came; the
      // client retries these within the deadline.
      return absl::UnavailableError(message);
  }
}

struct CurlDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
  void operator()(CURLU* u) const { curl_url_cleanup(u); }
  void operator()(char* s) const { curl_free(s); }
};
template <typename T>
using CurlPtr = std::unique_ptr<T, CurlDeleter>;

class CurlTransport : public Transport {
 public:
  CurlTransport(Config config, std::string init_error)
      : config_(std::move(config)), init_error_(std::move(init_error)) {}

  ~CurlTransport() override {
    for (CURL* h : idle_) curl_easy_cleanup(h);
  }

  absl::StatusOr<HttpResponse> RoundTrip(const HttpRequest& request) override {
    Exchange exchange;
    return Perform(request, exchange);
  }

  absl::StatusOr<HttpResponse> Stream(
      const HttpRequest& request, const std::function<void(int)>& on_open,
      const std::function<bool(std::string_view)>& on_data) override {
    Exchange exchange;
    exchange.on_open = &on_open;
    exchange.on_data = &on_data;
    exchange.cancelled = &request.cancelled;
    return Perform(request, exchange);
  }

 private:
  // An idle handle (its connection kept), or a new one.
  CurlPtr<CURL> Take() {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        // Options back to their defaults; the connection cache stays.
        curl_easy_reset(h);
        return CurlPtr<CURL>(h);
      }
    }
    return CurlPtr<CURL>(curl_easy_init());
  }
  void Give(CurlPtr<CURL> h) {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdleHandles) idle_.push_back(h.release());
  }

  absl::StatusOr<HttpResponse> Perform(const HttpRequest& request, Exchange& exchange) {
    if (!init_error_.empty()) return absl::InternalError(init_error_);
    CurlPtr<CURL> h = Take();
    if (!h) return absl::ResourceExhaustedError("curl_easy_init failed");
    CURL* c = h.get();
    exchange.handle = c;
    char detail[CURL_ERROR_SIZE] = "";
    CurlPtr<curl_slist> headers;
    for (const auto& header : request.headers) {
      curl_slist* next = curl_slist_append(headers.get(), header.c_str());
      if (next == nullptr) return absl::ResourceExhaustedError("curl_slist_append failed");
      headers.release();
      headers.reset(next);
    }
    std::string url = request.url;
    curl_slist* connect_to_list = nullptr;
    CurlPtr<curl_slist> connect_to_owner;
    if (!config_.tls_server_name.empty()) {
      // Verify the certificate against tls-server-name but connect where the URL says:
      // address the URL to the name and map the name to the real host and port.
      auto mapped = MapServerName(request.url);
      if (!mapped.ok()) return mapped.status();
      url = mapped->first;
      connect_to_list = curl_slist_append(nullptr, mapped->second.c_str());
      connect_to_owner.reset(connect_to_list);
    }
    const long timeout_ms =
        std::max<long>(1, static_cast<long>(absl::ToInt64Milliseconds(request.timeout)));

    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, detail);
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https,http");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM: threads call this
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    if (connect_to_list != nullptr) curl_easy_setopt(c, CURLOPT_CONNECT_TO, connect_to_list);
    if (request.method == "GET") {
      curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    } else {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }
    if (!request.body.empty()) {
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.body.data());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &exchange);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &exchange);
    SetTls(c);
    if (exchange.on_data != nullptr) {
      // A watch is quiet for minutes: keep-alives find a peer that went away (a reset API
      // server, a dropped NAT entry) within about a minute.
      curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
      curl_easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 30L);
      curl_easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 10L);
    }
    if (exchange.cancelled != nullptr && *exchange.cancelled) {
      curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, OnProgress);
      curl_easy_setopt(c, CURLOPT_XFERINFODATA, &exchange);
    }

    const CURLcode code = curl_easy_perform(c);
    // The handle goes back to the pool with its connection either way; curl closes a
    // connection that cannot be reused (an error, "Connection: close").
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
    if (code != CURLE_OK) {
      absl::Status s = MapCurlError(code, detail, exchange);
      Give(std::move(h));
      return s;
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    exchange.response.status = static_cast<int>(status);
    const char* content_type = nullptr;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &content_type);
    if (content_type != nullptr) exchange.response.content_type = content_type;
    Give(std::move(h));
    return std::move(exchange.response);
  }


  void SetTls(CURL* c) {
    if (config_.insecure_skip_tls_verify) {
      curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    // Files are named rather than read here so that curl reads them at each exchange: a
    // rotated CA or client certificate is used from the next request on.
    // A configured CA is the only one trusted: curl's built-in bundle and directory (the system's
    // CAs, which any public certificate chains to) are cleared, as kubectl trusts only it.
    if (!config_.ca_data.empty()) {
      curl_easy_setopt(c, CURLOPT_CAINFO, nullptr);
      curl_easy_setopt(c, CURLOPT_CAPATH, nullptr);
      curl_blob blob{const_cast<char*>(config_.ca_data.data()), config_.ca_data.size(),
                     CURL_BLOB_COPY};
      curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &blob);
    } else if (!config_.ca_file.empty()) {
      curl_easy_setopt(c, CURLOPT_CAPATH, nullptr);
      curl_easy_setopt(c, CURLOPT_CAINFO, config_.ca_file.c_str());
    }
    if (!config_.client_cert_data.empty()) {
      curl_blob blob{const_cast<char*>(config_.client_cert_data.data()),
                     config_.client_cert_data.size(), CURL_BLOB_COPY};
      curl_easy_setopt(c, CURLOPT_SSLCERT_BLOB, &blob);
    } else if (!config_.client_cert_file.empty()) {
      curl_easy_setopt(c, CURLOPT_SSLCERT, config_.client_cert_file.c_str());
    }
    if (!config_.client_key_data.empty()) {
      curl_blob blob{const_cast<char*>(config_.client_key_data.data()),
                     config_.client_key_data.size(), CURL_BLOB_COPY};
      curl_easy_setopt(c, CURLOPT_SSLKEY_BLOB, &blob);
    } else if (!config_.client_key_file.empty()) {
      curl_easy_setopt(c, CURLOPT_SSLKEY, config_.client_key_file.c_str());
    }
  }

  // (the URL with tls_server_name as its host, "name:port:host:port" for CURLOPT_CONNECT_TO).
  absl::StatusOr<std::pair<std::string, std::string>> MapServerName(const std::string& url) {
    CurlPtr<CURLU> u(curl_url());
    if (!u) return absl::ResourceExhaustedError("curl_url failed");
    if (curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) {
      return absl::InvalidArgumentError(absl::StrCat("bad URL ", url));
    }
    char* host_raw = nullptr;
    char* port_raw = nullptr;
    if (curl_url_get(u.get(), CURLUPART_HOST, &host_raw, 0) != CURLUE_OK ||
        curl_url_get(u.get(), CURLUPART_PORT, &port_raw, CURLU_DEFAULT_PORT) != CURLUE_OK) {
      curl_free(host_raw);
      return absl::InvalidArgumentError(absl::StrCat("no host or port in ", url));
    }
    CurlPtr<char> host(host_raw), port(port_raw);
    if (curl_url_set(u.get(), CURLUPART_HOST, config_.tls_server_name.c_str(), 0) != CURLUE_OK) {
      return absl::InvalidArgumentError(
          absl::StrCat("tls-server-name \"", config_.tls_server_name, "\" is not a host name"));
    }
    char* mapped_raw = nullptr;
    if (curl_url_get(u.get(), CURLUPART_URL, &mapped_raw, 0) != CURLUE_OK) {
      return absl::InvalidArgumentError(absl::StrCat("bad URL ", url));
    }
    CurlPtr<char> mapped(mapped_raw);
    return std::pair{std::string(mapped.get()),
                     absl::StrCat(config_.tls_server_name, ":", port.get(), ":", host.get(), ":",
                                  port.get())};
  }

  const Config config_;
  const std::string init_error_;
  absl::Mutex mu_;
  std::vector<CURL*> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Transport> NewCurlTransport(const Config& config) {
  // curl_global_init is not thread-safe and must run once before any handle; the result is
  // kept so that every exchange reports a failed initialisation.
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  std::string init_error;
  if (init != CURLE_OK) init_error = absl::StrCat("curl_global_init: ", curl_easy_strerror(init));
  return std::make_unique<CurlTransport>(config, std::move(init_error));
}

}  // namespace rdp::kube
