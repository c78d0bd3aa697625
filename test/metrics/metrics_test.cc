// The Prometheus exposition (metrics/metrics.h) and the HTTP endpoint (metrics/http_server.h),
// fetched with libcurl as a scraper does.

#include <atomic>
#include <string>
#include <vector>

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

// --- The exposition format ---

TEST(ExpositionTest, FamiliesSamplesAndEscaping) {
  Exposition out;
  out.Family("x_total", "Help with a \\ and a\nnewline.", Exposition::Type::kCounter);
  out.Sample({{"a", "plain"}, {"b", "q\"uote\\back\nline"}}, 3);
  out.Sample({}, 0.25);
  out.Family("y", "A gauge.", Exposition::Type::kInfo);
  out.Sample({{"k", ""}}, 1);
  EXPECT_EQ(out.text(),
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
  EXPECT_EQ(out.text(),
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
  EXPECT_TRUE(HasLine(out.text(), "e_seconds_bucket{le=\"1\"} 0"));
  EXPECT_TRUE(HasLine(out.text(), "e_seconds_bucket{le=\"+Inf\"} 0"));
  EXPECT_TRUE(HasLine(out.text(), "e_seconds_sum 0"));
  EXPECT_TRUE(HasLine(out.text(), "e_seconds_count 0"));
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
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));
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

}  // namespace
}  // namespace rdp::metrics
