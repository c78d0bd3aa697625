// Fault injection: the plugin, in process and as the built binary, against a kubelet that comes
// late, wipes its socket directory 100 times and drops ListAndWatch streams; a pod-resources
// server that never answers; sysfs files vanishing in the middle of a scan; SIGTERM under load.
// After each fault the plugin must serve the same devices (IDs, health, NUMA) as before it.
// Every wait is a condition variable, a stream read, a pidfd poll or a gRPC deadline; only the
// /proc fd and thread counts, which change without any event, are polled (with a deadline).

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/podresources.grpc.pb.h"
#include "sim/kubelet_sim.h"
#include "deviceplugin/plugin_server.h"
#include "serving/unix_server.h"
#include "test/deviceplugin/test_node.h"
#include "test/support/child.h"
#include "test/support/fault_env.h"
#include "test/support/temp_dir.h"

extern char** environ;

namespace rdp::deviceplugin {
namespace {

namespace fs = std::filesystem;
using testing::TestNode;

constexpr absl::Duration kWait = absl::Seconds(10);     // bound on any awaited event
constexpr absl::Duration kRpcBound = absl::Seconds(3);  // "answers promptly", as a deadline

const std::vector<std::string> kPcis = {"0000:1a:00.0", "0000:3a:00.0", "0000:9a:00.0",
                                        "0000:ba:00.0"};

// A device list as text, one "<id> <health> numa=<nodes>" per device in list order, so that
// the lists before and after a fault compare (and print) as wholes.
using DeviceTable = std::vector<std::string>;

template <typename Range>
DeviceTable Table(const Range& devices) {
  DeviceTable out;
  for (const v1beta1::Device& d : devices) {
    std::string numa = d.has_topology() ? "" : "none";
    for (const auto& n : d.topology().nodes()) {
      absl::StrAppend(&numa, numa.empty() ? "" : ",", n.id());
    }
    out.push_back(absl::StrCat(d.id(), " ", d.health(), " numa=", numa));
  }
  return out;
}

// The exclusive-mode list of testing::FourCards().
const DeviceTable kExpected = {"0000:1a:00.0 Healthy numa=0", "0000:3a:00.0 Healthy numa=0",
                               "0000:9a:00.0 Healthy numa=1", "0000:ba:00.0 Healthy numa=1"};

// `table` with the health of device `id` replaced.
DeviceTable WithHealth(DeviceTable table, const std::string& id, const std::string& health) {
  for (std::string& row : table) {
    if (absl::StartsWith(row, id + " ")) {
      row = absl::StrCat(id, " ", health, row.substr(row.find(" numa=")));
    }
  }
  return table;
}

std::string Join(const DeviceTable& t) { return absl::StrJoin(t, "; "); }

auto Is(const DeviceTable& want) {
  return [want](const KubeletSim::Devices& d) { return Table(d) == want; };
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The first list of a fresh ListAndWatch stream on a fresh connection to `socket`; nullopt when
// none came within kRpcBound. It waits for the socket to be served (wait_for_ready): a plugin may
// register with a restarted kubelet a moment before it sees that the same wipe took its socket,
// and serve again right after.
std::optional<DeviceTable> FreshList(const std::string& socket) {
  auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(socket));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcBound));
  context.set_wait_for_ready(true);
  auto reader = stub->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse response;
  const bool got = reader->Read(&response);
  context.TryCancel();
  reader->Finish();
  if (!got) return std::nullopt;
  return Table(response.devices());
}

// Allocate of the one HCA `id` on a fresh connection: OK within kRpcBound, and its
// RDMA_HCA_PCI names that HCA.
::testing::AssertionResult AllocateWorks(const std::string& socket, const std::string& id) {
  auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(socket));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcBound));
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  const grpc::Status s = stub->Allocate(&context, request, &response);
  if (!s.ok()) {
    return ::testing::AssertionFailure()
           << "Allocate " << id << ": code " << s.error_code() << " " << s.error_message();
  }
  if (response.container_responses_size() != 1) {
    return ::testing::AssertionFailure() << "Allocate " << id << ": no container response";
  }
  const auto& envs = response.container_responses(0).envs();
  auto it = envs.find("RDMA_HCA_PCI");
  if (it == envs.end() || it->second != id) {
    return ::testing::AssertionFailure() << "Allocate " << id << ": wrong RDMA_HCA_PCI";
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// The built binary as a child process.

// Flags for `serve` on a TestNode, exclusive mode, no pod-resources, 100 ms health polls.
std::vector<std::string> ServeArgs(const Config& c) {
  return {"serve",
          "--mode", "exclusive",
          "--sysfs-root", c.discovery.sysfs_root,
          "--dev-root", c.discovery.dev_root,
          "--kubelet-dir", c.kubelet_dir,
          "--pod-resources-socket", "",
          "--health-interval", "100ms",
          "--log-level", "info"};
}

// The binary running `args` (test/support/child.h).
class Child : public rdp::testing::Child {
 public:
  explicit Child(const std::vector<std::string>& args)
      : rdp::testing::Child(rdp::testing::PluginBinary(), args) {}
  bool WaitForLog(const std::string& text, absl::Duration timeout) const {
    return WaitForOutput(text, timeout);
  }
};

// What /proc shows of a process. gRPC's own thread pools are counted apart and not held flat:
// the event engine's ("event_engine"), the executor that runs callback-API work
// ("default-executo", at most twice the CPUs) and the timer threads ("grpc_global_tim"). Each
// grows by a thread under a burst of work and retires an idle extra one on its own schedule,
// longer than a test; they are bounded by gRPC, not by us.
bool IsGrpcPool(const std::string& name) {
  return name == "event_engine" || name == "default-executo" || name == "grpc_global_tim";
}

struct Counts {
  int fds = -1;
  int threads = -1;  // every thread but gRPC's pools
  int pool = -1;     // gRPC's pools
  std::map<std::string, int> names;  // threads by name, for the failure message
};

Counts CountsOf(pid_t pid) {
  const fs::path proc = fs::path("/proc") / std::to_string(pid);
  Counts c;
  std::error_code ec;
  int fds = 0;
  for (fs::directory_iterator it(proc / "fd", ec), end; !ec && it != end; it.increment(ec)) ++fds;
  if (ec) return c;
  int threads = 0;
  int pool = 0;
  for (fs::directory_iterator it(proc / "task", ec), end; !ec && it != end; it.increment(ec)) {
    std::ifstream in(it->path() / "comm");
    std::string name;
    std::getline(in, name);
    ++(IsGrpcPool(name) ? pool : threads);
    ++c.names[name];
  }
  if (ec) return c;
  c.fds = fds;
  c.threads = threads;
  c.pool = pool;
  return c;
}

std::string Show(const Counts& c) {
  std::string names;
  for (const auto& [name, n] : c.names) absl::StrAppend(&names, names.empty() ? "" : ", ", name, " x", n);
  return absl::StrCat(c.fds, " fds, ", c.threads, "+", c.pool, " threads (", names, ")");
}

// /proc offers no event to wait on, so the two waits below poll it every 20 ms, bounded.

// Waits until the thread count has not changed for `window` (gRPC retires idle pollers and
// closes dropped connections on its own schedule, and an abandoned ListAndWatch ends at its
// next 500 ms recheck); the counts then, with the fewest fds seen meanwhile (a health poll holds
// a sysfs file open for a moment). After `timeout`, the last counts.
Counts WaitForSteadyCounts(pid_t pid, absl::Duration window, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Counts steady = CountsOf(pid);
  absl::Time since = absl::Now();
  while (absl::Now() - since < window && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    const Counts c = CountsOf(pid);
    if (c.threads != steady.threads) {
      steady = c;
      since = absl::Now();
    } else {
      steady.fds = std::min(steady.fds, c.fds);
    }
  }
  return steady;
}

// Waits until the process has at most `limit` fds and threads (pool not counted); the counts
// last seen (-1 when the process is gone).
Counts WaitForCountsAtMost(pid_t pid, Counts limit, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Counts c = CountsOf(pid);
  auto within = [&limit](const Counts& c) {
    return c.fds >= 0 && c.fds <= limit.fds && c.threads >= 0 && c.threads <= limit.threads;
  };
  while (!within(c) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    c = CountsOf(pid);
  }
  return c;
}

// The slack allowed over the steady baseline once the faults are over: a health poll holds a
// sysfs file open for a moment, the kubelet's latest connection may still be closing while its
// successor opens, and gRPC's sync server keeps one or two idle pollers, retiring the extra one
// on its own schedule. A leak per fault (100 faults) is far beyond this.
constexpr int kFdSlack = 4;
constexpr int kThreadSlack = 2;

// ---------------------------------------------------------------------------------------------
// 1. The kubelet is absent when the plugin starts and appears later.

TEST(FaultTest, KubeletAbsentAtStartThenAppears) {
  TestNode node;
  const Config config = node.MakeConfig(hca::Mode::kExclusive);
  PluginServer plugin(config, node.Sources());
  ASSERT_TRUE(plugin.Start().ok());
  // No kubelet: the plugin serves its socket all the same and retries registration.
  ASSERT_FALSE(Exists(config.KubeletSocketPath()));
  EXPECT_EQ(FreshList(config.SocketPath()), kExpected);
  EXPECT_EQ(plugin.node().resource().metrics().registrations.value(), 0u);

  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  auto reg = kubelet.WaitForRegistration(0, kWait);
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->resource_name, "rdma/hca");
  EXPECT_EQ(reg->endpoint, config.socket_name);
  auto devices = kubelet.WaitForDevices(Is(kExpected), kWait);
  EXPECT_TRUE(devices.has_value()) << "the kubelet never got the four devices";
  EXPECT_EQ(FreshList(config.SocketPath()), kExpected);
  for (const auto& id : kPcis) EXPECT_TRUE(AllocateWorks(config.SocketPath(), id));
  EXPECT_GE(plugin.node().resource().metrics().registrations.value(), 1u);
}

// The binary is running, registered with `kubelet` and listed the expected devices to it.
::testing::AssertionResult ServesExpected(const Child& plugin, const KubeletSim& kubelet) {
  if (!plugin.running()) return ::testing::AssertionFailure() << "the plugin is not running";
  if (!kubelet.WaitForRegistration(0, kWait)) {
    return ::testing::AssertionFailure() << "no registration within " << kWait;
  }
  if (!kubelet.WaitForDevices(Is(kExpected), kWait)) {
    return ::testing::AssertionFailure() << "the kubelet never saw the expected devices";
  }
  return ::testing::AssertionSuccess();
}

TEST(FaultBinaryTest, KubeletAbsentAtStartThenAppears) {
  TestNode node;
  const Config config = node.MakeConfig(hca::Mode::kExclusive);
  Child plugin(ServeArgs(config));
  ASSERT_TRUE(plugin.running());
  // It serves, and has failed to register at least once, before the kubelet exists.
  ASSERT_TRUE(plugin.WaitForLog("failed, retrying with backoff", kWait));
  ASSERT_FALSE(Exists(config.KubeletSocketPath()));
  EXPECT_EQ(FreshList(config.SocketPath()), kExpected);

  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  ASSERT_TRUE(kubelet.WaitForRegistration(0, kWait).has_value());
  EXPECT_TRUE(kubelet.WaitForDevices(Is(kExpected), kWait).has_value());
  EXPECT_TRUE(plugin.WaitForLog("Registered device plugin with Kubelet", kWait));
  EXPECT_EQ(FreshList(config.SocketPath()), kExpected);
  for (const auto& id : kPcis) EXPECT_TRUE(AllocateWorks(config.SocketPath(), id));
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(2 * kWait), 0);
}

// ---------------------------------------------------------------------------------------------
// 2. The kubelet's socket directory wiped 100 times in a row.

// What a kubelet restart does to the device-plugin directory, three ways, and then the kubelet
// serves again: (0) every socket in it removed (KubeletSim::Restart); (1) everything in it
// removed, our socket's temporary names included; (2) the directory itself removed and created
// again.
absl::Status Wipe(KubeletSim& kubelet, int how) {
  if (how == 0) return kubelet.Restart();
  kubelet.Stop();
  std::error_code ec;
  if (how == 1) {
    std::vector<fs::path> entries;
    for (fs::directory_iterator it(kubelet.dir(), ec), end; !ec && it != end; it.increment(ec)) {
      entries.push_back(it->path());
    }
    for (const auto& p : entries) fs::remove_all(p, ec);
  } else {
    fs::remove_all(kubelet.dir(), ec);
    fs::create_directories(kubelet.dir(), ec);
  }
  return kubelet.Start();
}

TEST(FaultBinaryTest, KubeletDirWipedHundredTimes) {
  TestNode node;
  const Config config = node.MakeConfig(hca::Mode::kExclusive);
  const std::string socket = config.SocketPath();
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  Child plugin(ServeArgs(config));
  ASSERT_TRUE(ServesExpected(plugin, kubelet));

  // Settle: one wipe of each kind first, so that what gRPC creates once and keeps (pollers,
  // executor and timer threads) exists before the steady baseline is taken.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Wipe(kubelet, i).ok());
    ASSERT_TRUE(kubelet.WaitForCurrentRegistration(kWait).has_value()) << "settle " << i;
  }
  ASSERT_EQ(FreshList(socket), kExpected);
  const Counts baseline = WaitForSteadyCounts(plugin.pid(), absl::Seconds(1), kWait);
  ASSERT_GT(baseline.fds, 0);
  ASSERT_GT(baseline.threads, 0);

  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(Wipe(kubelet, i % 3).ok()) << "wipe " << i;
    // The restarted kubelet (not an earlier one) got a registration, and a fresh stream lists
    // the same devices.
    ASSERT_TRUE(kubelet.WaitForCurrentRegistration(kWait).has_value()) << "wipe " << i;
    ASSERT_EQ(FreshList(socket), kExpected) << "wipe " << i;
  }
  const Counts after =
      WaitForCountsAtMost(plugin.pid(), {baseline.fds + kFdSlack, baseline.threads + kThreadSlack},
                          kWait);
  EXPECT_LE(after.fds, baseline.fds + kFdSlack) << "baseline " << baseline.fds;
  EXPECT_LE(after.threads, baseline.threads + kThreadSlack) << "baseline " << baseline.threads;
  std::printf("after 100 wipes: %s -> %s\n", Show(baseline).c_str(), Show(after).c_str());

  EXPECT_TRUE(kubelet.WaitForDevices(Is(kExpected), kWait).has_value());
  for (const auto& id : kPcis) EXPECT_TRUE(AllocateWorks(socket, id));
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(2 * kWait), 0);
  EXPECT_FALSE(Exists(socket));
}

// ---------------------------------------------------------------------------------------------
// 3. sysfs files vanishing in the middle of a health scan.

// A one-shot fault: the first read through env() of a path ending in `trigger` after Arm() runs
// `vanish` with that path's host path, on the scanning thread, before the read.
class OneShotFault {
 public:
  OneShotFault(const TestNode& node, std::string trigger,
               std::function<void(const std::string&)> vanish)
      : env_(std::make_shared<rdp::testing::FaultEnv>(node.NodeEnv())),
        trigger_(std::move(trigger)),
        vanish_(std::move(vanish)) {}

  std::shared_ptr<rdp::testing::FaultEnv> env() const { return env_; }
  void Arm() {
    env_->SetHook([this](const std::string& p) { OnRead(p); });
  }
  // Once this returns the hook is not running and will not run again.
  void Disarm() { env_->SetHook(nullptr); }

  bool WaitFired(absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    while (!fired_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    return fired_;
  }

 private:
  // Hook calls are serialised, so only the flag needs the lock (the test thread reads it).
  void OnRead(const std::string& path) {
    {
      absl::MutexLock lock(&mu_);
      if (fired_ || !absl::EndsWith(path, trigger_)) return;
    }
    vanish_(env_->HostPath(path));
    absl::MutexLock lock(&mu_);
    fired_ = true;
    cv_.SignalAll();
  }

  const std::shared_ptr<rdp::testing::FaultEnv> env_;
  const std::string trigger_;
  const std::function<void(const std::string&)> vanish_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
};

// The plugin on `node` (exclusive mode, 50 ms health polls) with a kubelet. `fault` fires during
// a health scan; every list the plugin sends meanwhile must keep the four devices with their IDs
// and NUMA nodes, with only `victim` Unhealthy (not dropped); after `restore` the list is what
// it was before.
void RunVanishing(TestNode& node, OneShotFault& fault, const std::string& victim,
                  const std::function<absl::Status()>& restore) {
  const Config config = node.MakeConfig(hca::Mode::kExclusive);
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  PluginServer plugin(config, node.Sources(nullptr, fault.env()));
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(kubelet.WaitForRegistration(0, kWait).has_value());
  ASSERT_TRUE(kubelet.WaitForDevices(Is(kExpected), kWait).has_value());

  auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(config.SocketPath()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + 2 * kWait));
  auto reader = stub->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse response;
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_EQ(Table(response.devices()), kExpected);

  const DeviceTable down = WithHealth(kExpected, victim, "Unhealthy");
  // Reads the stream until `want`; every list on the way is the healthy or the `down` one.
  auto read_until = [&](const DeviceTable& want) -> ::testing::AssertionResult {
    while (reader->Read(&response)) {
      const DeviceTable t = Table(response.devices());
      if (t == want) return ::testing::AssertionSuccess();
      if (t != kExpected && t != down) {
        return ::testing::AssertionFailure() << "unexpected list: " << Join(t);
      }
    }
    return ::testing::AssertionFailure() << "stream ended before " << Join(want);
  };

  fault.Arm();
  ASSERT_TRUE(fault.WaitFired(kWait)) << "the scan never reached the trigger";
  EXPECT_TRUE(read_until(down));
  fault.Disarm();  // from here the test thread owns the fixture again
  ASSERT_TRUE(restore().ok());
  EXPECT_TRUE(read_until(kExpected));
  EXPECT_TRUE(kubelet.WaitForDevices(Is(kExpected), kWait).has_value());
  EXPECT_TRUE(AllocateWorks(config.SocketPath(), victim));
  context.TryCancel();
  reader->Finish();
}

std::string ClassPath(const TestNode& node, const std::string& rest) {
  return node.dir().Sub("node") + "/sys/class/infiniband/" + rest;
}

TEST(FaultSysfsTest, PortStateVanishesAsItIsRead) {
  TestNode node;
  const std::string state = ClassPath(node, "mlx5_1/ports/1/state");
  OneShotFault fault(node, "/class/infiniband/mlx5_1/ports/1/state", [](const std::string& p) {
    std::error_code ec;
    fs::rename(p, p + ".vanished", ec);
    EXPECT_FALSE(ec) << ec.message();
  });
  RunVanishing(node, fault, kPcis[1], [&state]() -> absl::Status {
    std::error_code ec;
    fs::rename(state + ".vanished", state, ec);
    return ec ? absl::InternalError(ec.message()) : absl::OkStatus();
  });
}

// A hot-unplug of HCA `name`, as a fault action.
std::function<void(const std::string&)> Unplug(TestNode& node, const std::string& name) {
  return [&node, name](const std::string&) { EXPECT_TRUE(node.fixture().RemoveHca(name).ok()); };
}

// The HCA is unplugged while the scan is reading it (its device directory goes just before its
// numa_node is read).
TEST(FaultSysfsTest, HcaUnpluggedWhileBeingScanned) {
  TestNode node;
  OneShotFault fault(node, "/0000:9a:00.0/numa_node", Unplug(node, "mlx5_2"));
  RunVanishing(node, fault, kPcis[2],
               [&node] { return node.fixture().AddHca(testing::FourCards()[2]); });
}

// The HCA is unplugged after the scan listed it but before the scan reached it.
TEST(FaultSysfsTest, HcaUnpluggedAfterBeingListed) {
  TestNode node;
  OneShotFault fault(node, "/0000:1a:00.0/numa_node", Unplug(node, "mlx5_2"));
  RunVanishing(node, fault, kPcis[2],
               [&node] { return node.fixture().AddHca(testing::FourCards()[2]); });
}

// ---------------------------------------------------------------------------------------------
// 4. A pod-resources server that accepts connections and never answers.

// v1.PodResourcesLister whose List never answers while the test runs: each call blocks its
// server thread until Release(), in teardown, so that the server can shut down. (The sync API:
// gRPC's callback API hands its call objects between threads inside libgrpc, which TSan cannot
// see into, and is reported as a race.)
class ParkedLister final : public v1::PodResourcesLister::Service {
 public:
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse*) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    cv_.SignalAll();
    while (!released_) cv_.Wait(&mu_);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "released");
  }

  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
    cv_.SignalAll();
  }

  bool WaitForCalls(int n, absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    while (calls_ < n) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    return calls_ >= n;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// ParkedLister served on a unix socket; the destructor releases the blocked calls, then stops.
class ParkedPodResources {
 public:
  explicit ParkedPodResources(const std::string& path) {
    auto server = serving::StartUnixServer(path, {&lister_});
    if (server.ok()) server_ = std::move(*server);
  }
  ~ParkedPodResources() {
    lister_.Release();
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + kRpcBound));
  }
  bool ok() const { return server_ != nullptr; }
  bool WaitForCalls(int n, absl::Duration timeout) const {
    return lister_.WaitForCalls(n, timeout);
  }

 private:
  ParkedLister lister_;
  std::unique_ptr<grpc::Server> server_;
};

// A unix socket that accepts every connection and never reads or writes a byte: a
// pod-resources server hung below gRPC.
class MuteSocket {
 public:
  explicit MuteSocket(std::string path) : path_(std::move(path)) {
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    if (listen_fd_ < 0 || stop_fd_ < 0 ||
        ::bind(listen_fd_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 16) != 0) {
      return;
    }
    thread_ = std::thread([this] { Accept(); });
  }
  ~MuteSocket() {
    const uint64_t one = 1;
    if (stop_fd_ >= 0 && ::write(stop_fd_, &one, sizeof(one)) < 0) std::perror("eventfd");
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    for (int fd : accepted_) ::close(fd);
    for (int fd : {listen_fd_, stop_fd_}) {
      if (fd >= 0) ::close(fd);
    }
    ::unlink(path_.c_str());
  }
  bool ok() const { return thread_.joinable(); }
  bool WaitForAccepted(int n, absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    while (static_cast<int>(accepted_.size()) < n) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    return static_cast<int>(accepted_.size()) >= n;
  }

 private:
  void Accept() {
    for (;;) {
      struct pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents != 0) return;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      absl::MutexLock lock(&mu_);
      accepted_.push_back(fd);
      cv_.SignalAll();
    }
  }

  const std::string path_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  std::vector<int> accepted_ ABSL_GUARDED_BY(mu_);
};

// The plugin wired by DefaultSources to the pod-resources socket in `config` (already served by a
// server that never answers; `contacted` waits for it to have been reached). Fail closed: the
// pod list is not known, so every HCA is withheld (Unhealthy, Allocate refused), yet every
// kubelet RPC answers within kRpcBound, repeatedly, and health polling goes on. Then
// `end_silence` removes that server and a real one appears on the same path: the plugin picks it
// up (a socket re-created after a failed dial), and the devices, with the port that went down
// meanwhile, are offered.
void RunWithSilentPodResources(TestNode& node, const Config& config,
                               const std::function<bool()>& contacted,
                               const std::function<void()>& end_silence) {
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  NodeSources sources = node.Sources();  // sysfs-only discovery
  sources.pod_resources = DefaultSources(config).pod_resources;
  ASSERT_NE(sources.pod_resources, nullptr) << "DefaultSources did not wire pod-resources";
  PluginServer plugin(config, std::move(sources));
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(kubelet.WaitForRegistration(0, kWait).has_value());
  DeviceTable withheld = kExpected;
  for (const std::string& pci : kPcis) withheld = WithHealth(withheld, pci, "Unhealthy");
  ASSERT_TRUE(kubelet.WaitForDevices(Is(withheld), kWait).has_value());
  ASSERT_TRUE(contacted()) << "the plugin never reached the pod-resources server";

  const std::string socket = config.SocketPath();
  auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(socket));
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcBound));
      v1beta1::DevicePluginOptions options;
      EXPECT_TRUE(stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok());
    }
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcBound));
      v1beta1::PreferredAllocationResponse response;
      const grpc::Status s = stub->GetPreferredAllocation(
          &context, PreferredRequest(kPcis, {kPcis[round % 4]}, 2), &response);
      EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
      if (s.ok()) {
        EXPECT_EQ(response.container_responses(0).deviceids_size(), 2);
      }
    }
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcBound));
      v1beta1::AllocateRequest request;
      request.add_container_requests()->add_devices_ids(kPcis[round % 4]);
      v1beta1::AllocateResponse response;
      const grpc::Status s = stub->Allocate(&context, request, &response);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), "pod list is not known"))
          << s.error_message();
    }
    EXPECT_EQ(FreshList(socket), withheld);
  }

  // Health polls go on meanwhile: a port that goes down shows once the pods are known.
  ASSERT_TRUE(node.fixture().SetPortState("mlx5_1", 1, "DOWN").ok());
  end_silence();
  FakePodResources pods(config.pod_resources_socket);
  ASSERT_TRUE(pods.Start().ok());
  EXPECT_TRUE(
      kubelet.WaitForDevices(Is(WithHealth(kExpected, kPcis[1], "Unhealthy")), kWait).has_value());
  ASSERT_TRUE(node.fixture().SetPortState("mlx5_1", 1, "ACTIVE").ok());
  EXPECT_TRUE(kubelet.WaitForDevices(Is(kExpected), kWait).has_value());
  EXPECT_EQ(FreshList(socket), kExpected);
  EXPECT_TRUE(AllocateWorks(socket, kPcis[1]));
  plugin.Stop();
}

// A node whose pod-resources socket is served by `Silent`; contacted(server) waits until the
// plugin reached it.
template <typename Silent>
void SilentPodResourcesTest(const std::function<bool(Silent&)>& contacted) {
  TestNode node;
  Config config = node.MakeConfig(hca::Mode::kExclusive);
  config.pod_resources_socket = node.dir().Sub("pr.sock");
  auto pods = std::make_unique<Silent>(config.pod_resources_socket);
  ASSERT_TRUE(pods->ok());
  RunWithSilentPodResources(
      node, config, [&] { return contacted(*pods); },
      [&] {
        pods.reset();
        ::unlink(config.pod_resources_socket.c_str());
      });
}

TEST(FaultPodResourcesTest, ListNeverAnswers) {
  SilentPodResourcesTest<ParkedPodResources>(
      [](ParkedPodResources& p) { return p.WaitForCalls(1, kWait); });
}

TEST(FaultPodResourcesTest, SocketNeverWrites) {
  SilentPodResourcesTest<MuteSocket>([](MuteSocket& p) { return p.WaitForAccepted(1, kWait); });
}

// ---------------------------------------------------------------------------------------------
// 5. SIGTERM while clients hammer Allocate and GetPreferredAllocation.

TEST(FaultBinaryTest, SigtermDuringAllocateLoad) {
  TestNode node;
  const Config config = node.MakeConfig(hca::Mode::kExclusive);
  const std::string socket = config.SocketPath();
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());

  constexpr int kThreads = 6;
  // A call caught by the stop may wait out the server's 2 s shutdown grace; past this bound it
  // would be a hang.
  constexpr absl::Duration kCallBound = absl::Seconds(8);
  // Per thread, written only by it and read after it is joined.
  std::vector<std::vector<grpc::StatusCode>> codes(kThreads);
  std::vector<int> wrong_answers(kThreads, 0);
  absl::Mutex mu;
  absl::CondVar cv;
  int answered = 0;  // guarded by mu
  {
    Child plugin(ServeArgs(config));
    ASSERT_TRUE(ServesExpected(plugin, kubelet));
    ASSERT_EQ(FreshList(socket), kExpected);

    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    // Declared after `plugin`, so it joins the threads before the child is killed on a failure.
    struct Joiner {
      std::atomic<bool>* stop;
      std::vector<std::thread>* threads;
      ~Joiner() {
        *stop = true;
        for (auto& t : *threads) t.join();
      }
    } joiner{&stop, &threads};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(socket));
        for (int i = 0; !stop.load(); ++i) {
          grpc::ClientContext context;
          context.set_deadline(absl::ToChronoTime(absl::Now() + kCallBound));
          grpc::Status s;
          bool right = true;
          const std::string& id = kPcis[(t + i) % 4];
          if (i % 2 == 0) {
            v1beta1::AllocateRequest request;
            request.add_container_requests()->add_devices_ids(id);
            v1beta1::AllocateResponse response;
            s = stub->Allocate(&context, request, &response);
            if (s.ok()) {
              const auto& envs = response.container_responses(0).envs();
              right = envs.count("RDMA_HCA_PCI") && envs.at("RDMA_HCA_PCI") == id;
            }
          } else {
            v1beta1::PreferredAllocationResponse response;
            s = stub->GetPreferredAllocation(&context, PreferredRequest(kPcis, {id}, 2),
                                             &response);
            if (s.ok()) right = response.container_responses(0).deviceids_size() == 2;
          }
          codes[t].push_back(s.error_code());
          if (!right) ++wrong_answers[t];
          if (!s.ok()) break;  // the plugin is going or gone
          absl::MutexLock lock(&mu);
          ++answered;
          cv.SignalAll();
        }
      });
    }
    // Mid-load: every thread has had calls answered and keeps calling.
    {
      const absl::Time deadline = absl::Now() + kWait;
      absl::MutexLock lock(&mu);
      while (answered < 20 * kThreads) {
        if (cv.WaitWithDeadline(&mu, deadline)) break;
      }
      ASSERT_GE(answered, 20 * kThreads) << "the load never got going";
    }
    plugin.Signal(SIGTERM);
    EXPECT_EQ(plugin.Wait(2 * kWait), 0) << "no clean exit on SIGTERM under load";
  }  // joins the client threads: each ends at its first failed call or at `stop`

  EXPECT_FALSE(Exists(socket)) << "socket left behind";
  std::set<std::string> left;
  std::error_code ec;
  for (fs::directory_iterator it(config.kubelet_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    left.insert(it->path().filename().string());
  }
  EXPECT_FALSE(ec) << config.kubelet_dir << ": " << ec.message();
  EXPECT_EQ(left, std::set<std::string>{"kubelet.sock"});
  std::map<grpc::StatusCode, int> by_code;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(wrong_answers[t], 0) << "thread " << t;
    for (grpc::StatusCode c : codes[t]) ++by_code[c];
  }
  for (const auto& [code, n] : by_code) {
    std::printf("status %d: %d calls\n", static_cast<int>(code), n);
    // Answered, or refused/cut by the stopping server; a DEADLINE_EXCEEDED would be a hang.
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::UNAVAILABLE ||
                code == grpc::StatusCode::CANCELLED)
        << "status " << code << " in " << n << " calls";
  }

  // Started again: the same devices with the same IDs.
  const int registrations = kubelet.registrations();
  Child again(ServeArgs(config));
  ASSERT_TRUE(again.running());
  ASSERT_TRUE(kubelet.WaitForRegistration(registrations, kWait).has_value());
  EXPECT_EQ(FreshList(socket), kExpected);
  EXPECT_TRUE(kubelet.WaitForDevices(Is(kExpected), kWait).has_value());
  for (const auto& id : kPcis) EXPECT_TRUE(AllocateWorks(socket, id));
  again.Signal(SIGTERM);
  EXPECT_EQ(again.Wait(2 * kWait), 0);
}

// ---------------------------------------------------------------------------------------------
// 6. A kubelet that closes ListAndWatch streams abruptly.

// One ListAndWatch stream on a fresh channel to `socket`, ended by the client, four ways: (0)
// the first list read, then TryCancel; (1) the first list read, then stream, context and
// channel dropped without Finish; (2) cancelled before the first read; (3) dropped before the
// first read.
::testing::AssertionResult DropStreamOnce(const std::string& socket, int how,
                                          grpc::StatusCode* refused);

// DropStream, again while the plugin refuses the stream for its cap of 16: streams dropped a
// moment before are reaped by gRPC asynchronously, so on a loaded machine a quick succession of
// drops can find the cap reached for a while. That is the limit doing its work; the test asks
// that every dropped stream is reaped in the end (the counts after, and the retries ending).
::testing::AssertionResult DropStream(const std::string& socket, int how) {
  const absl::Time deadline = absl::Now() + kWait;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    grpc::StatusCode refused = grpc::StatusCode::OK;
    ::testing::AssertionResult r = DropStreamOnce(socket, how, &refused);
    if (r || refused != grpc::StatusCode::RESOURCE_EXHAUSTED || absl::Now() > deadline) return r;
    absl::SleepFor(pause);  // the reaping has no event to wait on from outside the process
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
}

::testing::AssertionResult DropStreamOnce(const std::string& socket, int how,
                                          grpc::StatusCode* refused) {
  auto stub = v1beta1::DevicePlugin::NewStub(serving::UnixChannel(socket));
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + kRpcBound));
  auto reader = stub->ListAndWatch(context.get(), v1beta1::Empty());
  if (how == 0 || how == 1) {
    v1beta1::ListAndWatchResponse response;
    if (!reader->Read(&response)) {
      const grpc::Status s = reader->Finish();
      *refused = s.error_code();
      return ::testing::AssertionFailure() << "no first list: " << s.error_message();
    }
    if (Table(response.devices()) != kExpected) {
      return ::testing::AssertionFailure() << "first list " << Join(Table(response.devices()));
    }
  }
  if (how == 0 || how == 2) {
    context->TryCancel();
    const grpc::Status s = reader->Finish();
    if (s.error_code() != grpc::StatusCode::CANCELLED) {
      return ::testing::AssertionFailure() << "cancelled stream ended with " << s.error_code();
    }
  }
  reader.reset();  // before its context; an unfinished call is cancelled by gRPC here
  context.reset();
  return ::testing::AssertionSuccess();
}

TEST(FaultBinaryTest, ListAndWatchStreamsDroppedAbruptly) {
  TestNode node;
  const Config config = node.MakeConfig(hca::Mode::kExclusive);
  const std::string socket = config.SocketPath();
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  Child plugin(ServeArgs(config));
  ASSERT_TRUE(ServesExpected(plugin, kubelet));

  // Settle: two streams of each kind first (see KubeletDirWipedHundredTimes).
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(DropStream(socket, i % 4)) << "settle " << i;
  ASSERT_EQ(FreshList(socket), kExpected);
  const Counts baseline = WaitForSteadyCounts(plugin.pid(), absl::Seconds(1), kWait);
  ASSERT_GT(baseline.fds, 0);
  ASSERT_GT(baseline.threads, 0);

  for (int i = 0; i < 100; ++i) ASSERT_TRUE(DropStream(socket, i % 4)) << "stream " << i;
  const Counts after =
      WaitForCountsAtMost(plugin.pid(), {baseline.fds + kFdSlack, baseline.threads + kThreadSlack},
                          kWait);
  EXPECT_LE(after.fds, baseline.fds + kFdSlack) << "baseline " << baseline.fds;
  EXPECT_LE(after.threads, baseline.threads + kThreadSlack) << "baseline " << baseline.threads;
  std::printf("after 100 dropped streams: %s -> %s\n", Show(baseline).c_str(),
              Show(after).c_str());

  // Still serving: a fresh stream lists the same devices, Allocate works, and the kubelet's own
  // stream was left alone (no re-registration needed).
  EXPECT_EQ(FreshList(socket), kExpected);
  for (const auto& id : kPcis) EXPECT_TRUE(AllocateWorks(socket, id));
  EXPECT_EQ(kubelet.registrations(), 1);
  ASSERT_TRUE(node.fixture().SetPortState("mlx5_3", 1, "DOWN").ok());
  EXPECT_TRUE(
      kubelet.WaitForDevices(Is(WithHealth(kExpected, kPcis[3], "Unhealthy")), kWait).has_value());
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(2 * kWait), 0);
}

}  // namespace
}  // namespace rdp::deviceplugin
