// A real Prometheus (Debian's prometheus package, scripts/install-deps.sh) scrapes the built
// plugin serving a fixture node, and the per-pod traffic join that docs/metrics.md gives
// operators, asked through Prometheus' HTTP API, names the pods that hold HCAs and the bytes
// their HCAs received. Slow (ctest label slow): Prometheus takes a few seconds to start.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kube/client.h"
#include "nlohmann/json.hpp"
#include "test/deviceplugin/test_node.h"
#include "test/support/child.h"
#include "test/support/http_get.h"
#include "test/support/temp_dir.h"

namespace rdp::deviceplugin {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr absl::Duration kWait = absl::Seconds(20);
constexpr absl::Duration kScrapeWait = absl::Seconds(90);

// GET url -> body, or "" when it failed or was not a 200.
std::string Get(const std::string& url) {
  rdp::testing::HttpResponse r = rdp::testing::HttpGet(url, absl::Seconds(5));
  return r.code == 200 ? r.body : "";
}

// A TCP port free now on 127.0.0.1 (Prometheus cannot report an ephemeral port of its own).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// An instant query's vector result as {label value of `by`: value}; empty until Prometheus
// answers with data.
std::map<std::string, double> Query(const std::string& api, const std::string& promql,
                                    const std::string& by) {
  std::map<std::string, double> out;
  const std::string body = Get(api + "/api/v1/query?query=" + kube::PercentEncode(promql));
  if (body.empty()) return out;
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return out;
  for (const auto& r : j["data"]["result"]) {
    out[r["metric"].value(by, "")] = std::stod(r["value"][1].get<std::string>());
  }
  return out;
}

TEST(PrometheusTest, ScrapesThePluginAndJoinsTrafficToPods) {
  ASSERT_EQ(::access(kPrometheus, X_OK), 0)
      << kPrometheus << " is missing: scripts/install-deps.sh installs Debian's prometheus";
  testing::TestNode node;
  const Config config = node.MakeConfig(hca::Mode::kExclusive);
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  const std::string socket = node.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  // The fixture's counters (sim/sysfs_fixture.h): mlx5_0 received 1000001 words, mlx5_1
  // 2000001, mlx5_2 3000001.
  pods.Set({{"team-a/train-0/main", {{"rdma/hca", {"0000:3a:00.0", "0000:9a:00.0"}}}},
            {"team-b/train-1/main", {{"rdma/hca", {"0000:1a:00.0"}}}}});
  ASSERT_TRUE(pods.Start().ok());
  rdp::testing::Child plugin(
      rdp::testing::PluginBinary(),
      {"--mode", "exclusive", "--sysfs-root", config.discovery.sysfs_root, "--dev-root",
       config.discovery.dev_root, "--kubelet-dir", config.kubelet_dir, "--pod-resources-socket",
       socket, "--metrics-address", "127.0.0.1:0"});
  ASSERT_TRUE(plugin.WaitForOutput("metrics: serving on 127.0.0.1:", kWait));
  const std::string out = plugin.output();
  const std::size_t at = out.find("metrics: serving on ") + 20;
  const std::string target = out.substr(at, out.find_first_of("\r\n", at) - at);

  const int web_port = FreePort();
  ASSERT_GT(web_port, 0);
  const std::string config_file = node.dir().Sub("prometheus.yml");
  std::ofstream(config_file) << "global:\n"
                                "  scrape_interval: 1s\n"
                                "  evaluation_interval: 1s\n"
                                "scrape_configs:\n"
                                "  - job_name: rdma-device-plugin\n"
                                "    static_configs:\n"
                                "      - targets: ['"
                             << target << "']\n";
  const std::string web = "127.0.0.1:" + std::to_string(web_port);
  rdp::testing::Child prometheus(
      kPrometheus, {"--config.file=" + config_file, "--storage.tsdb.path=" + node.dir().Sub("tsdb"),
                    "--web.listen-address=" + web, "--log.level=warn"});
  ASSERT_TRUE(prometheus.running());
  const std::string api = "http://" + web;

  // Polled with a deadline: Prometheus starts, scrapes every second, and the join answers once
  // a scrape with both families is in.
  const std::string join =
      "sum by (pod) (rdma_device_plugin_hca_allocated * on(hca) group_left "
      "sum by (hca) (rdma_device_plugin_port_data_received_bytes_total))";
  std::map<std::string, double> traffic;
  const absl::Time deadline = absl::Now() + kScrapeWait;
  while (traffic.size() < 2 && absl::Now() < deadline && !prometheus.Exited()) {
    traffic = Query(api, join, "pod");
    if (traffic.size() < 2) absl::SleepFor(absl::Milliseconds(250));  // the next poll
  }
  ASSERT_EQ(traffic.size(), 2u) << prometheus.output();
  EXPECT_EQ(traffic["train-0"], (2000001.0 + 3000001.0) * 4);
  EXPECT_EQ(traffic["train-1"], 1000001.0 * 4);
  // The scrape itself is healthy (up == 1) and every HCA is healthy.
  EXPECT_EQ(Query(api, "up{job=\"rdma-device-plugin\"}", "job")["rdma-device-plugin"], 1);
  EXPECT_EQ(Query(api, "count(rdma_device_plugin_hca_healthy == 1)", "")[""], 4);

  // The three queries of docs/metrics.md are valid PromQL (Prometheus answers "success").
  for (const char* doc_query :
       {"sum by (namespace, pod) (rdma_device_plugin_hca_allocated * on (instance, hca) "
        "group_left sum by (instance, hca) "
        "(rate(rdma_device_plugin_port_data_received_bytes_total[5m])))",
        "rdma_device_plugin_hca_healthy == 0",
        "sum(increase(rdma_device_plugin_allocation_alignment_total{path_class=~\"PHB|NODE|SYS\"}"
        "[1d])) / sum(increase(rdma_device_plugin_allocation_alignment_total"
        "{path_class!=\"unknown\"}[1d]))"}) {
    const nlohmann::json answer = nlohmann::json::parse(
        Get(api + "/api/v1/query?query=" + kube::PercentEncode(doc_query)), nullptr, false);
    EXPECT_TRUE(!answer.is_discarded() && answer.value("status", "") == "success") << doc_query;
  }

  prometheus.Signal(SIGTERM);
  EXPECT_EQ(prometheus.Wait(kWait), 0);
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(kWait), 0);
}

}  // namespace
}  // namespace rdp::deviceplugin
