// The libcurl Transport against local sockets: a one-shot HTTP responder, a port that refuses,
// a listener that never answers.

#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kube/client.h"
#include "kube/transport.h"
#include "test/kube/closed_port.h"

namespace rdp::kube {
namespace {

using ::rdp::kube::testing::ClosedPort;
using ::rdp::kube::testing::SilentListener;
using ::testing::AnyOf;
using ::testing::HasSubstr;

// Accepts one connection on `listener`, reads one request (headers and Content-Length bytes of
// body) into `request`, writes `response` and closes.
std::thread AnswerOnce(const SilentListener& listener, std::string response, std::string* request) {
  return std::thread([fd = listener.fd(), response = std::move(response), request] {
    const int conn = accept(fd, nullptr, nullptr);
    if (conn < 0) return;
    char buf[4096];
    std::size_t want = std::string::npos;
    while (request->size() < want) {
      const ssize_t n = read(conn, buf, sizeof(buf));
      if (n <= 0) break;
      request->append(buf, static_cast<std::size_t>(n));
      const std::size_t end = request->find("\r\n\r\n");
      if (end != std::string::npos && want == std::string::npos) {
        std::size_t length = 0;
        const std::size_t at = request->find("Content-Length: ");
        if (at != std::string::npos && at < end) length = std::stoul(request->substr(at + 16));
        want = end + 4 + length;
      }
    }
    for (std::size_t sent = 0; sent < response.size();) {
      const ssize_t n = write(conn, response.data() + sent, response.size() - sent);
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
    close(conn);
  });
}

TEST(KubeCurlTransportTest, OneExchangeWithHeadersBodyAndRetryAfter) {
  SilentListener listener;
  ASSERT_NE(listener.port(), 0);
  const std::string body = R"({"kind":"Status","reason":"TooManyRequests"})";
  std::string request;
  std::thread server = AnswerOnce(
      listener,
      "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Type: application/json\r\n"
      "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body,
      &request);
  Config config;
  config.server = "http://127.0.0.1:" + std::to_string(listener.port());
  auto transport = NewCurlTransport(config);
  HttpRequest out;
  out.method = "PUT";
  out.url = config.server + "/apis/x/y";
  out.headers = {"Authorization: Bearer abc", "Content-Type: application/json"};
  out.body = R"({"a":1})";
  out.timeout = absl::Seconds(10);
  auto response = transport->RoundTrip(out);
  server.join();
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 429);
  EXPECT_EQ(response->body, body);
  ASSERT_TRUE(response->retry_after.has_value());
  EXPECT_EQ(*response->retry_after, absl::Seconds(7));
  EXPECT_EQ(response->content_type, "application/json");
  EXPECT_THAT(request, HasSubstr("PUT /apis/x/y HTTP/1.1\r\n"));
  EXPECT_THAT(request, HasSubstr("Authorization: Bearer abc\r\n"));
  EXPECT_THAT(request, HasSubstr("\r\n\r\n{\"a\":1}"));
}

TEST(KubeCurlTransportTest, ClosedPortIsUnavailableWithinTheDeadline) {
  const int port = ClosedPort();
  ASSERT_NE(port, 0);
  Config config;
  config.server = "https://127.0.0.1:" + std::to_string(port);
  config.token = "x";
  Client client(config, NewCurlTransport(config));
  const absl::Time start = absl::Now();
  auto r = client.Get("/api/v1/nodes/n", start + absl::Milliseconds(1500));
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(r.status().code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("GET /api/v1/nodes/n"));
  EXPECT_LE(took, absl::Milliseconds(2500)) << "retries stay inside the deadline";
}

TEST(KubeCurlTransportTest, ServerThatNeverAnswersIsDeadlineExceededAtTheDeadline) {
  SilentListener listener;  // connections complete in the backlog; no TLS handshake ever comes
  ASSERT_NE(listener.port(), 0);
  Config config;
  config.server = "https://127.0.0.1:" + std::to_string(listener.port());
  Client client(config, NewCurlTransport(config));
  const absl::Time start = absl::Now();
  auto r = client.Get("/api/v1/nodes/n", start + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LE(took, absl::Seconds(2));
}

TEST(KubeCurlTransportTest, TlsServerNameStillConnectsToTheUrlsAddress) {
  // The certificate check itself is DRAKubeClientLiveTest's (a real server's certificate); here
  // the mapping alone: the URL is addressed to tls-server-name, which must not be resolved, and
  // the connection goes to the URL's address (refused there).
  const int port = ClosedPort();
  ASSERT_NE(port, 0);
  Config config;
  config.server = "https://127.0.0.1:" + std::to_string(port);
  config.tls_server_name = "kubernetes.default.svc";
  auto transport = NewCurlTransport(config);
  HttpRequest request;
  request.method = "GET";
  request.url = config.server + "/version";
  request.timeout = absl::Seconds(2);
  auto r = transport->RoundTrip(request);
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), ::testing::Not(HasSubstr("resolve")))
      << "connected to 127.0.0.1";
}

}  // namespace
}  // namespace rdp::kube
