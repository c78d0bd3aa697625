// The metrics endpoint of the serving subcommands (cmd/run_server.h, cmd/metrics_flags.h) in the
// built binary: what a scrape returns once the kubelet has made its calls, /healthz, and the
// flags' failures, each exiting 2 before anything registers. (What the families hold:
// test/deviceplugin/metrics_test.cc, test/metrics.)

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/child.h"
#include "sim/fake_pod_resources.h"
#include "sim/kubelet_sim.h"
#include "test/support/child.h"
#include "test/support/http_get.h"
#include "test/support/temp_dir.h"
#include "test/support/test_node.h"

namespace rdp::cmd {
namespace {

using ::testing::HasSubstr;
using rdp::testing::HasLine;
using sim::FakePodResources;
using sim::KubeletSim;
using sim::PreferredRequest;

constexpr absl::Duration kWait = absl::Seconds(10);

TEST(MetricsBinaryTest, ServesTheNodeOnAnEphemeralPort) {
  rdp::testing::TestNode node;
  const std::string kubelet_dir = node.dir().Sub("dp");
  KubeletSim kubelet(kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  const std::string socket = node.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  pods.Set({{"team-a/train-0/main", {{"rdma/hca", {"0000:3a:00.0"}}}}});
  ASSERT_TRUE(pods.Start().ok());
  rdp::testing::Child::Options options;
  options.env["RDP_METRICS_ADDRESS"] = "127.0.0.1:0";  // the flag's environment variable
  rdp::testing::Child plugin(
      testing::PluginBinary(),
      {"--mode", "exclusive", "--sysfs-root", node.root(), "--dev-root", node.root(),
       "--kubelet-dir", kubelet_dir, "--health-interval", "100ms", "--pod-resources-socket", socket},
      options);
  ASSERT_TRUE(plugin.running());
  const std::string address = sim::WaitForMetricsAddress(plugin, kWait);
  ASSERT_TRUE(absl::StartsWith(address, "127.0.0.1:")) << plugin.output();
  ASSERT_TRUE(kubelet.WaitForRegistration(0, kWait).has_value());
  // The kubelet has the registration before the plugin has its answer and counts it: the log
  // line follows the count.
  ASSERT_TRUE(plugin.WaitForOutput("Registered device plugin with Kubelet", kWait));
  // A GetPreferredAllocation and an Allocate, so that their latencies are measured.
  auto stub = kubelet.PluginStub();
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    v1beta1::PreferredAllocationResponse response;
    ASSERT_TRUE(stub->GetPreferredAllocation(
                        &context, PreferredRequest({"0000:1a:00.0", "0000:9a:00.0"}, {}, 1),
                        &response)
                    .ok());
  }
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    v1beta1::AllocateRequest request;
    request.add_container_requests()->add_devices_ids("0000:1a:00.0");
    v1beta1::AllocateResponse response;
    ASSERT_TRUE(stub->Allocate(&context, request, &response).ok());
  }

  const rdp::testing::HttpResponse scrape = rdp::testing::HttpGet("http://" + address + "/metrics");
  ASSERT_EQ(scrape.code, 200);
  const std::string& text = scrape.body;
  EXPECT_TRUE(HasLine(text, "rdma_device_plugin_registrations_total{resource=\"rdma/hca\"} 1")) << text;
  EXPECT_TRUE(HasLine(text, "rdma_device_plugin_build_info{version=\"" RDP_VERSION
                            "\",subcommand=\"serve\"} 1"));
  // Error series exist from the start, at zero.
  EXPECT_TRUE(HasLine(
      text,
      "rdma_device_plugin_rpc_errors_total{resource=\"rdma/hca\","
      "method=\"Allocate\",code=\"UNAVAILABLE\"} 0"));
  EXPECT_TRUE(HasLine(text,
                      "rdma_device_plugin_hca_allocated{hca=\"mlx5_1\",pci=\"0000:3a:00.0\","
                      "namespace=\"team-a\",pod=\"train-0\",container=\"main\","
                      "resource=\"rdma/hca\"} 1"));
  EXPECT_TRUE(HasLine(
      text,
      "rdma_device_plugin_port_data_received_bytes_total{hca=\"mlx5_1\",port=\"1\"} 8000004"));
  EXPECT_TRUE(HasLine(
      text,
      "rdma_device_plugin_rpc_duration_seconds_count{resource=\"rdma/hca\","
      "method=\"Allocate\"} 1"));
  EXPECT_TRUE(HasLine(
      text,
      "rdma_device_plugin_rpc_duration_seconds_count{resource=\"rdma/hca\","
      "method=\"GetPreferredAllocation\"} 1"));
  EXPECT_TRUE(HasLine(text,
                      "rdma_device_plugin_allocation_alignment_total{resource=\"rdma/hca\","
                      "path_class=\"unknown\"} 1"));
  EXPECT_EQ(rdp::testing::HttpGet("http://" + address + "/healthz").body, "ok\n");
  // The chart's probes: `probe` on the plugin's own socket, run in the plugin.
  EXPECT_EQ(rdp::testing::HttpGet("http://" + address + "/livez").body, "ok\n");
  EXPECT_EQ(rdp::testing::HttpGet("http://" + address + "/readyz").body, "ok\n");

  // promtool (Debian's prometheus package, scripts/install-sources.sh) holds the scrape to the
  // format; without it, the checks above stand alone.
  if (::access("/usr/bin/promtool", X_OK) == 0) {
    const std::string file = node.dir().Sub("scrape.txt");
    std::ofstream(file) << text;
    rdp::testing::Child promtool("/bin/sh", {"-c", "/usr/bin/promtool check metrics < " + file});
    EXPECT_EQ(promtool.Wait(kWait), 0) << promtool.output();
  }

  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(absl::Seconds(20)), 0);
}

// The metrics port is taken (another process, a second instance): the plugin exits 2 naming the
// flag before it has registered, so that a restart loop does not register the resource again and
// again.
TEST(MetricsBinaryTest, ATakenPortExitsTwoBeforeRegistering) {
  rdp::testing::TestNode node;
  const std::string kubelet_dir = node.dir().Sub("dp");
  KubeletSim kubelet(kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  const int taken = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(taken, 0);
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(taken, reinterpret_cast<struct sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(taken, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(taken, reinterpret_cast<struct sockaddr*>(&addr), &len), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  rdp::testing::Child plugin(
      testing::PluginBinary(), {"--sysfs-root", node.root(), "--dev-root", node.root(),
                                "--kubelet-dir", kubelet_dir, "--pod-resources-socket=",
                                "--metrics-address", address});
  EXPECT_EQ(plugin.Wait(absl::Seconds(20)), 2) << plugin.output();
  EXPECT_THAT(plugin.output(), HasSubstr("--metrics-address '" + address + "'"));
  EXPECT_EQ(kubelet.registrations(), 0) << plugin.output();
  ::close(taken);
}

TEST(MetricsBinaryTest, BadAddressExitsTwoNamingTheFlag) {
  for (const char* bad : {"nowhere", "127.0.0.1:99999", "example.com:9402"}) {
    rdp::testing::Child plugin(testing::PluginBinary(), {"--metrics-address", bad});
    EXPECT_EQ(plugin.Wait(absl::Seconds(20)), 2) << bad;
    EXPECT_NE(plugin.output().find("--metrics-address"), std::string::npos) << plugin.output();
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--metrics-allow", "10.0.0.0/33"}, "--metrics-allow"},
      {{"--metrics-allow", "pods"}, "--metrics-allow"},
      {{"--metrics-threads", "0"}, "--metrics-threads"},
      {{"--metrics-request-timeout", "soon"}, "--metrics-request-timeout"},
  };
  for (const auto& [args, flag] : cases) {
    std::vector<std::string> all = {"--metrics-address", "127.0.0.1:0"};
    all.insert(all.end(), args.begin(), args.end());
    for (const char* sub : {"serve", "dra"}) {
      std::vector<std::string> with = all;
      with.insert(with.begin(), sub);
      rdp::testing::Child plugin(testing::PluginBinary(), with);
      EXPECT_EQ(plugin.Wait(absl::Seconds(20)), 2) << sub << " " << args[1];
      EXPECT_THAT(plugin.output(), HasSubstr(flag)) << sub;
    }
  }
}

}  // namespace
}  // namespace rdp::cmd
