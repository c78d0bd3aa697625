// The Prometheus exposition (metrics/metrics.h) and the HTTP endpoint (metrics/http_server.h),
// fetched with libcurl as a scraper does.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/http_server.h"
#include "metrics/metrics.h"
#include "test/support/http_get.h"

namespace rdp::metrics {
namespace {

using ::testing::HasSubstr;
using rdp::testing::HasLine;
using rdp::testing::Lines;
using rdp::testing::HttpGet;

// The port of a "127.0.0.1:PORT" address; 0 when it is not one.
int LoopbackPort(const std::string& address) {
  constexpr std::string_view kHost = "127.0.0.1:";
  int port = 0;
  if (address.rfind(kHost, 0) != 0 || !absl::SimpleAtoi(address.substr(kHost.size()), &port)) {
    return 0;
  }
  return port;
}

// --- The exposition format ---

TEST(ExpositionTest, FamiliesSamplesAndEscaping) {
  Exposition out;
  out.Family("x_total", "Help with a \\ and a\nnewline.", Exposition::Type::kCounter);
  out.Sample({{"a", "plain"}, {"b", "q\"uote\\back\nline"}}, 3);
  out.Sample({}, 0.25);
  out.Family("y", "A gauge.", Exposition::Type::kInfo);
  out.Sample({{"k", ""}}, 1);
  EXPECT_EQ(out.Take(),
            "# HELP x_total Help with a \\\\ and a\\nnewline.\n"
            "# TYPE x_total counter\n"
            "x_total{a=\"plain\",b=\"q\\\"uote\\\\back\\nline\"} 3\n"
            "x_total 0.25\n"
            "# HELP y A gauge.\n"
            "# TYPE y gauge\n"
            "y{k=\"\"} 1\n");
}

TEST(ExpositionTest, Values) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(4000004), "4000004");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatValue(0.0001), "0.0001");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
}

TEST(ExpositionTest, HistogramIsCumulativeWithInf) {
  Histogram h({0.001, 0.01});
  h.Observe(absl::Microseconds(500));  // <= 0.001
  h.Observe(absl::Milliseconds(1));    // == 0.001: counted in le="0.001"
  h.Observe(absl::Milliseconds(5));    // <= 0.01
  h.Observe(absl::Seconds(2));         // +Inf only
  Exposition out;
  out.Family("d_seconds", "Durations.", Exposition::Type::kHistogram);
  out.HistogramSamples({{"method", "Allocate"}}, h.Read());
  EXPECT_EQ(out.Take(),
            "# HELP d_seconds Durations.\n"
            "# TYPE d_seconds histogram\n"
            "d_seconds_bucket{method=\"Allocate\",le=\"0.001\"} 2\n"
            "d_seconds_bucket{method=\"Allocate\",le=\"0.01\"} 3\n"
            "d_seconds_bucket{method=\"Allocate\",le=\"+Inf\"} 4\n"
            "d_seconds_sum{method=\"Allocate\"} 2.0065\n"
            "d_seconds_count{method=\"Allocate\"} 4\n");
}

TEST(ExpositionTest, EmptyHistogramHasZeroSeries) {
  Histogram h({1});
  Exposition out;
  out.Family("e_seconds", "E.", Exposition::Type::kHistogram);
  out.HistogramSamples({}, h.Read());
  const std::string text = out.Take();
  EXPECT_TRUE(HasLine(text, "e_seconds_bucket{le=\"1\"} 0"));
  EXPECT_TRUE(HasLine(text, "e_seconds_bucket{le=\"+Inf\"} 0"));
  EXPECT_TRUE(HasLine(text, "e_seconds_sum 0"));
  EXPECT_TRUE(HasLine(text, "e_seconds_count 0"));
}

// --- The HTTP endpoint ---

TEST(MetricsHttpTest, ParsesAddresses) {
  EXPECT_EQ(*ParseListenAddress(":9402"), "9402");
  EXPECT_EQ(*ParseListenAddress("127.0.0.1:0"), "127.0.0.1:0");
  EXPECT_EQ(*ParseListenAddress("localhost:9402"), "127.0.0.1:9402");
  EXPECT_EQ(*ParseListenAddress("0.0.0.0:9402"), "0.0.0.0:9402");
  for (const char* bad : {"9402", "host:9402", "1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:-1",
                          "1.2.3.4:9x", "[zz]:1", "1.2.3:80"}) {
    absl::StatusOr<std::string> parsed = ParseListenAddress(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("--metrics-address")) << bad;
  }
}

TEST(MetricsHttpTest, ServesMetricsAndHealthzOnAnEphemeralPort) {
  std::atomic<int> renders{0};
  auto server = MetricsHttpServer::Start("127.0.0.1:0", [&renders] {
    ++renders;
    return std::string("# HELP a_total A.\n# TYPE a_total counter\na_total 1\n");
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = LoopbackPort((*server)->address());
  ASSERT_GT(port, 0) << (*server)->address();
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string(port));
  const std::string base = "http://" + (*server)->address();
  rdp::testing::HttpResponse scrape = HttpGet(base + "/metrics");
  EXPECT_EQ(scrape.code, 200);
  EXPECT_EQ(scrape.body, "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n");
  EXPECT_EQ(scrape.content_type, kExpositionContentType);
  EXPECT_EQ(renders.load(), 1);
  rdp::testing::HttpResponse health = HttpGet(base + "/healthz");
  EXPECT_EQ(health.code, 200);
  EXPECT_EQ(health.body, "ok\n");
  EXPECT_EQ(HttpGet(base + "/other").code, 404);
  EXPECT_EQ(HttpGet(base + "/metrics/x").code, 404);

  // The port is taken now: a second server there cannot listen, and says which flag.
  auto clash = MetricsHttpServer::Start((*server)->address(), [] { return std::string(); });
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(std::string(clash.status().message()), HasSubstr("--metrics-address"));
}

// /livez and /readyz answer what the door's checks say, each its own, and are not served
// where the door gives none: the kubelet's httpGet probes read them.
TEST(MetricsHttpTest, TheProbeRoutesAnswerTheirOwnChecks) {
  HttpOptions options;
  options.address = "127.0.0.1:0";
  std::atomic<bool> ready{false};
  MetricsHttpServer::Checks checks;
  checks.livez = [] { return absl::OkStatus(); };
  checks.readyz = [&ready] {
    return ready ? absl::OkStatus() : absl::UnavailableError("the kubelet has not registered us");
  };
  auto server = MetricsHttpServer::Start(options, [] { return std::string(); }, checks);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string base = "http://" + (*server)->address();
  EXPECT_EQ(HttpGet(base + "/livez").code, 200);
  rdp::testing::HttpResponse not_ready = HttpGet(base + "/readyz");
  EXPECT_EQ(not_ready.code, 503);
  EXPECT_EQ(not_ready.body, "the kubelet has not registered us\n");
  ready = true;
  EXPECT_EQ(HttpGet(base + "/readyz").code, 200);
  EXPECT_EQ(HttpGet(base + "/healthz").code, 200);  // no healthz check: always ok

  auto bare = MetricsHttpServer::Start(options, [] { return std::string(); });
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(HttpGet("http://" + (*bare)->address() + "/livez").code, 404);
  EXPECT_EQ(HttpGet("http://" + (*bare)->address() + "/readyz").code, 404);
}

TEST(MetricsHttpTest, ParsesAccessLists) {
  EXPECT_EQ(*ParseAccessList({}), "");
  EXPECT_EQ(*ParseAccessList({"10.0.0.0/8", "192.168.1.7"}),
            "-0.0.0.0/0,+10.0.0.0/8,+192.168.1.7/32");
  for (const std::string bad : {"10.0.0.0/", "10.0.0.0/40", "10.0.0/8", "pods", "::1", "1.2.3.4/x"}) {
    auto parsed = ParseAccessList({bad});
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("--metrics-allow '" + bad));
  }
}

// Only the clients the access list names are served; others are refused before any handler
// runs (no render).
TEST(MetricsHttpTest, TheAccessListRefusesOtherClients) {
  std::atomic<int> renders{0};
  auto render = [&renders] {
    ++renders;
    return std::string("a 1\n");
  };
  HttpOptions others;
  others.address = "127.0.0.1:0";
  others.allow = {"10.0.0.0/8"};
  auto refused = MetricsHttpServer::Start(others, render);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_NE(HttpGet("http://" + (*refused)->address() + "/metrics").code, 200);
  EXPECT_EQ(renders.load(), 0);
  HttpOptions local = others;
  local.allow = {"10.0.0.0/8", "127.0.0.0/8"};
  auto served = MetricsHttpServer::Start(local, render);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(HttpGet("http://" + (*served)->address() + "/metrics").code, 200);
  EXPECT_EQ(renders.load(), 1);
}

// Silent clients (connected, sending nothing) hold a thread only until the request timeout: with
// every thread taken by one, a scrape is still answered. Before, four silent clients held the
// four threads for 5 s each, and a client that kept reconnecting held them for ever.
TEST(MetricsHttpTest, SilentClientsDoNotStarveScrapes) {
  HttpOptions options;
  options.address = "127.0.0.1:0";
  options.threads = 2;
  options.request_timeout = absl::Milliseconds(200);
  auto server = MetricsHttpServer::Start(options, [] { return std::string("a 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> silent;
  for (int i = 0; i < options.threads; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(LoopbackPort((*server)->address())));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof addr), 0);
    silent.push_back(fd);
  }
  EXPECT_EQ(HttpGet("http://" + (*server)->address() + "/metrics", absl::Seconds(10)).code, 200);
  for (int fd : silent) ::close(fd);
}

TEST(MetricsHttpTest, BadOptionsNameTheirFlag) {
  HttpOptions o;
  o.address = "127.0.0.1:0";
  o.threads = 0;
  EXPECT_THAT(std::string(Validate(o).message()), HasSubstr("--metrics-threads"));
  o.threads = 4;
  o.request_timeout = absl::Milliseconds(1);
  EXPECT_THAT(std::string(Validate(o).message()), HasSubstr("--metrics-request-timeout"));
  o.request_timeout = absl::Seconds(2);
  o.allow = {"x"};
  EXPECT_THAT(std::string(Validate(o).message()), HasSubstr("--metrics-allow"));
}

}  // namespace
}  // namespace rdp::metrics
