#include "metrics/http_server.h"

#include <arpa/inet.h>

#include <cstring>
#include <exception>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "civetweb.h"
#include "metrics/metrics.h"

namespace rdp::metrics {
namespace {

constexpr char kFlag[] = "--metrics-address";
// The longest request head a client may send (a scrape's is a few hundred bytes).
constexpr char kMaxRequestBytes[] = "4096";
// Accepted connections waiting for a thread; more are refused by the kernel.
constexpr char kQueue[] = "16";

absl::Status Bad(std::string_view address, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(kFlag, " '", std::string(address), "': ", std::string(why)));
}

std::shared_ptr<spdlog::logger> Log() { return rdp::Logger("server"); }

void InitLibrary() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

bool IsGet(struct mg_connection* conn) {
  const struct mg_request_info* info = mg_get_request_info(conn);
  return info && info->request_method &&
         (std::strcmp(info->request_method, "GET") == 0 ||
          std::strcmp(info->request_method, "HEAD") == 0);
}

int Reply(struct mg_connection* conn, int code, const char* type, const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            code, mg_get_response_code_text(conn, code), type, body.size());
  const struct mg_request_info* info = mg_get_request_info(conn);
  if (!(info && info->request_method && std::strcmp(info->request_method, "HEAD") == 0)) {
    mg_write(conn, body.data(), body.size());
  }
  return code;
}

int LogMessage(const struct mg_connection*, const char* message) {
  Log()->debug("metrics http: {}", message);
  return 1;  // not civetweb's own log
}

}  // namespace

absl::StatusOr<std::string> ParseListenAddress(std::string_view address) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return Bad(address, "not HOST:PORT");
  std::string_view host = address.substr(0, colon);
  const std::string_view port_text = address.substr(colon + 1);
  int port = -1;
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != std::string_view::npos ||
      !absl::SimpleAtoi(std::string(port_text), &port) || port > 65535) {
    return Bad(address, "the port is not a number from 0 to 65535");
  }
  if (host.empty()) return std::to_string(port);  // every IPv4 interface
  if (host == "localhost") host = "127.0.0.1";
  const std::string h(host);
  if (host.front() == '[' && host.back() == ']') {
    struct in6_addr v6;
    if (::inet_pton(AF_INET6, h.substr(1, h.size() - 2).c_str(), &v6) != 1) {
      return Bad(address, "not an IPv6 address in brackets");
    }
    if (!mg_check_feature(MG_FEATURES_IPV6)) {
      return Bad(address, "this build's HTTP server has no IPv6");
    }
    return absl::StrCat(h, ":", port);
  }
  struct in_addr v4;
  if (::inet_pton(AF_INET, h.c_str(), &v4) != 1) {
    return Bad(address, "the host is not an IPv4 address, [IPv6], localhost or empty");
  }
  return absl::StrCat(h, ":", port);
}

absl::StatusOr<std::string> ParseAccessList(const std::vector<std::string>& allow) {
  if (allow.empty()) return std::string();
  std::string acl = "-0.0.0.0/0";
  for (const std::string& entry : allow) {
    const std::size_t slash = entry.find('/');
    const std::string ip = entry.substr(0, slash);
    struct in_addr v4;
    int bits = 32;
    if (::inet_pton(AF_INET, ip.c_str(), &v4) != 1 ||
        (slash != std::string::npos &&
         (entry.size() == slash + 1 ||
          entry.find_first_not_of("0123456789", slash + 1) != std::string::npos ||
          !absl::SimpleAtoi(entry.substr(slash + 1), &bits) || bits > 32))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics-allow '", entry, "': not an IPv4 address or CIDR such as 10.0.0.0/8"));
    }
    absl::StrAppend(&acl, ",+", ip, "/", bits);
  }
  return acl;
}

absl::Status Validate(const HttpOptions& options) {
  if (auto ports = ParseListenAddress(options.address); !ports.ok()) return ports.status();
  if (auto acl = ParseAccessList(options.allow); !acl.ok()) return acl.status();
  if (options.threads < 1 || options.threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-threads '", options.threads, "': must be from 1 to 64"));
  }
  if (options.request_timeout < absl::Milliseconds(100) ||
      options.request_timeout > absl::Minutes(5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-request-timeout '", absl::FormatDuration(options.request_timeout),
                     "': must be from 100ms to 5m"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    std::string_view address, Render render, Health health) {
  HttpOptions options;
  options.address = std::string(address);
  return Start(options, std::move(render), Checks{std::move(health), nullptr, nullptr});
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const HttpOptions& options, Render render, Checks checks) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  const std::string_view address = options.address;
  const absl::StatusOr<std::string> ports = ParseListenAddress(address);
  const absl::StatusOr<std::string> acl = ParseAccessList(options.allow);
  const std::string threads = std::to_string(options.threads);
  const std::string timeout_ms = std::to_string(absl::ToInt64Milliseconds(options.request_timeout));
  InitLibrary();
  std::string host = "0.0.0.0";
  if (const std::size_t colon = ports->rfind(':'); colon != std::string::npos) {
    host = ports->substr(0, colon);
  }
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(std::move(render), std::move(checks), host));
  std::vector<const char*> civet = {"listening_ports",    ports->c_str(),
                                    "num_threads",        threads.c_str(),
                                    "request_timeout_ms", timeout_ms.c_str(),
                                    "max_request_size",   kMaxRequestBytes,
                                    "connection_queue",   kQueue,
                                    "enable_keep_alive",  "no"};
  if (!acl->empty()) {
    civet.push_back("access_control_list");
    civet.push_back(acl->c_str());
  }
  civet.push_back(nullptr);
  struct mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof callbacks);
  callbacks.log_message = LogMessage;
  callbacks.begin_request = &MetricsHttpServer::Route;  // routes exist before the port listens
  struct mg_init_data init;
  std::memset(&init, 0, sizeof init);
  init.callbacks = &callbacks;
  init.user_data = server.get();
  init.configuration_options = civet.data();
  struct mg_error_data error;
  char text[256] = {};
  std::memset(&error, 0, sizeof error);
  error.text = text;
  error.text_buffer_size = sizeof text;
  server->context_ = mg_start2(&init, &error);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(kFlag, " '", std::string(address), "': cannot listen: ", text[0] ? text : "unknown error"));
  }
  struct mg_server_port bound[4];
  std::memset(bound, 0, sizeof bound);
  const int n = mg_get_server_ports(server->context_, 4, bound);
  if (n < 1 || bound[0].port <= 0) {
    return absl::UnavailableError(
        absl::StrCat(kFlag, " '", std::string(address), "': listening, but on no port civetweb reports"));
  }
  server->port_ = bound[0].port;
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (context_) mg_stop(context_);
}

int MetricsHttpServer::Route(struct mg_connection* conn) {
  const struct mg_request_info* info = mg_get_request_info(conn);
  const auto* self = static_cast<const MetricsHttpServer*>(mg_get_user_data(mg_get_context(conn)));
  if (info == nullptr || info->local_uri == nullptr || self == nullptr) return 0;
  if (std::strcmp(info->local_uri, "/metrics") == 0) return self->HandleMetrics(conn);
  const char* uri = info->local_uri;
  if (std::strcmp(uri, "/healthz") == 0) return HandleCheck(conn, uri, self->checks_.healthz, 200);
  if (std::strcmp(uri, "/livez") == 0) return HandleCheck(conn, uri, self->checks_.livez, 404);
  if (std::strcmp(uri, "/readyz") == 0) return HandleCheck(conn, uri, self->checks_.readyz, 404);
  return Reply(conn, 404, "text/plain", "GET /metrics or /healthz\n");
}

int MetricsHttpServer::HandleMetrics(struct mg_connection* conn) const {
  if (!IsGet(conn)) return Reply(conn, 405, "text/plain", "GET /metrics\n");
  std::string body;
  try {
    body = render_();
  } catch (const std::exception& e) {
    Log()->error("metrics: rendering a scrape failed: {}", e.what());
    return Reply(conn, 500, "text/plain", "rendering the metrics failed\n");
  }
  return Reply(conn, 200, kExpositionContentType, body);
}

int MetricsHttpServer::HandleCheck(struct mg_connection* conn, const char* route,
                                   const Health& check, int absent) {
  if (!check && absent == 404) {
    return Reply(conn, 404, "text/plain", absl::StrCat(route, ": not served by this door\n"));
  }
  if (!IsGet(conn)) return Reply(conn, 405, "text/plain", absl::StrCat("GET ", route, "\n"));
  absl::Status status;
  try {
    if (check) status = check();
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("checking ", route, " failed: ", e.what()));
  }
  if (!status.ok()) return Reply(conn, 503, "text/plain", std::string(status.message()) + "\n");
  return Reply(conn, 200, "text/plain", "ok\n");
}

}  // namespace rdp::metrics
