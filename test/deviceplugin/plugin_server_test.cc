// The plugin against the kubelet simulator over real unix sockets in a temp dir. Every wait is
// bounded (condition variables / stream reads with deadlines); no test asserts a timing.

#include "deviceplugin/plugin_server.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/base_sink.h"
#include "sim/kubelet_sim.h"
#include "deviceplugin/probe.h"
#include "proto/health.grpc.pb.h"
#include "serving/unix_server.h"
#include "test/deviceplugin/test_node.h"
#include "test/support/log_lines.h"

namespace rdp::deviceplugin {
namespace {

using testing::TestNode;
using testing::WaitUntil;
using Devices = KubeletSim::Devices;

constexpr absl::Duration kWait = absl::Seconds(10);
// What the plugin logs once the kubelet has answered a Register, its metric counted.
constexpr char kRegistered[] = "Registered device plugin with Kubelet";

std::map<std::string, std::string> Health(const Devices& d) {
  std::map<std::string, std::string> out;
  for (const auto& x : d) out[x.id()] = x.health();
  return out;
}

auto HealthIs(const std::string& id, const std::string& health) {
  return [id, health](const Devices& d) {
    auto h = Health(d);
    return h.count(id) && h[id] == health;
  };
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The lifecycle thread's polls, counted: how many times it has entered poll(2) on the kubelet
// directory's inotify descriptor, and whether it is inside one now. Lets a test wait until that
// thread has handled every event and gone back to waiting, without guessing at time.
class LifecyclePolls {
 public:
  // The poll(2) the plugin's threads call (NodeSources::poll); it keeps `polls` alive as long
  // as the plugin's threads may call it.
  static std::function<int(struct pollfd*, nfds_t, int)> Poll(
      std::shared_ptr<LifecyclePolls> polls) {
    return [polls](struct pollfd* fds, nfds_t n, int timeout) {
      const bool ours = polls->Watches(fds, n);
      if (ours) polls->Update(+1, true);
      const int r = ::poll(fds, n, timeout);
      if (ours) polls->Update(0, false);
      if (ours) polls->PassGate();
      return r;
    };
  }
  // While the gate is closed, the thread stops as it returns from poll, before it reads any
  // event: a test can then queue several events and have them read in one go.
  void CloseGate() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_open_ = false;
  }
  void OpenGate() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_open_ = true;
    cv_.notify_all();
  }
  void Track(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    fd_ = fd;
  }
  // Waits until the thread has entered poll more than `entries` times and is inside one with
  // no event left unread (each entry and return notifies; an unread event ends the poll).
  bool WaitForWaitingAfter(int entries, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
      int unread = 0;
      return entries_ > entries && inside_ && ::ioctl(fd_, FIONREAD, &unread) == 0 && unread == 0;
    });
  }
  int entries() {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_;
  }

 private:
  bool Watches(const struct pollfd* fds, nfds_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    for (nfds_t i = 0; i < n; ++i) {
      if (fd_ >= 0 && fds[i].fd == fd_) return true;
    }
    return false;
  }
  void PassGate() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return gate_open_; });
  }
  void Update(int add, bool inside) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_ += add;
    inside_ = inside;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int fd_ = -1;
  int entries_ = 0;
  bool inside_ = false;
  bool gate_open_ = true;
};

// Runs an action, once, on the thread that logs a line containing `text`, at the moment it logs
// it: a test can act at a precise point of the plugin's own sequence.
class ActOnLogLine : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void Arm(std::string text, std::function<void()> action) {
    std::lock_guard<std::mutex> lock(armed_mu_);
    text_ = std::move(text);
    action_ = std::move(action);
  }
  void Disarm() { Arm("", nullptr); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::function<void()> action;
    {
      std::lock_guard<std::mutex> lock(armed_mu_);
      if (!action_ || !absl::StrContains(absl::string_view(msg.payload.data(), msg.payload.size()),
                                         text_)) {
        return;
      }
      action.swap(action_);
    }
    action();
  }
  void flush_() override {}

 private:
  std::mutex armed_mu_;
  std::string text_;
  std::function<void()> action_;
};

// This process's inotify descriptor with a watch on `dir`, from /proc/self/fdinfo
// ("inotify wd:1 ino:<hex> sdev:..."); -1 when there is none.
int InotifyWatching(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return -1;
  const std::string ino = absl::StrCat(" ino:", absl::Hex(st.st_ino), " ");
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fdinfo")) {
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("inotify wd:", 0) == 0 && line.find(ino) != std::string::npos) {
        return std::stoi(e.path().filename().string());
      }
    }
  }
  return -1;
}

class PluginServerTest : public ::testing::Test {
 protected:
  void StartAll(hca::Mode mode, std::unique_ptr<PodResourcesSource> pods = nullptr,
                const std::function<void(Config&)>& tune = nullptr) {
    config_ = node_.MakeConfig(mode);
    if (tune) tune(config_);
    kubelet_ = std::make_unique<KubeletSim>(config_.kubelet_dir);
    ASSERT_TRUE(kubelet_->Start().ok());
    plugin_ = std::make_unique<PluginServer>(config_, node_.Sources(std::move(pods)));
    ASSERT_TRUE(plugin_->Start().ok());
    ASSERT_TRUE(kubelet_->WaitForRegistration(0, kWait).has_value());
    stub_ = kubelet_->PluginStub();
  }

  // The plugin in exclusive mode with its lifecycle thread's polls counted by `polls` and no
  // periodic check (only events move that thread), registered, and waiting; *fd (when asked) is
  // the inotify descriptor it watches the kubelet directory with.
  void StartWithCountedPolls(std::shared_ptr<LifecyclePolls> polls, int* fd) {
    config_ = node_.MakeConfig(hca::Mode::kExclusive);
    config_.register_backoff_max = absl::Hours(1);
    kubelet_ = std::make_unique<KubeletSim>(config_.kubelet_dir);
    ASSERT_TRUE(kubelet_->Start().ok());
    NodeSources sources = node_.Sources();
    sources.poll = LifecyclePolls::Poll(polls);
    plugin_ = std::make_unique<PluginServer>(config_, std::move(sources));
    ASSERT_TRUE(plugin_->Start().ok());
    ASSERT_TRUE(kubelet_->WaitForRegistration(0, kWait).has_value());
    const int watching = InotifyWatching(config_.kubelet_dir);
    ASSERT_GE(watching, 0) << "no inotify watch on " << config_.kubelet_dir;
    polls->Track(watching);
    if (fd != nullptr) *fd = watching;
    // A file of no meaning to the plugin: the thread wakes, ignores it and waits again, counted.
    { std::ofstream(config_.kubelet_dir + "/unrelated") << "x"; }
    ASSERT_TRUE(polls->WaitForWaitingAfter(0, kWait));
  }

  grpc::Status Allocate(const std::vector<std::vector<std::string>>& containers,
                        v1beta1::AllocateResponse* response) {
    v1beta1::AllocateRequest request;
    for (const auto& ids : containers) {
      auto* c = request.add_container_requests();
      for (const auto& id : ids) c->add_devices_ids(id);
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    return stub_->Allocate(&context, request, response);
  }

  grpc::Status Prefer(const std::vector<std::string>& available,
                      const std::vector<std::string>& must, int size,
                      std::vector<std::string>* out) {
    v1beta1::PreferredAllocationRequest request = PreferredRequest(available, must, size);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    v1beta1::PreferredAllocationResponse response;
    grpc::Status s = stub_->GetPreferredAllocation(&context, request, &response);
    if (s.ok() && out != nullptr) {
      out->assign(response.container_responses(0).deviceids().begin(),
                  response.container_responses(0).deviceids().end());
    }
    return s;
  }

  // Times a plugin of this test served its socket so far (it logs each).
  int Serves() const {
    return server_log_.Count(absl::StrCat("serving ", config_.resource_name, " on "));
  }

  TestNode node_;
  // Made before the plugins, whose threads log on "server", and destroyed after them.
  rdp::testing::LogLines server_log_{"server"};
  Config config_;
  std::unique_ptr<KubeletSim> kubelet_;
  std::unique_ptr<PluginServer> plugin_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

const std::vector<std::string> kPcis = {"0000:1a:00.0", "0000:3a:00.0", "0000:9a:00.0",
                                        "0000:ba:00.0"};

TEST_F(PluginServerTest, RegistersWithTheKubelet) {
  StartAll(hca::Mode::kExclusive);
  auto reg = kubelet_->WaitForRegistration(0, kWait);
  EXPECT_EQ(reg->version, "v1beta1");
  EXPECT_EQ(reg->endpoint, "rdma-hca.sock");
  EXPECT_EQ(reg->resource_name, "rdma/hca");
  EXPECT_TRUE(reg->get_preferred_allocation_available);
  EXPECT_FALSE(reg->pre_start_required);
  EXPECT_TRUE(Exists(config_.SocketPath()));

  grpc::ClientContext context;
  v1beta1::DevicePluginOptions options;
  ASSERT_TRUE(stub_->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok());
  EXPECT_TRUE(options.get_preferred_allocation_available());
  EXPECT_FALSE(options.pre_start_required());
  grpc::ClientContext pre;
  v1beta1::PreStartContainerResponse pre_response;
  EXPECT_TRUE(stub_->PreStartContainer(&pre, v1beta1::PreStartContainerRequest(), &pre_response)
                  .ok());
  EXPECT_TRUE(Probe(config_.SocketPath(), absl::Seconds(5)).ok());
}

TEST_F(PluginServerTest, RegistersWhenTheKubeletComesLater) {
  config_ = node_.MakeConfig(hca::Mode::kShared);
  plugin_ = std::make_unique<PluginServer>(config_, node_.Sources());
  ASSERT_TRUE(plugin_->Start().ok());
  KubeletSim kubelet(config_.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  EXPECT_TRUE(kubelet.WaitForRegistration(0, kWait).has_value());
}

TEST_F(PluginServerTest, ListAndWatchExclusive) {
  StartAll(hca::Mode::kExclusive);
  auto devices = kubelet_->WaitForDevices([](const Devices& d) { return d.size() == 4; }, kWait);
  ASSERT_TRUE(devices.has_value());
  for (size_t i = 0; i < devices->size(); ++i) {
    const auto& d = (*devices)[i];
    EXPECT_EQ(d.id(), kPcis[i]);
    EXPECT_EQ(d.health(), "Healthy");
    ASSERT_EQ(d.topology().nodes_size(), 1);
    EXPECT_EQ(d.topology().nodes(0).id(), i < 2 ? 0 : 1);
  }
}

TEST_F(PluginServerTest, ListAndWatchShared) {
  StartAll(hca::Mode::kShared);
  auto devices = kubelet_->WaitForDevices([](const Devices& d) { return d.size() == 1000; }, kWait);
  ASSERT_TRUE(devices.has_value());
  std::set<std::string> ids;
  for (const auto& d : *devices) {
    ids.insert(d.id());
    EXPECT_EQ(d.health(), "Healthy");
    EXPECT_FALSE(d.has_topology());
  }
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(PluginServerNumaTest, NoTopologyWhenOneNumaIsUnknown) {
  auto cards = testing::FourCards();
  cards[2].numa = -1;
  TestNode node(cards);
  Config config = node.MakeConfig(hca::Mode::kExclusive);
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  PluginServer plugin(config, node.Sources());
  ASSERT_TRUE(plugin.Start().ok());
  auto devices = kubelet.WaitForDevices([](const Devices& d) { return d.size() == 4; }, kWait);
  ASSERT_TRUE(devices.has_value());
  for (const auto& d : *devices) EXPECT_FALSE(d.has_topology()) << d.id();
}

// A dual-port HCA with one port uncabled (DOWN) is offered, and used through its ACTIVE port:
// NCCL_IB_HCA names that port. With no ACTIVE port left it is Unhealthy. A regression guard: every
// port used to have to be ACTIVE, so such a card, a common way to cable ConnectX cards, was never
// offered.
TEST(PluginServerPortsTest, DualPortHcaWithOneUncabledPortIsOffered) {
  auto cards = testing::FourCards();
  cards[0].ports.resize(2);
  cards[0].ports[1].number = 2;
  cards[0].ports[1].state = "DOWN";
  cards[0].ports[1].phys_state = "Polling";
  TestNode node(cards);
  Config config = node.MakeConfig(hca::Mode::kExclusive);
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  PluginServer plugin(config, node.Sources());
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(kubelet.WaitForDevices(HealthIs("0000:1a:00.0", "Healthy"), kWait))
      << "a card with one ACTIVE port of two is not offered";
  ASSERT_TRUE(kubelet.WaitForRegistration(0, kWait).has_value());
  auto stub = kubelet.PluginStub();
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids("0000:1a:00.0");
  request.add_container_requests()->add_devices_ids("0000:3a:00.0");
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(stub->Allocate(&context, request, &response).ok());
  EXPECT_EQ(response.container_responses(0).envs().at("NCCL_IB_HCA"), "=mlx5_0:1");
  EXPECT_EQ(response.container_responses(0).envs().at("RDMA_HCA_NAMES"), "mlx5_0");
  EXPECT_EQ(response.container_responses(1).envs().at("NCCL_IB_HCA"), "=mlx5_1")
      << "an HCA whose every port is ACTIVE is named alone";

  ASSERT_TRUE(node.fixture().SetPortState("mlx5_0", 1, "DOWN").ok());
  EXPECT_TRUE(kubelet.WaitForDevices(HealthIs("0000:1a:00.0", "Unhealthy"), kWait));
}

TEST_F(PluginServerTest, SeveralStreamsAllSeeChanges) {
  StartAll(hca::Mode::kExclusive);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>>> readers;
  for (int i = 0; i < 3; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    readers.push_back(stub_->ListAndWatch(contexts.back().get(), v1beta1::Empty()));
    v1beta1::ListAndWatchResponse first;
    ASSERT_TRUE(readers.back()->Read(&first));
    EXPECT_EQ(first.devices_size(), 4);
  }
  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_1", 1, "DOWN").ok());
  for (auto& reader : readers) {
    v1beta1::ListAndWatchResponse next;
    bool saw_unhealthy = false;
    while (!saw_unhealthy && reader->Read(&next)) {
      saw_unhealthy = Health({next.devices().begin(), next.devices().end()})["0000:3a:00.0"] ==
                      "Unhealthy";
    }
    EXPECT_TRUE(saw_unhealthy);
  }
  for (auto& c : contexts) c->TryCancel();
  for (auto& r : readers) r->Finish();
}

TEST_F(PluginServerTest, PortDownIsUnhealthyThenRecovers) {
  StartAll(hca::Mode::kExclusive);
  ASSERT_TRUE(kubelet_->WaitForDevices(HealthIs("0000:3a:00.0", "Healthy"), kWait));
  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_1", 1, "DOWN").ok());
  auto down = kubelet_->WaitForDevices(HealthIs("0000:3a:00.0", "Unhealthy"), kWait);
  ASSERT_TRUE(down.has_value());
  EXPECT_EQ(Health(*down)["0000:1a:00.0"], "Healthy");
  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_1", 1, "ACTIVE").ok());
  EXPECT_TRUE(kubelet_->WaitForDevices(HealthIs("0000:3a:00.0", "Healthy"), kWait));
}

TEST_F(PluginServerTest, SharedStaysHealthyWhileOneHcaIs) {
  StartAll(hca::Mode::kShared);
  for (const char* name : {"mlx5_0", "mlx5_1", "mlx5_2"}) {
    ASSERT_TRUE(node_.fixture().SetPortState(name, 1, "DOWN").ok());
  }
  ASSERT_TRUE(node_.fixture().RemoveUverbs("mlx5_3").ok());
  EXPECT_TRUE(kubelet_->WaitForDevices(HealthIs("shared-0", "Unhealthy"), kWait));
  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_2", 1, "ACTIVE").ok());
  EXPECT_TRUE(kubelet_->WaitForDevices(HealthIs("shared-999", "Healthy"), kWait));
}

TEST_F(PluginServerTest, HcaRemovedStaysListedUnhealthyAndReturns) {
  StartAll(hca::Mode::kExclusive);
  ASSERT_TRUE(node_.fixture().RemoveHca("mlx5_2").ok());
  auto gone = kubelet_->WaitForDevices(HealthIs("0000:9a:00.0", "Unhealthy"), kWait);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->size(), 4u);
  // Still listed with its NUMA node.
  for (const auto& d : *gone) EXPECT_TRUE(d.has_topology()) << d.id();
  // Allocate of a vanished device is refused: the ID is valid, the HCA is not there.
  v1beta1::AllocateResponse response;
  EXPECT_EQ(Allocate({{"0000:9a:00.0"}}, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  ASSERT_TRUE(node_.fixture().AddHca(testing::FixtureCard("mlx5_2", "0000:9a:00.0", 1,
                                                          "pci0000:97")).ok());
  ASSERT_TRUE(kubelet_->WaitForDevices(HealthIs("0000:9a:00.0", "Healthy"), kWait));
  ASSERT_TRUE(Allocate({{"0000:9a:00.0"}}, &response).ok());
  // Re-plugged with a new uverbs number: the allocation uses the fresh snapshot.
  EXPECT_EQ(response.container_responses(0).devices(0).host_path(), "/dev/infiniband/uverbs4");
}

TEST_F(PluginServerTest, HcaHotAdded) {
  StartAll(hca::Mode::kExclusive);
  ASSERT_TRUE(node_.fixture().AddHca(testing::FixtureCard("mlx5_4", "0000:cc:00.0", 1,
                                                          "pci0000:c8")).ok());
  auto added = kubelet_->WaitForDevices(HealthIs("0000:cc:00.0", "Healthy"), kWait);
  ASSERT_TRUE(added.has_value());
  EXPECT_EQ(added->size(), 5u);
}

TEST_F(PluginServerTest, TwentyKubeletRestarts) {
  StartAll(hca::Mode::kExclusive);
  for (int i = 1; i <= 20; ++i) {
    ASSERT_TRUE(kubelet_->Restart().ok());
    // The restarted kubelet (not the previous one) got a registration.
    auto reg = kubelet_->WaitForCurrentRegistration(kWait);
    ASSERT_TRUE(reg.has_value()) << "restart " << i;
    EXPECT_EQ(reg->generation, i + 1);
  }
  EXPECT_TRUE(kubelet_->WaitForDevices([](const Devices& d) { return d.size() == 4; }, kWait));
  const int received = kubelet_->registrations();
  EXPECT_GE(received, 21);
  // The kubelet counts a Register when it answers; the plugin once the answer is back, before it
  // logs kRegistered. Wait for the plugin's line of each (the metric was read while the last one
  // was between the two once, under TSan: 20 against 21).
  ASSERT_TRUE(server_log_.WaitForCount(kRegistered, received, kWait));
  // What Prometheus sees of it (docs/metrics.md): each restart seen, each registration made.
  EXPECT_GE(plugin_->node().resource().metrics().kubelet_restarts.value(), 20u);
  EXPECT_EQ(plugin_->node().resource().metrics().registrations.value(),
            static_cast<std::uint64_t>(received));
  EXPECT_TRUE(Exists(config_.SocketPath()));
  stub_ = kubelet_->PluginStub();
  v1beta1::AllocateResponse response;
  EXPECT_TRUE(Allocate({{"0000:1a:00.0"}}, &response).ok());
}

// A service beside DevicePlugin: answers Check with SERVING.
class ServingHealth final : public grpc::health::v1::Health::CallbackService {
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest*,
                                  grpc::health::v1::HealthCheckResponse* response) override {
    response->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

grpc::Status CheckHealth(const std::string& socket) {
  auto stub = grpc::health::v1::Health::NewStub(serving::UnixChannel(socket));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status s = stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  if (s.ok() && response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "not SERVING");
  }
  return s;
}

// The benchmarks' hook (bench_rpc's payload floor): a service given as also_served is served on
// the plugin's socket beside DevicePlugin, again each time the socket is served (a kubelet
// restart); a plugin given none serves nothing else there.
TEST_F(PluginServerTest, AlsoServedServicesShareThePluginsSocket) {
  StartAll(hca::Mode::kExclusive);
  EXPECT_EQ(CheckHealth(config_.SocketPath()).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  plugin_.reset();
  kubelet_.reset();
  const int served = Serves();

  ServingHealth health;
  kubelet_ = std::make_unique<KubeletSim>(config_.kubelet_dir);
  ASSERT_TRUE(kubelet_->Start().ok());
  plugin_ = std::make_unique<PluginServer>(config_, node_.Sources(),
                                           std::vector<resources::Resource>{},
                                           std::vector<grpc::Service*>{&health});
  ASSERT_TRUE(plugin_->Start().ok());
  ASSERT_TRUE(kubelet_->WaitForRegistration(0, kWait).has_value());
  EXPECT_TRUE(CheckHealth(config_.SocketPath()).ok());
  ASSERT_TRUE(kubelet_->Restart().ok());
  ASSERT_TRUE(kubelet_->WaitForCurrentRegistration(kWait).has_value());
  EXPECT_EQ(Serves(), served + 2);
  EXPECT_TRUE(CheckHealth(config_.SocketPath()).ok());
  stub_ = kubelet_->PluginStub();
  v1beta1::AllocateResponse response;
  EXPECT_TRUE(Allocate({{"0000:1a:00.0"}}, &response).ok());
  plugin_.reset();  // stopped before `health` goes
}

// The kubelet's directory removed and made again, as a node's cleanup or a kubelet reinstall
// does. The new directory often gets the old one's inode number; the lost watch must still be
// replaced at once. The periodic check is an hour away here, so only the watch can see each
// restart in time.
TEST_F(PluginServerTest, KubeletDirRemovedAndMadeAgain) {
  StartAll(hca::Mode::kExclusive, nullptr, [](Config& c) { c.register_backoff_max = absl::Hours(1); });
  for (int i = 1; i <= 10; ++i) {
    kubelet_->Stop();
    // Moved aside first, then removed: the plugin serves again as soon as its socket goes, and
    // must not be able to write into what is being removed (at most a bind already under way
    // lands in the moved directory, so a second pass empties it).
    const std::string aside = config_.kubelet_dir + ".removed";
    ASSERT_EQ(::rename(config_.kubelet_dir.c_str(), aside.c_str()), 0) << std::strerror(errno);
    std::error_code ec;
    for (int pass = 0; pass < 3 && std::filesystem::exists(aside); ++pass) {
      std::filesystem::remove_all(aside, ec);
    }
    ASSERT_FALSE(std::filesystem::exists(aside)) << ec.message();
    std::filesystem::create_directories(config_.kubelet_dir, ec);
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(kubelet_->Start().ok());
    auto reg = kubelet_->WaitForCurrentRegistration(kWait);
    ASSERT_TRUE(reg.has_value()) << "directory made again " << i << " times";
  }
  stub_ = kubelet_->PluginStub();
  v1beta1::AllocateResponse response;
  EXPECT_TRUE(Allocate({{"0000:1a:00.0"}}, &response).ok());
}

// A kubelet directory replaced (moved aside, made again, a new kubelet in it) is one restart:
// one serve, one registration. Seeing the replacement, the plugin watches the new directory, and
// removing the old watch queues an IN_IGNORED for it; the old code read that late event as the
// new directory's watch lost and restarted a second time, re-registering under the kubelet's
// calls (the CI flake of KubeletDirRemovedAndMadeAgain). Every step waits until the lifecycle
// thread has read all its events and waits again, so nothing depends on timing.
TEST_F(PluginServerTest, AReplacedKubeletDirectoryIsOneRestart) {
  auto polls = std::make_shared<LifecyclePolls>();
  int fd = -1;
  ASSERT_NO_FATAL_FAILURE(StartWithCountedPolls(polls, &fd));

  const int serves = Serves();
  const std::uint64_t registrations = plugin_->node().resource().metrics().registrations.value();
  const std::uint64_t restarts = plugin_->node().resource().metrics().kubelet_restarts.value();
  int entries = polls->entries();
  kubelet_->Stop();  // kubelet.sock goes: a kubelet on its way down, no restart yet
  ASSERT_TRUE(polls->WaitForWaitingAfter(entries, kWait));
  EXPECT_EQ(plugin_->node().resource().metrics().kubelet_restarts.value(), restarts);

  const std::string aside = config_.kubelet_dir + ".old";
  ASSERT_EQ(::rename(config_.kubelet_dir.c_str(), aside.c_str()), 0) << std::strerror(errno);
  ASSERT_TRUE(std::filesystem::create_directory(config_.kubelet_dir));
  ASSERT_TRUE(kubelet_->Start().ok());
  entries = polls->entries();
  // An event in the old directory, still watched, wakes the thread: it finds the directory
  // replaced and its socket gone.
  { std::ofstream(aside + "/poke") << "x"; }
  ASSERT_TRUE(kubelet_->WaitForCurrentRegistration(kWait).has_value());
  ASSERT_TRUE(polls->WaitForWaitingAfter(entries, kWait));

  EXPECT_EQ(plugin_->node().resource().metrics().kubelet_restarts.value(), restarts + 1);
  EXPECT_EQ(Serves(), serves + 1);
  EXPECT_EQ(plugin_->node().resource().metrics().registrations.value(), registrations + 1);
  // The new directory is the one watched: a kubelet restart in it is still seen at once.
  EXPECT_EQ(InotifyWatching(config_.kubelet_dir), fd);
  ASSERT_TRUE(kubelet_->Restart().ok());
  EXPECT_TRUE(kubelet_->WaitForCurrentRegistration(kWait).has_value());
  EXPECT_GE(plugin_->node().resource().metrics().kubelet_restarts.value(), restarts + 2);
}

// The kubelet directory gone, and back (with a new kubelet in it) between the plugin's check of
// its watch and its serving again: the plugin must watch the directory before it registers.
// Registered, only an event wakes it; the old code registered with no watch at all and missed
// every later kubelet restart (KubeletDirRemovedAndMadeAgain's rare "directory made again N
// times" under load). The events, the lost watch's included, are queued while the thread is held
// at its poll, and the directory comes back from inside the plugin's "kubelet restart detected"
// log line, which it writes after that check and before it serves.
TEST_F(PluginServerTest, ADirectoryBackDuringARestartIsWatchedBeforeRegistering) {
  auto polls = std::make_shared<LifecyclePolls>();
  auto sink = std::make_shared<ActOnLogLine>();
  std::shared_ptr<spdlog::logger> log = rdp::Logger("server");
  log->sinks().push_back(sink);
  struct Disarm {
    ActOnLogLine* s;
    ~Disarm() { s->Disarm(); }
  } disarm{sink.get()};
  ASSERT_NO_FATAL_FAILURE(StartWithCountedPolls(polls, nullptr));

  int registrations = 0;
  {
    polls->CloseGate();
    struct Open {
      LifecyclePolls* p;
      ~Open() { p->OpenGate(); }
    } open{polls.get()};
    // Held at the gate: the kubelet stops and its directory goes, all queued. Our socket is
    // moved out first: a bound socket pins its directory, whose watch would then end only when
    // the plugin closes that socket; here it ends at once, as when the plugin had closed it
    // already (a serve that failed a moment before).
    kubelet_->Stop();
    const std::string aside = config_.kubelet_dir + ".old";
    ASSERT_EQ(::rename(config_.kubelet_dir.c_str(), aside.c_str()), 0) << std::strerror(errno);
    const std::string moved = aside + ".sock";
    ASSERT_EQ(::rename((aside + "/" + config_.socket_name).c_str(), moved.c_str()), 0)
        << std::strerror(errno);
    std::error_code ec;
    std::filesystem::remove_all(aside, ec);
    ASSERT_FALSE(ec) << ec.message();
    KubeletSim* kubelet = kubelet_.get();
    const std::string dir = config_.kubelet_dir;
    registrations = kubelet_->registrations();
    sink->Arm("kubelet restart detected", [kubelet, dir] {
      std::error_code mk;
      std::filesystem::create_directory(dir, mk);
      (void)kubelet->Start();
    });
  }
  ASSERT_TRUE(kubelet_->WaitForRegistration(registrations, kWait).has_value());
  EXPECT_GE(InotifyWatching(config_.kubelet_dir), 0) << "registered, watching nothing";
  // The next kubelet restart is seen.
  ASSERT_TRUE(kubelet_->Restart().ok());
  EXPECT_TRUE(kubelet_->WaitForCurrentRegistration(kWait).has_value());
  plugin_->Stop();
  auto& sinks = log->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
}

TEST_F(PluginServerTest, OurSocketRemovedServesAgain) {
  StartAll(hca::Mode::kShared);
  const int serves = Serves();
  ASSERT_EQ(::unlink(config_.SocketPath().c_str()), 0);
  ASSERT_TRUE(kubelet_->WaitForRegistration(1, kWait).has_value());
  EXPECT_GT(Serves(), serves);
  EXPECT_TRUE(Probe(config_.SocketPath(), absl::Seconds(5)).ok());
}

TEST_F(PluginServerTest, StopEndsStreamsAndRemovesTheSocket) {
  StartAll(hca::Mode::kExclusive);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  auto reader = stub_->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse r;
  ASSERT_TRUE(reader->Read(&r));
  plugin_->Stop();
  while (reader->Read(&r)) {
  }
  EXPECT_TRUE(reader->Finish().ok());  // ended by the server, not by the deadline
  EXPECT_FALSE(Exists(config_.SocketPath()));
  EXPECT_FALSE(Probe(config_.SocketPath(), absl::Milliseconds(200)).ok());
}

TEST_F(PluginServerTest, AllocateExclusive) {
  StartAll(hca::Mode::kExclusive);
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(Allocate({{"0000:ba:00.0", "0000:1a:00.0"}, {"0000:3a:00.0"}}, &response).ok());
  ASSERT_EQ(response.container_responses_size(), 2);
  const auto& c0 = response.container_responses(0);
  std::vector<std::string> paths;
  for (const auto& d : c0.devices()) {
    EXPECT_EQ(d.host_path(), d.container_path());
    EXPECT_EQ(d.permissions(), "rw");
    paths.push_back(d.host_path());
  }
  // PCI address order, whatever order the kubelet names them in.
  EXPECT_EQ(paths, (std::vector<std::string>{
                       "/dev/infiniband/uverbs0", "/dev/infiniband/umad0",
                       "/dev/infiniband/issm0", "/dev/infiniband/uverbs3",
                       "/dev/infiniband/umad3", "/dev/infiniband/issm3",
                       "/dev/infiniband/rdma_cm"}));
  EXPECT_EQ(c0.envs().at("NCCL_IB_HCA"), "=mlx5_0,mlx5_3");
  EXPECT_EQ(c0.envs().at("RDMA_HCA_NAMES"), "mlx5_0,mlx5_3");
  EXPECT_EQ(c0.envs().at("RDMA_HCA_PCI"), "0000:1a:00.0,0000:ba:00.0");
  EXPECT_EQ(c0.envs().count("NCCL_IB_GID_INDEX"), 0u);  // InfiniBand
  EXPECT_EQ(c0.mounts_size(), 0);                       // no --allocation-dir
  EXPECT_EQ(response.container_responses(1).envs().at("NCCL_IB_HCA"), "=mlx5_1");
}

// Two containers holding the same HCAs, named in different orders: the same variables and the
// same allocation file, mounted read-only at /etc/rdma/allocation.json.
TEST_F(PluginServerTest, SameHcasSameValuesAndOneAllocationFile) {
  const std::string dir = node_.dir().Sub("allocations");
  ASSERT_TRUE(std::filesystem::create_directories(dir));
  StartAll(hca::Mode::kExclusive, nullptr, [&](Config& c) { c.allocation_dir = dir; });
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(
      Allocate({{"0000:ba:00.0", "0000:1a:00.0"}, {"0000:1a:00.0", "0000:ba:00.0"}, {"0000:3a:00.0"}},
               &response)
          .ok());
  ASSERT_EQ(response.container_responses_size(), 3);
  const auto& a = response.container_responses(0);
  const auto& b = response.container_responses(1);
  using Envs = std::map<std::string, std::string>;
  EXPECT_EQ(Envs(a.envs().begin(), a.envs().end()), Envs(b.envs().begin(), b.envs().end()));
  ASSERT_EQ(a.mounts_size(), 1);
  ASSERT_EQ(b.mounts_size(), 1);
  EXPECT_EQ(a.mounts(0).container_path(), "/etc/rdma/allocation.json");
  EXPECT_TRUE(a.mounts(0).read_only());
  EXPECT_EQ(a.mounts(0).host_path(), b.mounts(0).host_path());
  EXPECT_EQ(std::filesystem::path(a.mounts(0).host_path()).parent_path(), dir);
  std::ifstream in(a.mounts(0).host_path());
  const nlohmann::json file = nlohmann::json::parse(in);
  ASSERT_EQ(file["hcas"].size(), 2u);
  EXPECT_EQ(file["hcas"][0]["pci"], "0000:1a:00.0");
  EXPECT_EQ(file["hcas"][1]["name"], "mlx5_3");
  EXPECT_EQ(file["env"]["NCCL_IB_HCA"], "=mlx5_0,mlx5_3");
  const auto& c = response.container_responses(2);
  ASSERT_EQ(c.mounts_size(), 1);
  EXPECT_NE(c.mounts(0).host_path(), a.mounts(0).host_path());
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 2u);
}

// Without --allocation-dir Allocate builds no allocation file. With one, the file follows every
// change of the HCAs: a port of a dual-port HCA going DOWN (the health poll patches the
// snapshot) gives a new file naming it; back ACTIVE, the first file again.
TEST(AllocationFileTest, NoneWithoutADirAndNeverStaleWithOne) {
  sim::FixtureHca card = testing::FixtureCard("mlx5_0", "0000:1a:00.0", 0, "pci0000:15");
  card.ports = {sim::FixturePort{}, sim::FixturePort{}};
  card.ports[1].number = 2;
  testing::TestNode node({card});
  {
    NodeState state(node.MakeConfig(hca::Mode::kExclusive), node.Sources());
    ASSERT_TRUE(state.Init().ok());
    absl::StatusOr<node::Grant> got = state.resource().Allocate({"0000:1a:00.0"});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->allocation.file, "");
    EXPECT_EQ(got->file_mount, "");
    EXPECT_EQ(got->allocation.envs.at("NCCL_IB_HCA"), "=mlx5_0");
  }
  const std::string dir = node.dir().Sub("allocations");
  ASSERT_TRUE(std::filesystem::create_directories(dir));
  Config config = node.MakeConfig(hca::Mode::kExclusive);
  config.allocation_dir = dir;
  NodeState state(config, node.Sources());
  ASSERT_TRUE(state.Init().ok());
  auto file = [&state]() -> std::string {
    absl::StatusOr<node::Grant> got = state.resource().Allocate({"0000:1a:00.0"});
    if (!got.ok() || got->file_mount.empty()) return "no file: " + got.status().ToString();
    std::ifstream in(got->file_mount);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(content, got->allocation.file);
    return content;
  };
  const std::string both = file();
  EXPECT_EQ(nlohmann::json::parse(both)["env"]["NCCL_IB_HCA"], "=mlx5_0") << both;
  EXPECT_EQ(file(), both);
  ASSERT_TRUE(node.fixture().SetPortState("mlx5_0", 2, "DOWN").ok());
  state.Poll();
  const std::string one = file();
  EXPECT_NE(one, both);
  const nlohmann::json parsed = nlohmann::json::parse(one);
  EXPECT_EQ(parsed["env"]["NCCL_IB_HCA"], "=mlx5_0:1") << one;
  EXPECT_EQ(parsed["hcas"][0]["ports"][1]["state"], "DOWN") << one;
  ASSERT_TRUE(node.fixture().SetPortState("mlx5_0", 2, "ACTIVE").ok());
  state.Poll();
  EXPECT_EQ(file(), both);
}

// A GetPreferredAllocation case: the request and its answer, or the message of its refusal.
struct PreferCase {
  std::vector<std::string> available, must;
  int size;
  std::vector<std::string> answer;
  std::string refused;  // "" when answered
};

void ExpectAnswers(const NodeState& state, const std::vector<PreferCase>& cases) {
  for (const PreferCase& c : cases) {
    const std::vector<std::string_view> available(c.available.begin(), c.available.end());
    const std::vector<std::string_view> must(c.must.begin(), c.must.end());
    const absl::StatusOr<std::vector<std::string>> got = state.resource().Prefer(available, must, c.size);
    const std::string what = absl::StrCat("[", absl::StrJoin(c.available, ","), "] must [",
                                          absl::StrJoin(c.must, ","), "] size ", c.size);
    if (c.refused.empty()) {
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      EXPECT_EQ(*got, c.answer) << what;
    } else {
      EXPECT_EQ(got.status(), absl::InvalidArgumentError(c.refused)) << what;
    }
  }
}

// Shared mode: the kubelet's usual request, must_include, IDs not offered (above
// --shared-devices, another spelling), malformed requests.
TEST(NodeStatePreferTest, SharedAnswers) {
  testing::TestNode node;
  Config config = node.MakeConfig(hca::Mode::kShared);
  config.shared_devices = 100;
  NodeState state(config, node.Sources());
  ASSERT_TRUE(state.Init().ok());
  std::vector<std::string> all;
  for (int i = 99; i >= 0; --i) all.push_back(SharedId(i));
  ExpectAnswers(state, {
      {all, {}, 8, {"shared-0", "shared-1", "shared-2", "shared-3", "shared-4", "shared-5",
                    "shared-6", "shared-7"}, ""},
      {all, {"shared-50", "shared-7"}, 3, {"shared-0", "shared-7", "shared-50"}, ""},
      // One above the count: left out while the offered ones suffice.
      {{"shared-3", "shared-100", "shared-1"}, {}, 2, {"shared-1", "shared-3"}, ""},
      {{"shared-3", "shared-100", "shared-1"}, {}, 3, {"shared-1", "shared-3", "shared-100"}, ""},
      // Another spelling, which the kubelet must include: kept as given.
      {{"shared-3", "shared-01", "shared-1"}, {"shared-01"}, 2, {"shared-01", "shared-1"}, ""},
      {{"shared-3", "shared-3"}, {}, 1, {}, "duplicate ID in available: shared-3"},
      {{"shared-3", ""}, {}, 1, {}, "empty ID in available"},
      {{"shared-3", "shared-4"}, {"shared-5"}, 1, {}, "must_include ID not available: shared-5"},
      {{"shared-3", "shared-4"}, {}, 3, {}, "size 3 exceeds the 2 available IDs"},
      {{"shared-3", "shared-4"}, {}, 0, {}, "size must be at least 1, got 0"},
      {{"shared-3", "shared-4"}, {"shared-3", "shared-4"}, 1, {},
       "must_include has 2 IDs, more than size 1"},
  });
}

// Exclusive mode over eight HCAs (two NUMA nodes, four PCIe roots): the kubelet's usual
// request, must_include, an ID not offered, another spelling, malformed requests. Then random
// requests (IDs as advertised, other spellings, IDs not offered, duplicates, an empty ID,
// must_include not available, sizes out of range): a refusal is InvalidArgument; an answer has
// the size asked for, distinct IDs of `available` as spelled there, must_include, and is the
// same when asked again.
TEST(NodeStatePreferTest, ExclusiveAnswers) {
  std::vector<sim::FixtureHca> cards;
  std::vector<std::string> advertised;
  for (int i = 0; i < 8; ++i) {
    const std::string pci = absl::StrFormat("0000:%02x:00.0", 0x1a + 0x20 * i);
    cards.push_back(testing::FixtureCard(absl::StrCat("mlx5_", i), pci, i / 4,
                                         absl::StrFormat("pci0000:%02x", 0x15 + 0x40 * (i / 2))));
    advertised.push_back(pci);
  }
  TestNode node(cards);
  NodeState state(node.MakeConfig(hca::Mode::kExclusive), node.Sources());
  ASSERT_TRUE(state.Init().ok());
  const std::string& a0 = advertised[0];
  const std::string& a1 = advertised[1];
  const std::string& a2 = advertised[2];
  ExpectAnswers(state, {
      {advertised, {}, 2, {a0, advertised[4]}, ""},  // one per NUMA node
      {advertised, {advertised[5]}, 3, {a0, a1, advertised[5]}, ""},
      {{a0, "0000:ff:00.0", a1}, {}, 2, {a0, a1}, ""},
      {{a0, "0000:ff:00.0", a1}, {}, 3, {a0, a1, "0000:ff:00.0"}, ""},  // completed
      {{a0, "0000:ff:00.0", a1}, {"0000:ff:00.0"}, 2, {"0000:ff:00.0", a0}, ""},
      {{"0000:3A:00.0", "1a:00.0"}, {}, 2, {"1a:00.0", "0000:3A:00.0"}, ""},  // as spelled
      {{a0, a1, a2}, {a1, a1}, 2, {}, "duplicate ID in must_include: " + a1},
      {{a0, a1}, {a2}, 1, {}, "must_include ID not available: " + a2},
      {{a0, a1, a0}, {}, 1, {}, "duplicate ID in available: " + a0},
      {{a0, a1, "0000:1A:00.0"}, {}, 2, {}, "one device named twice in the request"},
      {{a0, ""}, {}, 1, {}, "empty ID in available"},
      {{a0, a1}, {}, 3, {}, "size 3 exceeds the 2 available IDs"},
      {{a0, a1}, {}, 0, {}, "size must be at least 1, got 0"},
      {{a0, a1, a2}, {a0, a1}, 1, {}, "must_include has 2 IDs, more than size 1"},
  });

  const std::vector<std::string> odd = {"0000:3A:00.0", "3a:00.0", "0000:ff:00.0", "", "x"};
  std::mt19937 rng(20261205);
  int answered = 0;
  for (int round = 0; round < 400; ++round) {
    std::vector<std::string> available = advertised;
    std::vector<std::string> must;
    std::shuffle(available.begin(), available.end(), rng);
    available.resize(1 + rng() % available.size());
    if (rng() % 4 == 0) available.push_back(odd[rng() % odd.size()]);
    if (rng() % 8 == 0) available.push_back(available[rng() % available.size()]);
    for (const std::string& id : available) {
      if (rng() % 5 == 0) must.push_back(id);
    }
    if (rng() % 10 == 0) must.push_back(advertised[rng() % advertised.size()]);
    const int size = static_cast<int>(rng() % (available.size() + 2));
    const std::vector<std::string_view> av(available.begin(), available.end());
    const std::vector<std::string_view> mv(must.begin(), must.end());
    const absl::StatusOr<std::vector<std::string>> got = state.resource().Prefer(av, mv, size);
    const std::string what = absl::StrCat("round ", round, ": [", absl::StrJoin(available, ","),
                                          "] must [", absl::StrJoin(must, ","), "] size ", size);
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << what;
      continue;
    }
    ++answered;
    ASSERT_EQ(got->size(), static_cast<std::size_t>(size)) << what;
    EXPECT_EQ(std::set<std::string>(got->begin(), got->end()).size(), got->size()) << what;
    for (const std::string& id : *got) {
      EXPECT_EQ(std::count(available.begin(), available.end(), id), 1) << what << ": " << id;
    }
    for (const std::string& id : must) {
      EXPECT_EQ(std::count(got->begin(), got->end(), id), 1) << what << ": " << id;
    }
    EXPECT_EQ(state.resource().Prefer(av, mv, size).value(), *got) << what;
  }
  EXPECT_GT(answered, 100);
}

// NCCL_IB_GID_INDEX from the fixture's GID tables (RoCE v2 with IPv4; IPv6 only; RoCE v1 only).
TEST(AllocateRoceTest, GidIndexFromTheGidTables) {
  auto card = [](const std::string& name, const std::string& pci, const std::string& netdev,
                 std::vector<sim::FixtureGid> gids) {
    sim::FixtureHca h = testing::FixtureCard(name, pci, 0, "pci0000:" + pci.substr(5, 2));
    h.ports[0].link_layer = "Ethernet";
    h.ports[0].gids = std::move(gids);
    h.umad = false;
    h.netdevs = {netdev};
    return h;
  };
  const std::string link_local = "fe80:0000:0000:0000:0a5c:3cff:fe2b:91e4";
  TestNode node({card("mlx5_0", "0000:1a:00.0", "ens1",
                      {{0, link_local, "IB/RoCE v1", "ens1"}, {1, link_local, "RoCE v2", "ens1"},
                       {2, sim::Ipv4Gid("192.0.2.1"), "IB/RoCE v1", "ens1"},
                       {3, sim::Ipv4Gid("192.0.2.1"), "RoCE v2", "ens1"}}),
                 card("mlx5_1", "0000:3a:00.0", "ens2",
                      {{0, link_local, "IB/RoCE v1", "ens2"}, {1, link_local, "RoCE v2", "ens2"}}),
                 card("mlx5_2", "0000:9a:00.0", "ens3",
                      {{0, link_local, "IB/RoCE v1", "ens3"},
                       {2, sim::Ipv4Gid("192.0.2.3"), "IB/RoCE v1", "ens3"}})});
  NodeState state(node.MakeConfig(hca::Mode::kExclusive), node.Sources());
  ASSERT_TRUE(state.Init().ok());
  auto v4 = state.resource().Allocate({"0000:1a:00.0"});
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->allocation.envs.at("NCCL_IB_GID_INDEX"), "3");
  EXPECT_TRUE(v4->allocation.warnings.empty());
  for (const char* pci : {"0000:3a:00.0", "0000:9a:00.0"}) {  // IPv6 only; RoCE v1 only
    auto none = state.resource().Allocate({pci});
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(none->allocation.envs.count("NCCL_IB_GID_INDEX"), 0u) << pci;
    EXPECT_EQ(none->allocation.warnings.size(), 1u) << pci;
  }
  auto mixed = state.resource().Allocate({"0000:1a:00.0", "0000:3a:00.0"});
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->allocation.envs.count("NCCL_IB_GID_INDEX"), 0u);
}

TEST_F(PluginServerTest, AllocateSharedGivesEveryHca) {
  StartAll(hca::Mode::kShared);
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(Allocate({{"shared-7"}}, &response).ok());
  const auto& c = response.container_responses(0);
  EXPECT_EQ(c.devices_size(), 4 * 3 + 1);
  EXPECT_EQ(c.envs().at("NCCL_IB_HCA"), "=mlx5_0,mlx5_1,mlx5_2,mlx5_3");
}

TEST_F(PluginServerTest, PreferredAllocation) {
  StartAll(hca::Mode::kExclusive);
  std::vector<std::string> got;
  ASSERT_TRUE(Prefer(kPcis, {"0000:ba:00.0"}, 2, &got).ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(std::find(got.begin(), got.end(), "0000:ba:00.0"), got.end());
  ASSERT_TRUE(Prefer(kPcis, {}, 4, &got).ok());
  EXPECT_EQ(got, kPcis);
}

TEST_F(PluginServerTest, PreferredAllocationShared) {
  StartAll(hca::Mode::kShared);
  std::vector<std::string> got;
  ASSERT_TRUE(Prefer({"shared-10", "shared-2", "shared-3"}, {"shared-10"}, 2, &got).ok());
  EXPECT_EQ(got.size(), 2u);
  EXPECT_NE(std::find(got.begin(), got.end(), "shared-10"), got.end());
}

// GetPreferredAllocation answers every well-formed request: an ID the plugin does
// not offer now (an HCA unplugged a poll before the kubelet applied the update, a device reused
// from an init container, --shared-devices lowered) was INVALID_ARGUMENT, which fails the pod.
// Unknown IDs leave `available`, must_include is kept as given, the rest is filled.
TEST_F(PluginServerTest, PreferredAllocationAnswersIdsNotOfferedNow) {
  StartAll(hca::Mode::kExclusive);
  const std::string gone = "0000:ff:00.0";
  std::vector<std::string> with_gone = kPcis;
  with_gone.insert(with_gone.begin(), gone);
  std::vector<std::string> got;
  grpc::Status s = Prefer(with_gone, {}, 2, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(std::count(got.begin(), got.end(), gone), 0) << "an unknown ID is not preferred";
  s = Prefer(with_gone, {gone}, 2, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(std::count(got.begin(), got.end(), gone), 1) << "must_include is kept as given";
  s = Prefer({gone, "0000:fe:00.0"}, {}, 1, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got, std::vector<std::string>{gone}) << "too few known IDs: filled from the rest";
  s = Prefer(with_gone, {}, 5, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.size(), 5u);
}

TEST_F(PluginServerTest, PreferredAllocationSharedAnswersIdsBeyondTheCount) {
  StartAll(hca::Mode::kShared);
  std::vector<std::string> got;
  // shared-5000 is beyond --shared-devices (1000), as after the flag was lowered.
  grpc::Status s = Prefer({"shared-5000", "shared-2", "shared-3"}, {"shared-5000"}, 2, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got, (std::vector<std::string>{"shared-5000", "shared-2"}));
  s = Prefer({"shared-5000", "nonsense"}, {}, 1, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.size(), 1u);
}

TEST_F(PluginServerTest, BadRequestsAreInvalidArgument) {
  StartAll(hca::Mode::kExclusive);
  v1beta1::AllocateResponse response;
  const auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  EXPECT_EQ(Allocate({}, &response).error_code(), kInvalid);
  EXPECT_EQ(Allocate({{}}, &response).error_code(), kInvalid);
  grpc::Status unknown = Allocate({{"0000:ff:00.0"}}, &response);
  EXPECT_EQ(unknown.error_code(), kInvalid);
  EXPECT_NE(unknown.error_message().find("0000:ff:00.0"), std::string::npos);
  grpc::Status dup = Allocate({{"0000:1a:00.0", "0000:1a:00.0"}}, &response);
  EXPECT_EQ(dup.error_code(), kInvalid);
  EXPECT_NE(dup.error_message().find("0000:1a:00.0"), std::string::npos);
  EXPECT_EQ(Allocate({{"shared-1"}}, &response).error_code(), kInvalid);

  EXPECT_EQ(Prefer(kPcis, {}, 5, nullptr).error_code(), kInvalid);                // size > avail
  EXPECT_EQ(Prefer(kPcis, {"0000:ff:00.0"}, 2, nullptr).error_code(), kInvalid);  // must ∉ avail
  EXPECT_EQ(Prefer(kPcis, {kPcis[0], kPcis[1]}, 1, nullptr).error_code(), kInvalid);
  EXPECT_EQ(Prefer({"0000:1a:00.0", "1A:00.0"}, {}, 1, nullptr).error_code(), kInvalid);  // dup
  EXPECT_EQ(Prefer(kPcis, {}, 0, nullptr).error_code(), kInvalid);
  grpc::ClientContext context;
  v1beta1::PreferredAllocationResponse empty;
  EXPECT_EQ(stub_->GetPreferredAllocation(&context, v1beta1::PreferredAllocationRequest(), &empty)
                .error_code(),
            kInvalid);
}

TEST_F(PluginServerTest, ParallelAllocateAndPrefer) {
  StartAll(hca::Mode::kExclusive);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      auto stub = kubelet_->PluginStub();
      for (int i = 0; i < 25; ++i) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
        if (t % 2 == 0) {
          v1beta1::AllocateRequest request;
          // mlx5_3 goes down meanwhile (and is then refused): the other three.
          request.add_container_requests()->add_devices_ids(kPcis[(t + i) % 3]);
          v1beta1::AllocateResponse response;
          grpc::Status s = stub->Allocate(&context, request, &response);
          if (!s.ok() || response.container_responses(0).envs().at("RDMA_HCA_PCI") !=
                             kPcis[(t + i) % 3]) {
            ++failures;
          }
        } else {
          v1beta1::PreferredAllocationRequest request;
          auto* c = request.add_container_requests();
          for (const auto& id : kPcis) c->add_available_deviceids(id);
          c->set_allocation_size(1 + (i % 4));
          v1beta1::PreferredAllocationResponse response;
          grpc::Status s = stub->GetPreferredAllocation(&context, request, &response);
          if (!s.ok() || response.container_responses(0).deviceids_size() != 1 + (i % 4)) {
            ++failures;
          }
        }
      }
    });
  }
  // Health changes while the calls run.
  ASSERT_TRUE(node_.fixture().SetPortState("mlx5_3", 1, "DOWN").ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// With pod-resources on, each GetPreferredAllocation waits for a pod list and is answered on the
// thread that received it, not the one that took the call: the response is written there and
// read and destroyed by gRPC on its own threads (under TSan, the edge between them must be stated;
// this is the test that shows it).
TEST_F(PluginServerTest, ParallelPreferAnsweredAfterPodLists) {
  const std::string pods_socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(pods_socket);
  ASSERT_TRUE(pods.Start().ok());
  StartAll(hca::Mode::kExclusive, NewGrpcPodResources(pods_socket));
  ASSERT_TRUE(kubelet_->WaitForDevices(
      [](const Devices& d) {
        for (const auto& x : d) {
          if (x.health() != "Healthy") return false;
        }
        return d.size() == 4;
      },
      kWait));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto stub = kubelet_->PluginStub();
      for (int i = 0; i < 50; ++i) {
        v1beta1::PreferredAllocationRequest request = PreferredRequest(kPcis, {}, 1 + (i % 4));
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
        v1beta1::PreferredAllocationResponse response;
        grpc::Status s = stub->GetPreferredAllocation(&context, request, &response);
        if (!s.ok() || response.container_responses(0).deviceids_size() != 1 + (i % 4)) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(pods.list_calls(), 1);
}

// Mode switch: a container that got shared IDs before the node became exclusive sees every HCA,
// so exclusive mode withholds them all until it is gone.
TEST_F(PluginServerTest, ExclusiveWithholdsWhileSharedPodsRun) {
  const std::string pods_socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(pods_socket);
  pods.Set({{"default/old/main", {{"rdma/hca", {"shared-3"}}}}});
  ASSERT_TRUE(pods.Start().ok());
  StartAll(hca::Mode::kExclusive, NewGrpcPodResources(pods_socket));
  auto withheld = kubelet_->WaitForDevices(
      [](const Devices& d) {
        return d.size() == 4 && HealthIs(kPcis[0], "Unhealthy")(d) &&
               HealthIs(kPcis[3], "Unhealthy")(d);
      },
      kWait);
  ASSERT_TRUE(withheld.has_value());
  pods.Set({});
  auto released = kubelet_->WaitForDevices(
      [](const Devices& d) {
        for (const auto& x : d) {
          if (x.health() != "Healthy") return false;
        }
        return d.size() == 4;
      },
      kWait);
  EXPECT_TRUE(released.has_value());
}

// The other way: an HCA held exclusively before the node became shared is not handed to shared
// pods.
TEST_F(PluginServerTest, SharedWithholdsExclusivelyHeldHcas) {
  const std::string pods_socket = node_.dir().Sub("pr.sock");
  FakePodResources pods(pods_socket);
  pods.Set({{"default/old/main", {{"rdma/hca", {"0000:3a:00.0"}}}}});
  ASSERT_TRUE(pods.Start().ok());
  StartAll(hca::Mode::kShared, NewGrpcPodResources(pods_socket));
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(Allocate({{"shared-0"}}, &response).ok());
  EXPECT_EQ(response.container_responses(0).envs().at("RDMA_HCA_PCI"),
            "0000:1a:00.0,0000:9a:00.0,0000:ba:00.0");
  pods.Set({});
  // Once the container is gone (seen on a later poll), the HCA is shared again.
  const bool back = WaitUntil(
      plugin_->node(),
      [&] {
        v1beta1::AllocateResponse r;
        return Allocate({{"shared-0"}}, &r).ok() &&
               r.container_responses(0).envs().at("NCCL_IB_HCA") == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3";
      },
      absl::Now() + kWait);
  EXPECT_TRUE(back);
}

}  // namespace
}  // namespace rdp::deviceplugin
