// Trust on a misbehaving node: every RDMA pod starts (no DeviceSpec names a missing device
// node), no HCA reaches two pods (fail closed while the kubelet's pod list is unknown, withheld
// and unhealthy HCAs refused, one HCA in two spellings is one HCA), and the daemon's threads
// neither wait on each other nor run unbounded. Each test failed on the plugin before these
// were fixed. Every wait is bounded; no test asserts a timing.

#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "sim/kubelet_sim.h"
#include "deviceplugin/plugin_server.h"
#include "serving/unix_server.h"
#include "test/deviceplugin/test_node.h"
#include "test/support/log_lines.h"

namespace rdp::deviceplugin {
namespace {

using testing::TestNode;
using testing::WaitUntil;
using Devices = KubeletSim::Devices;

constexpr absl::Duration kWait = absl::Seconds(10);
constexpr absl::Duration kNever = absl::Hours(1);  // a health interval that never comes

const std::vector<std::string> kPcis = {"0000:1a:00.0", "0000:3a:00.0", "0000:9a:00.0",
                                        "0000:ba:00.0"};

int HealthyCount(const Devices& d) {
  int n = 0;
  for (const auto& x : d) n += x.health() == "Healthy" ? 1 : 0;
  return n;
}

auto AllHealthy(std::size_t n) {
  return [n](const Devices& d) { return d.size() == n && HealthyCount(d) == static_cast<int>(n); };
}

// A pod-resources source the test scripts: List fails (as a List slower than its deadline does)
// until Answer() gives it a pod list; a List may also be made to throw once. Answers at once, on
// the caller's thread.
class ScriptedPods : public PodResourcesSource {
 public:
  void List(absl::Duration, Done done) override {
    absl::StatusOr<PodList> answer = absl::DeadlineExceededError("the kubelet is slow");
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      if (throw_next_) {
        throw_next_ = false;
        throw std::runtime_error("readdir failed");
      }
      if (pods_) answer = *pods_;
    }
    done(std::move(answer));
  }
  void Answer(PodList pods) {
    absl::MutexLock lock(&mu_);
    pods_ = std::move(pods);
  }
  void ThrowNext() {
    absl::MutexLock lock(&mu_);
    throw_next_ = true;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  mutable absl::Mutex mu_;
  std::optional<PodList> pods_ ABSL_GUARDED_BY(mu_);
  bool throw_next_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class TrustTest : public ::testing::Test {
 protected:
  // Starts the kubelet simulator and the plugin; waits for the registration.
  void StartAll(Config config, NodeSources sources) {
    config_ = std::move(config);
    kubelet_ = std::make_unique<KubeletSim>(config_.kubelet_dir);
    ASSERT_TRUE(kubelet_->Start().ok());
    plugin_ = std::make_unique<PluginServer>(config_, std::move(sources));
    ASSERT_TRUE(plugin_->Start().ok());
    ASSERT_TRUE(kubelet_->WaitForRegistration(0, kWait).has_value());
    stub_ = kubelet_->PluginStub();
  }

  // An exclusive plugin over `pods` (on `socket`, started here): no periodic List, the pod list known before
  // it serves, and every call answered by the List it waits for, never by the wait's end; waits
  // until every HCA is offered.
  void StartExclusiveOver(FakePodResources& pods, const std::string& socket) {
    ASSERT_TRUE(pods.Start().ok());
    Config config = node_.MakeConfig(hca::Mode::kExclusive);
    config.health_interval = kNever;
    config.pod_resources_first_wait = kWait;
    config.admission_wait = kWait;
    StartAll(config, node_.Sources(NewGrpcPodResources(socket)));
    ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  }

  grpc::Status Allocate(const std::vector<std::string>& ids,
                        v1beta1::AllocateResponse* response) {
    v1beta1::AllocateRequest request;
    auto* c = request.add_container_requests();
    for (const auto& id : ids) c->add_devices_ids(id);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    return stub_->Allocate(&context, request, response);
  }

  // Every device spec of the first container names a node that exists under the dev root.
  ::testing::AssertionResult SpecsExist(const v1beta1::AllocateResponse& response) {
    for (const auto& d : response.container_responses(0).devices()) {
      const std::string path = config_.discovery.dev_root + d.host_path();
      if (!std::filesystem::exists(path)) {
        return ::testing::AssertionFailure() << "a device spec names the missing " << path;
      }
    }
    return ::testing::AssertionSuccess();
  }

  TestNode node_;
  // Made before the plugin, whose threads log on "server", and destroyed after it.
  rdp::testing::LogLines server_log_{"server"};
  Config config_;
  std::unique_ptr<KubeletSim> kubelet_;
  std::unique_ptr<PluginServer> plugin_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

// ---------------------------------------------------------------------------------------------
// Every pod that gets rdma/hca starts.

// One HCA's uverbs node vanished (a driver reload, a VF without verbs) and no health poll has
// run since: shared Allocate hands out the other HCAs only, and every device spec names a node
// that exists. Before, it returned a spec for the missing node, and the runtime refused every
// rdma/hca pod on the node.
TEST_F(TrustTest, SharedAllocateLeavesOutAnHcaWhoseNodeVanished) {
  Config config = node_.MakeConfig(hca::Mode::kShared);
  config.health_interval = kNever;
  StartAll(config, node_.Sources());
  ASSERT_TRUE(node_.fixture().RemoveUverbs("mlx5_1").ok());
  v1beta1::AllocateResponse response;
  const grpc::Status s = Allocate({"shared-3"}, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(SpecsExist(response));
  EXPECT_EQ(response.container_responses(0).envs().at("NCCL_IB_HCA"), "=mlx5_0,mlx5_2,mlx5_3");
  // The Allocate asked for a scan at once: the list still offers the shared units (three HCAs
  // are usable), and the next Allocate says the same.
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(1000), kWait).has_value());
}

// Allocate checks the device nodes at the call: an HCA allocated again after rdma_cm went (no
// health poll between) gets no spec for it, not the first call's answer. (An HCA's own nodes are
// all needed: one gone makes the HCA refused, SharedAllocateLeavesOutAnHca...)
TEST_F(TrustTest, AnHcaAllocatedAgainAfterANodeWentGetsNoSpecForIt) {
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.health_interval = kNever;
  StartAll(config, node_.Sources());
  auto has_rdma_cm = [](const v1beta1::AllocateResponse& r) {
    for (const auto& d : r.container_responses(0).devices()) {
      if (d.host_path() == "/dev/infiniband/rdma_cm") return true;
    }
    return false;
  };
  v1beta1::AllocateResponse first;
  ASSERT_TRUE(Allocate({"0000:3a:00.0"}, &first).ok());
  ASSERT_TRUE(has_rdma_cm(first));
  v1beta1::AllocateResponse same;
  ASSERT_TRUE(Allocate({"0000:3a:00.0"}, &same).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(same, first));
  ASSERT_TRUE(std::filesystem::remove(config_.discovery.dev_root + "/dev/infiniband/rdma_cm"));
  v1beta1::AllocateResponse after;
  const grpc::Status s = Allocate({"0000:3a:00.0"}, &after);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(SpecsExist(after));
  EXPECT_FALSE(has_rdma_cm(after));
  EXPECT_EQ(after.container_responses(0).devices_size() + 1,
            first.container_responses(0).devices_size());
}

// No HCA usable: Allocate refuses with FAILED_PRECONDITION naming why, and once a scan has run
// the shared units are listed Unhealthy.
TEST_F(TrustTest, SharedAllocateRefusedWhenNoHcaIsUsable) {
  Config config = node_.MakeConfig(hca::Mode::kShared);
  config.health_interval = kNever;
  StartAll(config, node_.Sources());
  for (const char* name : {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}) {
    ASSERT_TRUE(node_.fixture().RemoveUverbs(name).ok());
  }
  v1beta1::AllocateResponse response;
  const grpc::Status s = Allocate({"shared-0"}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "/dev/infiniband/uverbs1 is missing"))
      << s.error_message();
  EXPECT_TRUE(kubelet_->WaitForDevices(
      [](const Devices& d) { return d.size() == 1000 && HealthyCount(d) == 0; }, kWait));
}

// A node with no HCA at all (CPU-only) advertises no rdma/hca, not 1000 Unhealthy units.
TEST_F(TrustTest, CpuOnlyNodeAdvertisesNothing) {
  TestNode empty(std::vector<sim::FixtureHca>{});
  std::filesystem::create_directories(empty.dir().Sub("node/sys/class"));
  Config config = empty.MakeConfig(hca::Mode::kShared);
  kubelet_ = std::make_unique<KubeletSim>(config.kubelet_dir);
  ASSERT_TRUE(kubelet_->Start().ok());
  PluginServer plugin(config, empty.Sources());
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(kubelet_->WaitForRegistration(0, kWait).has_value());
  EXPECT_TRUE(kubelet_->WaitForDevices([](const Devices& d) { return d.empty(); }, kWait));
  EXPECT_EQ(kubelet_->max_healthy(), 0);
}

// ---------------------------------------------------------------------------------------------
// No HCA reaches two pods.

// The kubelet's pod-resources List is slower than its deadline when the plugin starts (here: it
// fails until the test answers), and a container still holds shared IDs from before the node
// became exclusive: no list may offer an HCA until that container is gone. Before, the first
// lists offered every HCA Healthy.
TEST_F(TrustTest, SlowPodResourcesAtStartOfferNothing) {
  auto pods = std::make_unique<ScriptedPods>();
  ScriptedPods* script = pods.get();
  StartAll(node_.MakeConfig(hca::Mode::kExclusive), node_.Sources(std::move(pods)));
  // Some lists arrive and retries happen (with backoff) while the List keeps failing.
  ASSERT_TRUE(kubelet_->WaitForDevices([](const Devices& d) { return d.size() == 4; }, kWait));
  const int before = script->calls();
  for (int i = 0; i < 3; ++i) plugin_->node().RefreshPodsAndWait();
  EXPECT_GT(script->calls(), before);
  EXPECT_FALSE(plugin_->node().pods_known());
  EXPECT_EQ(kubelet_->max_healthy(), 0) << "an HCA was offered before the pod list was known";
  v1beta1::AllocateResponse response;
  const grpc::Status refused = Allocate({kPcis[0]}, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "pod list is not known"))
      << refused.error_message();

  script->Answer({{"default/old/main", {{"rdma/hca", {"shared-3"}}}}});
  ASSERT_TRUE(plugin_->node().RefreshPodsAndWait());
  EXPECT_EQ(kubelet_->max_healthy(), 0) << "an HCA was offered while a shared pod sees all";
  script->Answer({});
  EXPECT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
}

// The pod-resources socket does not exist when the plugin starts and appears later (the kubelet
// starts after it, or creates the socket late): the plugin offers nothing until a List on it
// answers, then withholds what the pods hold. Before, the feature stayed off for the life of
// the process and every HCA was offered.
TEST_F(TrustTest, PodResourcesSocketThatAppearsLaterIsUsed) {
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.pod_resources_socket = node_.dir().Sub("pod-resources/kubelet.sock");
  StartAll(config, [&] {
    NodeSources sources = node_.Sources();
    sources.pod_resources = DefaultSources(config).pod_resources;
    return sources;
  }());
  ASSERT_TRUE(kubelet_->WaitForDevices([](const Devices& d) { return d.size() == 4; }, kWait));
  EXPECT_EQ(kubelet_->max_healthy(), 0);

  FakePodResources pods(config.pod_resources_socket);
  pods.Set({{"default/old/main", {{"rdma/hca", {"shared-3"}}}}});
  ASSERT_TRUE(pods.Start().ok());
  ASSERT_TRUE(WaitUntil(plugin_->node(), [&] { return plugin_->node().pods_known(); },
                        absl::Now() + kWait))
      << "the socket that appeared was never used";
  EXPECT_EQ(kubelet_->max_healthy(), 0);
  pods.Set({});
  EXPECT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
}

// Exclusive Allocate refuses an HCA that is withheld or unhealthy, naming why. Before, both
// were handed out.
TEST_F(TrustTest, ExclusiveAllocateRefusesWithheldAndUnhealthyHcas) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  pods.Set({{"default/old/main", {{"rdma/hca", {"shared-3"}}}}});
  ASSERT_TRUE(pods.Start().ok());
  // The pod list known before serving however slow the machine (AllocateBeforeTheFirstList...
  // is about an Allocate before it is; here a first List slower than 100 ms failed 1 run in 40).
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.pod_resources_first_wait = kWait;
  StartAll(config, node_.Sources(NewGrpcPodResources(socket)));
  v1beta1::AllocateResponse response;
  grpc::Status s = Allocate({kPcis[0]}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "withheld")) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "default/old/main")) << s.error_message();

  pods.Set({});
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_0", 1, "DOWN").ok());
  ASSERT_TRUE(kubelet_->WaitForDevices(
      [](const Devices& d) { return d.size() == 4 && HealthyCount(d) == 3; }, kWait));
  s = Allocate({kPcis[0]}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "port 1 is DOWN")) << s.error_message();
  EXPECT_TRUE(Allocate({kPcis[1]}, &response).ok());
}

// An Allocate that comes before the first List has ended waits for a List (within its deadline)
// and is judged by it. Before, it was refused at once as if Lists failed ("the kubelet's pod
// list is not known yet"): a plugin started while the kubelet was slow to list failed the first
// pods it was asked for. Found as a flake of ExclusiveAllocateRefusesWithheldAndUnhealthyHcas
// under load (1 run in 40), where the first List took longer than Start waits for it.
TEST_F(TrustTest, AllocateBeforeTheFirstListEndsWaitsForAList) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  pods.Set({{"default/old/main", {{"rdma/hca", {"shared-3"}}}}});
  pods.SetDelay(absl::Seconds(2));  // well past the 100 ms Start waits for the first List
  ASSERT_TRUE(pods.Start().ok());
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.admission_wait = kWait;  // the bound of that wait (1 s) is not what this test is about
  StartAll(config, node_.Sources(NewGrpcPodResources(socket)));
  v1beta1::AllocateResponse response;
  grpc::Status s = Allocate({kPcis[0]}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "default/old/main")) << s.error_message();
  EXPECT_FALSE(absl::StrContains(s.error_message(), "not known yet")) << s.error_message();
  pods.SetDelay(absl::ZeroDuration());
  pods.Set({});
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  EXPECT_TRUE(Allocate({kPcis[0]}, &response).ok());
}

// One HCA in two spellings is one HCA: given twice, the request is invalid. Before, it got two
// copies of every device spec and NCCL_IB_HCA==mlx5_0,mlx5_0.
TEST_F(TrustTest, OneHcaInTwoSpellingsIsADuplicate) {
  StartAll(node_.MakeConfig(hca::Mode::kExclusive), node_.Sources());
  v1beta1::AllocateResponse response;
  const grpc::Status s = Allocate({"0000:1a:00.0", "0000:1A:00.0"}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "0000:1A:00.0")) << s.error_message();
  EXPECT_EQ(Allocate({"1a:00.0", "0000:1a:00.0"}, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // One spelling alone is that HCA.
  ASSERT_TRUE(Allocate({"0000:1A:00.0"}, &response).ok());
  EXPECT_EQ(response.container_responses(0).envs().at("RDMA_HCA_PCI"), "0000:1a:00.0");
  // GetPreferredAllocation answers with the IDs it was offered, as they were spelled (found by
  // fuzz_rpc: the allocator's own spelling is not in `available`, and the kubelet matches
  // verbatim).
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1beta1::PreferredAllocationResponse preferred;
  ASSERT_TRUE(stub_
                  ->GetPreferredAllocation(
                      &context, PreferredRequest({"0000:1A:00.0", "3A:00.0"}, {"3A:00.0"}, 2),
                      &preferred)
                  .ok());
  std::vector<std::string> got(preferred.container_responses(0).deviceids().begin(),
                               preferred.container_responses(0).deviceids().end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"0000:1A:00.0", "3A:00.0"}));
}

// An HCA gone for good is forgotten after config.forget_after_polls polls when no container
// holds it; one a container holds stays listed (Unhealthy), so the kubelet keeps that
// container's device. Before, every vanished HCA stayed listed forever.
TEST_F(TrustTest, VanishedHcasAreForgottenUnlessHeld) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  pods.Set({{"default/train/main", {{"rdma/hca", {"0000:3A:00.0"}}}}});
  ASSERT_TRUE(pods.Start().ok());
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.forget_after_polls = 3;
  StartAll(config, node_.Sources(NewGrpcPodResources(socket)));
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  ASSERT_TRUE(node_.fixture().RemoveHca("mlx5_1").ok());  // held
  ASSERT_TRUE(node_.fixture().RemoveHca("mlx5_2").ok());  // not held
  auto after = kubelet_->WaitForDevices([](const Devices& d) { return d.size() == 3; }, kWait);
  ASSERT_TRUE(after.has_value()) << "the unheld HCA was never forgotten";
  std::map<std::string, std::string> health;
  for (const auto& d : *after) health[d.id()] = d.health();
  EXPECT_EQ(health.count(kPcis[2]), 0u);
  EXPECT_EQ(health[kPcis[1]], "Unhealthy") << "the held HCA must stay listed";
  // Back again: the same ID.
  ASSERT_TRUE(node_.fixture().AddHca(testing::FixtureCard("mlx5_2", kPcis[2], 1, "pci0000:97"))
                  .ok());
  EXPECT_TRUE(kubelet_->WaitForDevices(
      [](const Devices& d) { return d.size() == 4 && HealthyCount(d) == 3; }, kWait));
}

// A failed health scan (a broken /host/sys mount) keeps the last good state: every HCA listed
// Unhealthy, none forgotten, however long it fails; the next good scan restores them (every HCA
// used to count as absent, and after forget_after_polls polls the unheld ones were forgotten:
// the node's capacity shrank).
TEST_F(TrustTest, AFailedScanKeepsTheLastGoodState) {
  auto pods = std::make_unique<ScriptedPods>();
  pods->Answer({});
  auto failing = std::make_shared<std::atomic<bool>>(false);
  NodeSources sources = node_.Sources(std::move(pods));
  sources.scan = [scan = sources.scan, failing]() -> absl::StatusOr<std::vector<topology::Hca>> {
    if (*failing) return absl::UnavailableError("/host/sys/class/infiniband: not mounted");
    return scan();
  };
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.forget_after_polls = 3;
  NodeState state(config, std::move(sources));
  ASSERT_TRUE(state.Init().ok());
  ASSERT_TRUE(state.RefreshPodsAndWait());
  auto healthy = [&] {
    int n = 0;
    for (const DeviceState& d : state.resource().Devices().devices) n += d.healthy ? 1 : 0;
    return n;
  };
  ASSERT_EQ(healthy(), 4);
  *failing = true;
  for (int i = 0; i < 10; ++i) state.Poll();
  EXPECT_EQ(state.resource().Devices().devices.size(), 4u) << "HCAs forgotten while the scan failed";
  EXPECT_EQ(healthy(), 0);
  *failing = false;
  state.Poll();
  EXPECT_EQ(state.resource().Devices().devices.size(), 4u);
  EXPECT_EQ(healthy(), 4);
}

// A driver reload under a running pod: every RDMA device gone while the PCI functions stay, for
// longer than forget_after_polls polls, then back with every mlx5_N/uverbsN numbered anew. The
// device plugin keeps every ID listed (Unhealthy while the driver is away, nothing forgotten,
// though nothing but the pod's HCA is held), the pod's HCA stays in its accounting, and after the
// reload the same IDs are Healthy and Allocate names the new HCA names and device nodes. Before,
// the unheld HCAs were forgotten after forget_after_polls polls and came back under new polls'
// worth of churn; the kubelet saw the node's capacity shrink.
TEST_F(TrustTest, ADriverReloadKeepsEveryIdAndAllocatesTheNewNodes) {
  auto pods = std::make_unique<ScriptedPods>();
  pods->Answer({{"default/train/main", {{"rdma/hca", {kPcis[1]}}}}});
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.forget_after_polls = 3;
  NodeState state(config, node_.Sources(std::move(pods)));
  ASSERT_TRUE(state.Init().ok());
  ASSERT_TRUE(state.RefreshPodsAndWait());
  auto listed = [&] {
    std::map<std::string, bool> out;
    for (const DeviceState& d : state.resource().Devices().devices) out[d.id] = d.healthy;
    return out;
  };
  ASSERT_EQ(listed().size(), 4u);
  for (const char* name : {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}) {
    ASSERT_TRUE(node_.fixture().UnbindRdma(name).ok()) << name;
  }
  for (int i = 0; i < 10; ++i) state.Poll();
  std::map<std::string, bool> away = listed();
  ASSERT_EQ(away.size(), 4u) << "an HCA was forgotten while its driver was away";
  for (const auto& [id, healthy] : away) EXPECT_FALSE(healthy) << id;
  const absl::StatusOr<node::Grant> refused = state.resource().Allocate({kPcis[0]});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  metrics::Exposition out;
  state.WriteMetrics(out);
  const std::string scrape = out.Take();
  EXPECT_NE(scrape.find(R"(pci="0000:3a:00.0",namespace="default",pod="train",container="main")"),
            std::string::npos)
      << "the holder's accounting: " << scrape;

  // Back, numbered anew (the fixture's next uverbs is 4).
  ASSERT_TRUE(node_.fixture().BindRdma(kPcis[3], "mlx5_4").ok());
  ASSERT_TRUE(node_.fixture().BindRdma(kPcis[2], "mlx5_5").ok());
  ASSERT_TRUE(node_.fixture().BindRdma(kPcis[1], "mlx5_6").ok());
  ASSERT_TRUE(node_.fixture().BindRdma(kPcis[0], "mlx5_7").ok());
  state.Poll();
  for (const auto& [id, healthy] : listed()) EXPECT_TRUE(healthy) << id;
  EXPECT_EQ(listed().size(), 4u);
  const absl::StatusOr<node::Grant> grant = state.resource().Allocate({kPcis[0]});
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->allocation.envs.at("NCCL_IB_HCA"), "=mlx5_7");
  EXPECT_EQ(grant->allocation.devices[0].host_path, "/dev/infiniband/uverbs7");
}

// A pod-resources List that throws (a readdir error in a source) must not freeze the refresh:
// the next one runs. Before, a flag set for the refresh was never reset, and withholding and
// the GPU context froze for the life of the process.
TEST_F(TrustTest, AThrowingPodListDoesNotFreezeTheRefresh) {
  auto pods = std::make_unique<ScriptedPods>();
  ScriptedPods* script = pods.get();
  script->ThrowNext();
  NodeState plugin(node_.MakeConfig(hca::Mode::kExclusive), node_.Sources(std::move(pods)));
  ASSERT_TRUE(plugin.Init().ok());
  EXPECT_FALSE(plugin.RefreshPodsAndWait());
  script->Answer({});
  EXPECT_TRUE(plugin.RefreshPodsAndWait());
  EXPECT_TRUE(plugin.pods_known());
}

// GetPreferredAllocation with eight containers makes one pod-resources List, not eight (the
// kubelet rate-limits the API node-wide), and concurrent calls share Lists.
TEST_F(TrustTest, PodListRefreshesAreCoalesced) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  ASSERT_TRUE(pods.Start().ok());
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.health_interval = kNever;  // no periodic refresh in between
  StartAll(config, node_.Sources(NewGrpcPodResources(socket)));
  v1beta1::PreferredAllocationRequest request;
  for (int c = 0; c < 8; ++c) {
    auto* r = request.add_container_requests();
    for (const auto& id : kPcis) r->add_available_deviceids(id);
    r->set_allocation_size(1);
  }
  const int before = pods.list_calls();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1beta1::PreferredAllocationResponse response;
  ASSERT_TRUE(stub_->GetPreferredAllocation(&context, request, &response).ok());
  EXPECT_EQ(response.container_responses_size(), 8);
  EXPECT_EQ(pods.list_calls() - before, 1);
}

// GetPreferredAllocation calls back to back (here 200, a local client looping; the kubelet
// admits containers one at a time) are each answered from a List that began after the call asked:
// before each call a new container with a GPU is admitted, under mlx5_0's PCIe root on even calls
// and mlx5_2's on odd ones, and the answer must be the HCA beside it. One List per call at most.
TEST_F(TrustTest, BackToBackPreferredAllocationsAreAnsweredFromAFreshList) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  ASSERT_TRUE(pods.Start().ok());
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.health_interval = kNever;          // no periodic List in between
  config.admission_wait = kWait;            // answered by its List, never by the wait's end
  config.pod_resources_first_wait = kWait;  // the first List before serving
  NodeSources sources = node_.Sources(NewGrpcPodResources(socket));
  std::shared_ptr<Env> env = node_.NodeEnv();
  sources.discover = [env]() -> absl::StatusOr<topology::TopologyPtr> {
    auto hcas = topology::ReadSysfsHcas(*env);
    if (!hcas.ok()) return hcas.status();
    std::vector<topology::Gpu> gpus(2);
    gpus[0].place.pci = "0000:1b:00.0";
    gpus[0].place.numa = 0;
    gpus[0].place.pcie_root = "pci0000:15";  // mlx5_0's
    gpus[1].place.pci = "0000:9b:00.0";
    gpus[1].place.numa = 1;
    gpus[1].place.pcie_root = "pci0000:97";  // mlx5_2's
    return std::make_shared<const topology::Topology>(std::vector<int>{0, 1}, *hcas, gpus);
  };
  StartAll(config, std::move(sources));
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  const int lists_before = pods.list_calls();
  constexpr int kCalls = 200;
  int stale = 0;
  for (int i = 0; i < kCalls; ++i) {
    const bool odd = i % 2 == 1;
    pods.Set({{absl::StrCat("default/train-", i, "/main"),
               {{"nvidia.com/gpu", {odd ? "0000:9b:00.0" : "0000:1b:00.0"}}}}});
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    v1beta1::PreferredAllocationResponse response;
    const grpc::Status s =
        stub_->GetPreferredAllocation(&context, PreferredRequest(kPcis, {}, 1), &response);
    ASSERT_TRUE(s.ok()) << "call " << i << ": " << s.error_message();
    ASSERT_EQ(response.container_responses(0).deviceids_size(), 1);
    if (response.container_responses(0).deviceids(0) != (odd ? kPcis[2] : kPcis[0])) ++stale;
  }
  EXPECT_EQ(stale, 0) << "calls answered from a List that began before they asked";
  EXPECT_LE(pods.list_calls() - lists_before, kCalls);
}

// A working but slow pod-resources server (a List answered in 400 ms: hundreds of pods, a
// throttled kubelet) is read, and withholding lifts once the other mode's container is gone.
// (Every List used to give up after 100 ms: the pod list was never known and every HCA stayed
// withheld for ever.)
TEST_F(TrustTest, SlowPodResourcesAreReadAndWithholdingLifts) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  pods.Set({{"default/old/main", {{"rdma/hca", {"shared-3"}}}}});
  pods.SetDelay(absl::Milliseconds(400));
  ASSERT_TRUE(pods.Start().ok());
  StartAll(node_.MakeConfig(hca::Mode::kExclusive), node_.Sources(NewGrpcPodResources(socket)));
  ASSERT_TRUE(WaitUntil(plugin_->node(), [&] { return plugin_->node().pods_known(); },
                        absl::Now() + kWait))
      << "a List answered in 400 ms was never read";
  EXPECT_EQ(kubelet_->max_healthy(), 0);
  pods.Set({});  // the shared container has gone
  EXPECT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value())
      << "withholding never lifted";
}

// The admission path waits for a fresh list only briefly (Config::admission_wait), then
// answers with the last list: GetPreferredAllocation is advice, and a kubelet whose List takes
// longer than the call's patience must not fail it.
TEST_F(TrustTest, AVerySlowPodListDoesNotHoldGetPreferredAllocation) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  ASSERT_TRUE(pods.Start().ok());
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.health_interval = kNever;
  config.admission_wait = absl::Milliseconds(100);
  StartAll(config, node_.Sources(NewGrpcPodResources(socket)));
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  pods.SetDelay(absl::Hours(1));  // from now on no List answers (Stop releases it)
  v1beta1::PreferredAllocationRequest request;
  auto* r = request.add_container_requests();
  for (const auto& id : kPcis) r->add_available_deviceids(id);
  r->set_allocation_size(2);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1beta1::PreferredAllocationResponse response;
  const grpc::Status s = stub_->GetPreferredAllocation(&context, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.container_responses(0).deviceids_size(), 2);
}

// Exclusive Allocate checks withholding against a pod list that began after the call (the
// kubelet skips GetPreferredAllocation when the aligned set equals the request, so that call
// cannot be relied on to refresh it): here the only list is the one from before the
// registration, and a shared container was admitted since.
TEST_F(TrustTest, ExclusiveAllocateReadsAFreshPodList) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  ASSERT_TRUE(pods.Start().ok());
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.health_interval = kNever;  // no periodic refresh
  config.pod_resources_first_wait = kWait;  // the pod list is known before the plugin serves
  StartAll(config, node_.Sources(NewGrpcPodResources(socket)));
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  ASSERT_EQ(pods.list_calls(), 1) << "the pod list was read again after the registration";
  pods.Set({{"default/shared/main", {{"rdma/hca", {"shared-3"}}}}});  // just admitted
  v1beta1::AllocateResponse response;
  const grpc::Status refused = Allocate({kPcis[0]}, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "an HCA a shared container sees was handed out";
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "withheld")) << refused.error_message();
}

// A List that began after our registration does not show every container the other mode's
// plugin admits: the kubelet may have been allocating through it when we registered, and records
// that container after our List. Each exclusive Allocate reads a List of its own: here, after a
// List begun well after the registration, the other mode's plugin's container (holding an HCA
// under its shared ID) appears, and Allocate of that HCA is refused as withheld. Before, a List
// begun after the registration counted as fresh for every later Allocate, and the HCA was handed
// out.
TEST_F(TrustTest, ExclusiveAllocateAfterAListSinceRegistrationReadsAnotherList) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  ASSERT_NO_FATAL_FAILURE(StartExclusiveOver(pods, socket));
  ASSERT_TRUE(plugin_->node().RefreshPodsAndWait(kWait)) << "no List after the registration";
  const int lists = pods.list_calls();
  v1beta1::AllocateResponse granted;
  ASSERT_TRUE(Allocate({kPcis[0]}, &granted).ok()) << "nothing is withheld yet";
  pods.Set({{"default/shared/main", {{"rdma/hca", {"shared-3"}}}}});  // admitted since
  v1beta1::AllocateResponse response;
  const grpc::Status refused = Allocate({kPcis[0]}, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "an HCA a shared container sees was handed out";
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "withheld")) << refused.error_message();
  EXPECT_EQ(pods.list_calls(), lists + 2) << "not one List per Allocate";
}

// One List per exclusive admission: the Allocate of the IDs the GetPreferredAllocation just
// before it answered from a List begun after that call decides on that List (the kubelet admits
// nothing between the two); an Allocate of other IDs, or a second Allocate, reads a List of its
// own and sees the container the other mode's plugin admitted meanwhile. Two Lists per admission
// made the kubelet's rate limit refuse the next admission's List (TestGPUAwarePlacement).
TEST_F(TrustTest, AnAdmissionsAllocateSharesItsPreferredAllocationsList) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  ASSERT_NO_FATAL_FAILURE(StartExclusiveOver(pods, socket));
  auto prefer = [&]() -> std::string {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    v1beta1::PreferredAllocationResponse response;
    const grpc::Status s =
        stub_->GetPreferredAllocation(&context, PreferredRequest(kPcis, {}, 1), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok() && response.container_responses_size() == 1 &&
                   response.container_responses(0).deviceids_size() == 1
               ? response.container_responses(0).deviceids(0)
               : "";
  };
  const int lists = pods.list_calls();
  const std::string first = prefer();
  ASSERT_FALSE(first.empty());
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(Allocate({first}, &response).ok());
  EXPECT_EQ(pods.list_calls(), lists + 1) << "not one List for the admission";

  const std::string second = prefer();
  ASSERT_FALSE(second.empty());
  pods.Set({{"default/shared/main", {{"rdma/hca", {"shared-3"}}}}});
  const std::string other = second == kPcis[1] ? kPcis[2] : kPcis[1];
  EXPECT_EQ(Allocate({other}, &response).error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "an Allocate of IDs the GetPreferredAllocation did not answer read no List";
  EXPECT_EQ(pods.list_calls(), lists + 3);
  EXPECT_EQ(Allocate({second}, &response).error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "an Allocate after the admission's Allocate read no List";
  EXPECT_EQ(pods.list_calls(), lists + 4);
}

// The kubelet may call Allocate before its answer to our Register has reached us. A pod list read
// before the registration must not count as fresh then: the old code counted a registration only
// once Register returned, so an Allocate in that window reused the start's list and handed out
// an HCA a shared container sees (ExclusiveAllocateReadsAFreshPodList failed 1 run in 4 so).
// Here the simulator holds its Register answer while the test allocates.
TEST_F(TrustTest, AllocateWhileRegisteringReadsAFreshPodList) {
  const std::string socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(socket);
  ASSERT_TRUE(pods.Start().ok());
  config_ = node_.MakeConfig(hca::Mode::kExclusive);
  config_.health_interval = kNever;
  config_.pod_resources_first_wait = kWait;
  config_.register_timeout = kWait;
  kubelet_ = std::make_unique<KubeletSim>(config_.kubelet_dir);
  ASSERT_TRUE(kubelet_->Start().ok());
  kubelet_->HoldRegisterAnswers(true);
  struct Release {
    KubeletSim* k;
    ~Release() { k->HoldRegisterAnswers(false); }
  } release{kubelet_.get()};
  plugin_ = std::make_unique<PluginServer>(config_, node_.Sources(NewGrpcPodResources(socket)));
  ASSERT_TRUE(plugin_->Start().ok());
  ASSERT_TRUE(kubelet_->WaitForRegistration(0, kWait).has_value());
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  ASSERT_EQ(plugin_->node().resource().metrics().registrations.value(), 0u) << "Register returned while held";
  stub_ = kubelet_->PluginStub();
  pods.Set({{"default/shared/main", {{"rdma/hca", {"shared-3"}}}}});  // admitted meanwhile
  v1beta1::AllocateResponse response;
  const grpc::Status refused = Allocate({kPcis[0]}, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "an HCA a shared container sees was handed out";
}

// ---------------------------------------------------------------------------------------------
// The daemon's threads.

// Re-registration after a kubelet restart never waits on discovery: here a hotplug
// re-discovery hangs (hwloc on a slow node) while the kubelet restarts. Before, one thread did
// both, and the plugin stayed unregistered until discovery returned.
TEST_F(TrustTest, ReRegistrationDoesNotWaitOnDiscovery) {
  auto gate = std::make_shared<absl::Notification>();
  auto entered = std::make_shared<absl::Notification>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  NodeSources sources = node_.Sources();
  sources.discover = [inner = sources.discover, gate, entered, calls] {
    if (calls->fetch_add(1) > 0) {  // every re-discovery, not the first
      if (!entered->HasBeenNotified()) entered->Notify();
      gate->WaitForNotification();
    }
    return inner();
  };
  StartAll(node_.MakeConfig(hca::Mode::kExclusive), std::move(sources));
  ASSERT_TRUE(node_.fixture().AddHca(testing::FixtureCard("mlx5_4", "0000:db:00.0", 1,
                                                          "pci0000:d7")).ok());
  ASSERT_TRUE(entered->WaitForNotificationWithTimeout(kWait)) << "no re-discovery started";
  ASSERT_TRUE(kubelet_->Restart().ok());
  const bool registered = kubelet_->WaitForCurrentRegistration(kWait).has_value();
  gate->Notify();
  EXPECT_TRUE(registered) << "re-registration waited for discovery";
}

// Counts the reads of one file, forwarding every call.
class ReadCountingEnv : public EnvWrapper {
 public:
  ReadCountingEnv(std::shared_ptr<Env> base, std::string counted)
      : EnvWrapper(std::move(base)), counted_(std::move(counted)) {}
  std::optional<std::string> ReadFile(const std::string& path, std::size_t max_bytes) override {
    if (path == counted_) ++reads_;
    return EnvWrapper::ReadFile(path, max_bytes);
  }
  int reads() const { return reads_.load(); }

 private:
  const std::string counted_;
  std::atomic<int> reads_{0};
};

// --nvidia-gpu-list (`nvidia-smi -L`'s output, up to 1 MiB) is read at start and at each health
// poll (so that a changed file is picked up), never by an RPC: GetPreferredAllocation with a GPU
// context and Allocate use the map the last read made.
TEST_F(TrustTest, TheGpuListIsReadAtStartAndAtEachPollNeverPerCall) {
  const std::string list = node_.dir().Sub("nvidia-smi-L.txt");
  std::ofstream(list) << "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)\n";
  const auto info = std::filesystem::path(node_.dir().Sub("node")) /
                    "proc/driver/nvidia/gpus/0000:1b:00.0";
  std::filesystem::create_directories(info);
  std::ofstream(info / "information") << "GPU UUID: \t GPU-aaaa\n";
  auto env = std::make_shared<ReadCountingEnv>(node_.NodeEnv(), list);
  auto pods = std::make_unique<ScriptedPods>();
  // A container holding a GPU, just admitted: GetPreferredAllocation looks its GPUs up.
  pods->Answer({{"default/train/main", {{"nvidia.com/gpu", {"GPU-aaaa"}}}}});
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  config.health_interval = kNever;  // the test's Poll() is the only poll
  config.nvidia_gpu_list = list;
  StartAll(config, node_.Sources(std::move(pods), env));
  ASSERT_EQ(env->reads(), 1) << "read once at start";
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    v1beta1::PreferredAllocationResponse preferred;
    ASSERT_TRUE(stub_->GetPreferredAllocation(&context, PreferredRequest(kPcis, {}, 2), &preferred)
                    .ok());
    v1beta1::AllocateResponse allocated;
    ASSERT_TRUE(Allocate({kPcis[i % 4]}, &allocated).ok());
  }
  EXPECT_EQ(env->reads(), 1) << "an RPC read the GPU list";
  plugin_->node().Poll();
  EXPECT_EQ(env->reads(), 2) << "a health poll did not read the GPU list again";
}

// When a background thread cannot wait any more (poll(2) fails), the plugin does not go on
// serving stale state: Wait() returns the error, and serve exits non-zero so that the pod
// restarts.
TEST_F(TrustTest, AFailingPollIsFatal) {
  auto fail = std::make_shared<std::atomic<bool>>(false);
  NodeSources sources = node_.Sources();
  sources.poll = [fail](struct pollfd* fds, nfds_t n, int timeout) {
    if (fail->load()) {
      errno = ENOMEM;
      return -1;
    }
    return ::poll(fds, n, timeout);
  };
  Config config = node_.MakeConfig(hca::Mode::kExclusive);
  StartAll(config, std::move(sources));
  fail->store(true);
  // The health thread wakes within 50 ms and fails. Wait is bounded by kWait: past it, a
  // watchdog ends it with OK, which fails the test.
  const int bound = ::eventfd(0, EFD_CLOEXEC);
  absl::Notification returned;
  std::thread watchdog([&] {
    if (!returned.WaitForNotificationWithTimeout(kWait)) {
      const std::uint64_t one = 1;
      EXPECT_EQ(::write(bound, &one, sizeof one), static_cast<ssize_t>(sizeof one));
    }
  });
  const absl::Status why = plugin_->Wait(bound);
  returned.Notify();
  watchdog.join();
  ::close(bound);
  EXPECT_FALSE(why.ok()) << "the plugin went on after its poll(2) failed";
  EXPECT_TRUE(absl::StrContains(why.message(), "poll")) << why;
}

// A local client cannot open unbounded ListAndWatch streams (each used to hold a server
// thread): past DevicePluginService::kMaxStreams they are refused with RESOURCE_EXHAUSTED, and
// the kubelet's own stream keeps working.
TEST_F(TrustTest, ListAndWatchStreamsAreCapped) {
  StartAll(node_.MakeConfig(hca::Mode::kExclusive), node_.Sources());
  ASSERT_TRUE(kubelet_->WaitForDevices(AllHealthy(4), kWait).has_value());
  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader;
  };
  std::vector<std::unique_ptr<Stream>> open;
  auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(config_.SocketPath()));
  int refused = 0;
  for (int i = 0; i < DevicePluginService::kMaxStreams + 4; ++i) {
    auto s = std::make_unique<Stream>();
    s->context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    s->reader = stub->ListAndWatch(&s->context, v1beta1::Empty());
    v1beta1::ListAndWatchResponse response;
    if (s->reader->Read(&response)) {
      open.push_back(std::move(s));
      continue;
    }
    const grpc::Status status = s->reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    ++refused;
  }
  // The kubelet's stream is one of the kMaxStreams.
  EXPECT_EQ(static_cast<int>(open.size()), DevicePluginService::kMaxStreams - 1);
  EXPECT_EQ(refused, 5);
  for (auto& s : open) s->context.TryCancel();
  for (auto& s : open) s->reader->Finish();
  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_3", 1, "DOWN").ok());
  EXPECT_TRUE(kubelet_->WaitForDevices(
      [](const Devices& d) { return d.size() == 4 && HealthyCount(d) == 3; }, kWait));
}

// The lifecycle thread's waits, seen through the poll(2) seam: its poll is the one on an inotify
// descriptor (the pods thread, the other one watching a directory, runs only with a
// pod-resources socket, which these tests do not give).
class LifecycleWaits {
 public:
  // The poll(2) to give the plugin; it keeps `waits` alive as long as the plugin's threads may
  // call it.
  static std::function<int(struct pollfd*, nfds_t, int)> Poll(
      std::shared_ptr<LifecycleWaits> waits) {
    return [waits](struct pollfd* fds, nfds_t n, int timeout) {
      return waits->Wait(fds, n, timeout);
    };
  }
  int Wait(struct pollfd* fds, nfds_t n, int timeout) {
    const bool lifecycle = WatchesADirectory(fds, n);
    if (lifecycle) {
      absl::MutexLock lock(&mu_);
      ++entered_;
      waiting_ = true;
      changed_.SignalAll();
    }
    const int ready = ::poll(fds, n, timeout);
    const int saved = errno;
    if (lifecycle) {
      absl::MutexLock lock(&mu_);
      waiting_ = false;
      changed_.SignalAll();
    }
    errno = saved;
    return ready;
  }
  // Waits until the lifecycle thread is in poll(2); how many times it entered it so far.
  std::optional<int> WaitUntilWaiting(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    while (!waiting_) {
      if (changed_.WaitWithDeadline(&mu_, deadline) && !waiting_) return std::nullopt;
    }
    return entered_;
  }
  // Waits until the lifecycle thread entered poll(2) more than `n` times: the iteration after
  // the wait it was in at `n` has run to its end.
  bool WaitUntilEnteredMoreThan(int n, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    while (entered_ <= n) {
      if (changed_.WaitWithDeadline(&mu_, deadline)) return entered_ > n;
    }
    return true;
  }

 private:
  static bool WatchesADirectory(const struct pollfd* fds, nfds_t n) {
    for (nfds_t i = 0; i < n; ++i) {
      char target[64] = {};
      const std::string link = absl::StrCat("/proc/self/fd/", fds[i].fd);
      if (::readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::string(target) == "anon_inode:inotify") {
        return true;
      }
    }
    return false;
  }

  // A CondVar and loops, not Mutex::Await: abseil evaluates an Await condition in the thread
  // that unlocks, where ThreadSanitizer cannot see the lock held (test/sanitizers/).
  absl::Mutex mu_;
  absl::CondVar changed_;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
};

// A chmod of a socket in the kubelet's directory (ours, or kubelet.sock: an admin, a security
// agent, a `chmod -R`) is no kubelet restart: the plugin neither serves again nor registers
// again, and kubelet_restarts_total stays. Before, a file's identity mixed in its change time,
// which a chmod moves: each chmod re-served, re-registered and counted a restart.
TEST_F(TrustTest, AChmodOfASocketIsNoRestart) {
  auto waits = std::make_shared<LifecycleWaits>();
  NodeSources sources = node_.Sources();
  sources.poll = LifecycleWaits::Poll(waits);
  StartAll(node_.MakeConfig(hca::Mode::kExclusive), std::move(sources));
  // The plugin logs each time it serves its socket.
  const std::string serving = absl::StrCat("serving ", config_.resource_name, " on ");
  const int serves = server_log_.Count(serving);
  const int registrations = kubelet_->registrations();
  const std::uint64_t restarts = plugin_->node().resource().metrics().kubelet_restarts.value();
  const std::string kubelet_sock = config_.kubelet_dir + "/kubelet.sock";
  for (const std::string& path : {config_.SocketPath(), kubelet_sock}) {
    SCOPED_TRACE(path);
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << std::strerror(errno);
    ASSERT_EQ(::chmod(path.c_str(), 0640), 0) << std::strerror(errno);
    ASSERT_EQ(::chmod(path.c_str(), st.st_mode & 07777), 0) << std::strerror(errno);
    // The lifecycle thread checks both sockets' identities on each wake-up: once it waits
    // (after the chmod), a file created in the directory wakes it, and its next wait follows
    // the check.
    const std::optional<int> entered = waits->WaitUntilWaiting(absl::Now() + kWait);
    ASSERT_TRUE(entered.has_value());
    const std::string other = absl::StrCat(config_.kubelet_dir, "/not-a-socket-", *entered);
    { std::ofstream touch(other); }
    ASSERT_TRUE(waits->WaitUntilEnteredMoreThan(*entered, absl::Now() + kWait));
    ::unlink(other.c_str());
    EXPECT_EQ(plugin_->node().resource().metrics().kubelet_restarts.value(), restarts);
    EXPECT_EQ(server_log_.Count(serving), serves);
    EXPECT_EQ(kubelet_->registrations(), registrations);
  }
  v1beta1::AllocateResponse response;
  EXPECT_TRUE(Allocate({kPcis[0]}, &response).ok());
}

// The socket is the owner's alone (0600), whatever the umask. Before, its mode came from the
// umask.
TEST_F(TrustTest, SocketModeIsOwnerOnly) {
  const mode_t old = ::umask(0);
  StartAll(node_.MakeConfig(hca::Mode::kExclusive), node_.Sources());
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::stat(config_.SocketPath().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

}  // namespace
}  // namespace rdp::deviceplugin
