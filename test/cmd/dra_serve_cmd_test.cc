// The built binary end to end in DRA mode: `dra` against a fake node, stopped by SIGTERM; bad
// flags; `dra prepare-local` then `dra` answering that claim from its checkpoint.

#include <fstream>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "proto/dra.grpc.pb.h"
#include "proto/dra_health.grpc.pb.h"
#include "proto/dra_health_v1alpha1.grpc.pb.h"
#include "proto/pluginregistration.grpc.pb.h"
#include "serving/unix_server.h"
#include "gmock/gmock.h"
#include "nlohmann/json.hpp"
#include "test/support/child.h"
#include "test/support/http_get.h"
#include "test/support/temp_dir.h"
#include "test/support/test_node.h"

namespace rdp::cmd {
namespace {

namespace drapb = ::k8s::io::kubelet::pkg::apis::dra::v1;
constexpr char kDriver[] = "rdma.example.com";
// The ResourceSlice device name of mlx5_1 of rdp::testing::FourCards().
constexpr char kHca1[] = "hca-0000-3a-00-0";

constexpr absl::Duration kTimeout = absl::Seconds(20);

int RunBinary(const std::vector<std::string>& args) {
  return rdp::testing::RunToEnd(testing::PluginBinary(), args, kTimeout);
}

class DRAServeCmdTest : public ::testing::Test {
 protected:
  DRAServeCmdTest() {
    // An API server that is never there (port 1): the driver serves the kubelet regardless and
    // answers claims it has prepared from its checkpoint.
    std::ofstream(kubeconfig_)
        << R"({"apiVersion":"v1","kind":"Config","current-context":"x",)"
        << R"("clusters":[{"name":"c","cluster":{"server":"https://127.0.0.1:1"}}],)"
        << R"("users":[{"name":"u","user":{"token":"t"}}],)"
        << R"("contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}]})";
  }
  std::vector<std::string> Flags() const {
    const std::string root = node_.root();
    return {"--kubelet-dir", kubelet_dir_, "--cdi-root",   cdi_root_, "--driver-name",
            kDriver,         "--node-name", "node-a",      "--sysfs-root", root,
            "--dev-root",    root,          "--log-level", "info",    "--kubeconfig",
            kubeconfig_};
  }
  // `dra` with Flags() and a health poll every 100 ms.
  std::vector<std::string> PollingFast() const {
    std::vector<std::string> serve = {"dra"};
    for (const std::string& a : Flags()) serve.push_back(a);
    for (const char* a : {"--health-interval", "100ms"}) serve.push_back(a);
    return serve;
  }
  // `dra` with Flags() and its metrics endpoint on an ephemeral loopback port.
  std::vector<std::string> WithMetrics() const {
    std::vector<std::string> serve = {"dra"};
    for (const std::string& a : Flags()) serve.push_back(a);
    for (const char* a : {"--metrics-address", "127.0.0.1:0"}) serve.push_back(a);
    return serve;
  }
  std::string RegSocket() const {
    return kubelet_dir_ + "/plugins_registry/" + std::string(kDriver) + "-reg.sock";
  }
  // GetInfo on the registration socket, as the kubelet's plugin watcher asks it.
  grpc::Status GetInfo(pluginregistration::PluginInfo& info) const {
    auto reg = pluginregistration::Registration::NewStub(serving::UnixChannel(RegSocket()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
    return reg->GetInfo(&ctx, {}, &info);
  }

  rdp::testing::TestNode node_;
  const std::string kubelet_dir_ = node_.dir().Sub("kubelet");
  const std::string cdi_root_ = node_.dir().Sub("cdi");
  const std::string kubeconfig_ = node_.dir().Sub("kubeconfig.json");
};

TEST_F(DRAServeCmdTest, BadFlagsExitTwo) {
  auto with = [this](std::vector<std::string> extra) {
    std::vector<std::string> args = {"dra"};
    for (const std::string& a : Flags()) args.push_back(a);
    for (std::string& a : extra) args.push_back(std::move(a));
    return RunBinary(args);
  };
  EXPECT_EQ(with({"--mode", "both"}), 2);
  EXPECT_EQ(with({"--shared-devices", "0"}), 2);
  EXPECT_EQ(with({"--driver-name", "a/b"}), 2);
  EXPECT_EQ(with({"--log-level", "loud"}), 2);
  EXPECT_EQ(RunBinary({"dra", "--sysfs-root", "/nonexistent-rdp-root"}), 2);
  EXPECT_EQ(RunBinary({"dra", "prepare-local", "--device", "hca-x"}), 2);  // no --claim-uid
}

TEST_F(DRAServeCmdTest, PrepareLocalThenServeAnswersFromTheCheckpointAndStopsOnSigterm) {
  std::vector<std::string> local = {"dra", "prepare-local"};
  for (const std::string& a : Flags()) local.push_back(a);
  for (const char* a : {"--claim-uid", "0c1a1e00-0000-4000-8000-00000000000a", "--device", kHca1}) local.push_back(a);
  rdp::testing::Child prep(testing::PluginBinary(), local);
  ASSERT_EQ(prep.Wait(kTimeout), 0) << prep.output();
  const nlohmann::json answer = nlohmann::json::parse(prep.stdout_text(), nullptr, false);
  EXPECT_EQ(answer["devices"][0]["cdiDeviceIds"][0], "rdma.example.com/hca=0c1a1e00-0000-4000-8000-00000000000a-hca")
      << prep.stdout_text();
  struct stat st;
  ASSERT_EQ(::stat(answer["cdiSpec"].get<std::string>().c_str(), &st), 0);

  std::vector<std::string> serve = {"dra"};
  for (const std::string& a : Flags()) serve.push_back(a);
  rdp::testing::Child driver(testing::PluginBinary(), serve);
  ASSERT_TRUE(driver.WaitForOutput("serving Registration on", kTimeout)) << driver.output();

  pluginregistration::PluginInfo info;
  ASSERT_TRUE(GetInfo(info).ok());
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.endpoint(), kubelet_dir_ + "/plugins/rdma.example.com/dra.sock");

  auto dra = drapb::DRAPlugin::NewStub(serving::UnixChannel(info.endpoint()));
  drapb::NodePrepareResourcesRequest req;
  drapb::Claim* claim = req.add_claims();
  claim->set_namespace_("default");
  claim->set_uid("0c1a1e00-0000-4000-8000-00000000000a");
  claim->set_name("local");
  drapb::NodePrepareResourcesResponse resp;
  grpc::ClientContext c2;
  c2.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
  ASSERT_TRUE(dra->NodePrepareResources(&c2, req, &resp).ok());
  const auto& entry = resp.claims().at("0c1a1e00-0000-4000-8000-00000000000a");
  EXPECT_EQ(entry.error(), "");
  ASSERT_EQ(entry.devices_size(), 1);
  EXPECT_EQ(entry.devices(0).device_name(), kHca1);

  driver.Signal(SIGTERM);
  EXPECT_EQ(driver.Wait(kTimeout), 0) << driver.output();
  EXPECT_NE(::stat(RegSocket().c_str(), &st), 0) << "registration socket left behind";
  EXPECT_NE(::stat(info.endpoint().c_str(), &st), 0) << "DRA socket left behind";
}

// Without --node-name or NODE_NAME the node is the host name lower-cased, as the kubelet names
// it and `dra slices` did already: a host "Node-A.Example" published a pool "Node-A.Example"
// (refused: not a DNS subdomain). The host name is set in a UTS namespace of the child's own.
TEST_F(DRAServeCmdTest, TheHostNameIsTheNodeNameLowerCased) {
  if (rdp::testing::RunToEnd("/usr/bin/unshare", {"--uts", "true"}, kTimeout) != 0) {
    GTEST_SKIP() << "needs unshare --uts (root)";
  }
  std::vector<std::string> args = {"--uts", "/bin/sh", "-c",
                                   "hostname Node-A.Example && exec \"$0\" \"$@\"",
                                   testing::PluginBinary(), "dra", "prepare-local", "--claim-uid",
                                   "0c1a1e00-0000-4000-8000-00000000000b", "--device", kHca1};
  std::vector<std::string> flags = Flags();
  for (std::size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] == "--node-name") {
      ++i;  // its value too
      continue;
    }
    args.push_back(flags[i]);
  }
  rdp::testing::Child::Options options;
  options.env["NODE_NAME"] = std::nullopt;
  rdp::testing::Child prep("/usr/bin/unshare", args, options);
  ASSERT_EQ(prep.Wait(kTimeout), 0) << prep.output();
  const nlohmann::json answer = nlohmann::json::parse(prep.stdout_text(), nullptr, false);
  EXPECT_EQ(answer["devices"][0]["poolName"], "node-a.example") << prep.stdout_text();
}

// Two instances on one plugin directory (a relabel or an upgrade overlapping them) overwrote
// each other's checkpoint and took each other's sockets: the second waits, before it reads the
// checkpoint or serves anything, until the first has exited (its flock released).
TEST_F(DRAServeCmdTest, ASecondInstanceWaitsForTheFirstToExit) {
  const std::string dir = kubelet_dir_ + "/plugins/" + std::string(kDriver);
  std::filesystem::create_directories(dir);
  const int fd = ::open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "4242\n", 5), 5);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);  // the first instance, as far as it can tell
  std::vector<std::string> serve = {"dra"};
  for (const std::string& a : Flags()) serve.push_back(a);
  rdp::testing::Child driver(testing::PluginBinary(), serve);
  ASSERT_TRUE(driver.WaitForOutput("(pid 4242) holds", kTimeout)) << driver.output();
  struct stat st;
  EXPECT_NE(::stat(RegSocket().c_str(), &st), 0) << "no socket while the other instance runs";
  ::close(fd);  // the first exits
  ASSERT_TRUE(driver.WaitForOutput("serving Registration on", kTimeout)) << driver.output();
}

// An upgrade with maxSurge starts the new pod while the old one serves: the new one waited for
// the old to exit and the old waited to be replaced by a ready new one, so the rollout never
// ended (the chart refused maxSurge for that). Now the new one asks, the old one stops serving,
// releases the plugin directory and idles until it is stopped; the new one answers the claims
// the old one prepared, from the checkpoint; stopping the old one leaves the new one's sockets.
TEST_F(DRAServeCmdTest, ASecondInstanceIsHandedTheNodeOver) {
  constexpr char kUid[] = "0c1a1e00-0000-4000-8000-00000000000c";
  std::vector<std::string> local = {"dra", "prepare-local"};
  for (const std::string& a : Flags()) local.push_back(a);
  for (const char* a : {"--claim-uid", kUid, "--device", kHca1}) local.push_back(a);
  rdp::testing::Child prep(testing::PluginBinary(), local);
  ASSERT_EQ(prep.Wait(kTimeout), 0) << prep.output();

  std::vector<std::string> serve = {"dra"};
  for (const std::string& a : Flags()) serve.push_back(a);
  rdp::testing::Child old_one(testing::PluginBinary(), serve);
  ASSERT_TRUE(old_one.WaitForOutput("serving Registration on", kTimeout)) << old_one.output();
  rdp::testing::Child new_one(testing::PluginBinary(), serve);
  ASSERT_TRUE(old_one.WaitForOutput("waiting to be stopped", kTimeout)) << old_one.output();
  ASSERT_TRUE(new_one.WaitForOutput("serving Registration on", kTimeout)) << new_one.output();
  EXPECT_TRUE(old_one.WaitForOutput("handing over", kTimeout)) << old_one.output();
  EXPECT_FALSE(old_one.Exited()) << "exiting would only have the kubelet restart it";
  struct stat st;
  EXPECT_NE(::stat((kubelet_dir_ + "/plugins/" + kDriver + "/handover").c_str(), &st), 0);

  auto prepare = [&] {
    auto dra = drapb::DRAPlugin::NewStub(
        serving::UnixChannel(kubelet_dir_ + "/plugins/" + kDriver + "/dra.sock"));
    drapb::NodePrepareResourcesRequest req;
    drapb::Claim* claim = req.add_claims();
    claim->set_namespace_("default");
    claim->set_uid(kUid);
    claim->set_name("local");
    drapb::NodePrepareResourcesResponse resp;
    grpc::ClientContext c;
    c.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
    const grpc::Status s = dra->NodePrepareResources(&c, req, &resp);
    return s.ok() && resp.claims().count(kUid) && resp.claims().at(kUid).error().empty() &&
           resp.claims().at(kUid).devices_size() == 1;
  };
  EXPECT_TRUE(prepare());
  old_one.Signal(SIGTERM);
  EXPECT_EQ(old_one.Wait(kTimeout), 0) << old_one.output();
  EXPECT_EQ(::stat(RegSocket().c_str(), &st), 0) << "the old one removed the new one's socket";
  EXPECT_TRUE(prepare());
  new_one.Signal(SIGTERM);
  EXPECT_EQ(new_one.Wait(kTimeout), 0) << new_one.output();
}

// Whether the watch on the node's slices was up was in no metric: a driver that had fallen back
// to resyncing by timer looked like one that repairs an edited slice at once. The gauge is there
// from the first scrape, 0 while the API server is away (here it never comes).
TEST_F(DRAServeCmdTest, TheSliceWatchGaugeIsScrapedFromTheStart) {
  rdp::testing::Child driver(testing::PluginBinary(), WithMetrics());
  const std::string address = sim::WaitForMetricsAddress(driver, kTimeout);
  ASSERT_FALSE(address.empty()) << driver.output();
  const rdp::testing::HttpResponse scrape = rdp::testing::HttpGet("http://" + address + "/metrics");
  ASSERT_EQ(scrape.code, 200);
  EXPECT_TRUE(rdp::testing::HasLine(scrape.body, "# TYPE rdma_device_plugin_dra_slice_watch_up gauge"))
      << scrape.body;
  EXPECT_TRUE(rdp::testing::HasLine(scrape.body, "rdma_device_plugin_dra_slice_watch_up 0"))
      << scrape.body;
  EXPECT_TRUE(
      rdp::testing::HasLine(scrape.body, "rdma_device_plugin_dra_slice_watch_failures_total 0"))
      << scrape.body;
  driver.Signal(SIGTERM);
  EXPECT_EQ(driver.Wait(kTimeout), 0) << driver.output();
}

// /livez and /readyz, which the chart's probes GET, are `probe --dra` and `probe --dra --ready`
// run in the driver: live once its sockets answer, ready once the kubelet has registered it.
TEST_F(DRAServeCmdTest, TheProbeRoutesAnswerAsTheProbeCommandDoes) {
  rdp::testing::Child driver(testing::PluginBinary(), WithMetrics());
  const std::string address = sim::WaitForMetricsAddress(driver, kTimeout);
  ASSERT_FALSE(address.empty()) << driver.output();
  const std::string base = "http://" + address;
  ASSERT_TRUE(driver.WaitForOutput("serving Registration on", kTimeout)) << driver.output();
  EXPECT_EQ(rdp::testing::HttpGet(base + "/livez").code, 200) << driver.output();
  const rdp::testing::HttpResponse unready = rdp::testing::HttpGet(base + "/readyz");
  EXPECT_EQ(unready.code, 503);
  const int probe = RunBinary({"probe", "--dra", "--ready", "--kubelet-dir", kubelet_dir_,
                               "--driver-name", kDriver});
  EXPECT_EQ(probe, 1) << "the probe command and /readyz disagree: " << unready.body;

  auto reg = pluginregistration::Registration::NewStub(serving::UnixChannel(RegSocket()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
  pluginregistration::RegistrationStatus registered;
  registered.set_plugin_registered(true);
  pluginregistration::RegistrationStatusResponse ignored;
  ASSERT_TRUE(reg->NotifyRegistrationStatus(&ctx, registered, &ignored).ok());
  EXPECT_EQ(rdp::testing::HttpGet(base + "/readyz").code, 200) << driver.output();
  EXPECT_EQ(RunBinary({"probe", "--dra", "--ready", "--kubelet-dir", kubelet_dir_,
                       "--driver-name", kDriver}),
            0);
  driver.Signal(SIGTERM);
  EXPECT_EQ(driver.Wait(kTimeout), 0) << driver.output();
}

// The kubelet's health stream in each version, for the test below.
struct HealthV1 {
  using Service = ::v1::DRAResourceHealth;
  using Request = ::v1::NodeWatchResourcesRequest;
  using Response = ::v1::NodeWatchResourcesResponse;
  static constexpr auto kHealthy = ::v1::HEALTHY;
  static constexpr auto kUnhealthy = ::v1::UNHEALTHY;
};
struct HealthV1alpha1 {
  using Service = ::v1alpha1::DRAResourceHealth;
  using Request = ::v1alpha1::NodeWatchResourcesRequest;
  using Response = ::v1alpha1::NodeWatchResourcesResponse;
  static constexpr auto kHealthy = ::v1alpha1::HEALTHY;
  static constexpr auto kUnhealthy = ::v1alpha1::UNHEALTHY;
};

template <typename V>
class HealthStream {
 public:
  explicit HealthStream(const std::string& endpoint)
      : stub_(V::Service::NewStub(serving::UnixChannel(endpoint))) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
    reader_ = stub_->NodeWatchResources(&ctx_, typename V::Request());
  }
  ~HealthStream() { ctx_.TryCancel(); }
  // The next message; false when the stream ended.
  bool Read(typename V::Response& out) { return reader_->Read(&out); }
  // Reads until `device` is reported with `health`; its message, or "<ended>".
  std::string ReadUntil(const std::string& device, decltype(V::kHealthy) health) {
    typename V::Response resp;
    while (Read(resp)) {
      for (const auto& d : resp.devices()) {
        if (d.device().device_name() == device && d.health() == health) return d.message();
      }
    }
    return "<ended>";
  }

 private:
  std::unique_ptr<typename V::Service::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<typename V::Response>> reader_;
};

// The kubelet's health stream (DRAResourceHealth.NodeWatchResources, v1 and v1alpha1): every HCA
// HEALTHY at once, an HCA whose port goes DOWN UNHEALTHY at the next poll with the reason, and
// HEALTHY again when the port comes back, so that a pod whose HCA's link is down says so in its
// status.
TEST_F(DRAServeCmdTest, AnHcaWhosePortGoesDownIsUnhealthyInTheKubeletsHealthStream) {
  rdp::testing::Child driver(testing::PluginBinary(), PollingFast());
  ASSERT_TRUE(driver.WaitForOutput("serving Registration on", kTimeout)) << driver.output();

  pluginregistration::PluginInfo info;
  ASSERT_TRUE(GetInfo(info).ok());
  // DRAPlugin first (the kubelet takes the first it knows), the optional health service after.
  EXPECT_EQ(std::vector<std::string>(info.supported_versions().begin(),
                                     info.supported_versions().end()),
            (std::vector<std::string>{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                      "v1alpha1.DRAResourceHealth"}));

  HealthStream<HealthV1> v1(info.endpoint());
  HealthStream<HealthV1alpha1> v1alpha1(info.endpoint());
  HealthV1::Response first;
  ASSERT_TRUE(v1.Read(first)) << driver.output();
  ASSERT_EQ(first.devices_size(), 4);
  for (const auto& d : first.devices()) {
    EXPECT_EQ(d.device().pool_name(), "node-a");
    EXPECT_EQ(d.health(), ::v1::HEALTHY) << d.device().device_name() << ": " << d.message();
    EXPECT_EQ(d.health_check_timeout_seconds(), 30);
    EXPECT_GT(d.last_updated_time(), 0);
  }
  HealthV1alpha1::Response first_alpha;
  ASSERT_TRUE(v1alpha1.Read(first_alpha)) << driver.output();
  ASSERT_EQ(first_alpha.devices_size(), 4);

  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_1", 1, "DOWN").ok());
  EXPECT_EQ(v1.ReadUntil(kHca1, HealthV1::kUnhealthy), "mlx5_1: port 1 is DOWN");
  EXPECT_EQ(v1alpha1.ReadUntil(kHca1, HealthV1alpha1::kUnhealthy), "mlx5_1: port 1 is DOWN");
  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_1", 1, "ACTIVE").ok());
  EXPECT_EQ(v1.ReadUntil(kHca1, HealthV1::kHealthy), "");

  // SIGTERM ends the streams at once (not at the server's grace deadline) and the driver exits.
  driver.Signal(SIGTERM);
  EXPECT_EQ(driver.Wait(kTimeout), 0) << driver.output();
  HealthV1::Response rest;
  while (v1.Read(rest)) {
  }
}

// A failed health scan (the node's /sys mount broken) makes every HCA UNHEALTHY in the kubelet's
// health stream, with the scan's error, until a scan succeeds again: the node core's one rule for
// both doors.
TEST_F(DRAServeCmdTest, AFailedHealthScanMakesEveryHcaUnhealthy) {
  rdp::testing::Child driver(testing::PluginBinary(), PollingFast());
  ASSERT_TRUE(driver.WaitForOutput("serving Registration on", kTimeout)) << driver.output();
  pluginregistration::PluginInfo info;
  ASSERT_TRUE(GetInfo(info).ok());
  HealthStream<HealthV1> v1(info.endpoint());
  HealthV1::Response first;
  ASSERT_TRUE(v1.Read(first)) << driver.output();
  for (const auto& d : first.devices()) EXPECT_EQ(d.health(), ::v1::HEALTHY);

  const std::string sys = node_.dir().Sub("node") + "/sys";
  std::filesystem::rename(sys, sys + ".away");
  const std::string why = v1.ReadUntil(kHca1, HealthV1::kUnhealthy);
  EXPECT_THAT(why, ::testing::HasSubstr("mlx5_1: the health scan failed")) << driver.output();
  // The log is collected from the child's pipe by a thread of its own: wait for it, the health
  // stream's answer does not order it.
  EXPECT_TRUE(driver.WaitForOutput("health scan failed, every HCA is listed Unhealthy (none "
                                   "forgotten)",
                                   kTimeout))
      << driver.output();
  std::filesystem::rename(sys + ".away", sys);
  EXPECT_EQ(v1.ReadUntil(kHca1, HealthV1::kHealthy), "");
  driver.Signal(SIGTERM);
  EXPECT_EQ(driver.Wait(kTimeout), 0) << driver.output();
}

// The same early-warning flags as serve's, checked alike.
TEST_F(DRAServeCmdTest, EarlyWarningFlagsExitTwoNamingTheFlag) {
  for (const auto& [flag, value] : {std::pair{"--degraded-window", "-5m"},
                                    std::pair{"--flap-count", "-2"},
                                    std::pair{"--flap-stable", "later"},
                                    std::pair{"--degraded-link-downed", "-1"}}) {
    std::vector<std::string> args = {"dra"};
    for (const std::string& a : Flags()) args.push_back(a);
    args.push_back(flag);
    args.push_back(value);
    rdp::testing::Child child(testing::PluginBinary(), args);
    EXPECT_EQ(child.Wait(kTimeout), 2) << flag;
    EXPECT_THAT(child.output(), ::testing::HasSubstr(flag)) << child.output();
  }
}

}  // namespace
}  // namespace rdp::cmd
