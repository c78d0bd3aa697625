// RPC round trips against the real plugin server on a unix socket in a temp dir, beside floors
// on the same server; a no-op RPC with the same IDs (the transport's share) and the handlers
// called in-process (the plugin's own share). Every RPC benchmark reports
//   x_floor: its mean round trip divided by that of the empty RPC (GetDevicePluginOptions);
// GetPreferredAllocation and Allocate also
//   x_payload_floor: the same divided by that of a no-op RPC carrying the same request and
//   response bytes (bench/payload_floor.proto, served on the plugin's socket by this program
//   alone): what our handler costs beyond moving its bytes.
// The floors' calls are interleaved with the benchmark's, one of each after each call, so that
// all are measured in the same time window.
//
//   bench_rpc [--benchmark_filter=...]

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "benchmark/benchmark.h"
#include "base/log.h"
#include "bench/payload_floor.grpc.pb.h"
#include "serving/mutexes.h"
#include "serving/unix_server.h"
#include "deviceplugin/plugin_server.h"
#include "deviceplugin/service.h"
#include "sim/fake_pod_resources.h"
#include "sim/kubelet_sim.h"
#include "sim/sysfs_fixture.h"
#include "topology/discovery.h"

namespace rdp::deviceplugin {
namespace {

using sim::KubeletSim;
using sim::PreferredRequest;

using Clock = std::chrono::steady_clock;

// The payload floor: answers each call with the response last recorded for its method (the real
// RPC's answer to the same request), doing nothing else.
class PayloadFloorService final : public bench::PayloadFloor::CallbackService {
 public:
  void Record(const v1beta1::PreferredAllocationResponse& r) {
    absl::MutexLock lock(&mu_);
    prefer_ = r;
  }
  void Record(const v1beta1::AllocateResponse& r) {
    absl::MutexLock lock(&mu_);
    allocate_ = r;
  }
  grpc::ServerUnaryReactor* GetPreferredAllocation(
      grpc::CallbackServerContext* context, const v1beta1::PreferredAllocationRequest*,
      v1beta1::PreferredAllocationResponse* response) override {
    return Answer(context, response, prefer_);
  }
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context,
                                     const v1beta1::AllocateRequest*,
                                     v1beta1::AllocateResponse* response) override {
    return Answer(context, response, allocate_);
  }

 private:
  template <typename Response>
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, Response* response,
                                   const Response& recorded) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      *response = recorded;
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  absl::Mutex mu_;
  v1beta1::PreferredAllocationResponse prefer_ ABSL_GUARDED_BY(mu_);
  v1beta1::AllocateResponse allocate_ ABSL_GUARDED_BY(mu_);
};

// A node with n HCAs (two NUMA nodes, four PCIe roots), the plugin serving it (and the payload
// floor on its socket) and stubs.
struct Rig {
  std::string dir;
  std::unique_ptr<KubeletSim> kubelet;
  PayloadFloorService floor;
  std::unique_ptr<PluginServer> plugin;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
  std::unique_ptr<bench::PayloadFloor::Stub> floor_stub;  // on the plugin's socket
  std::vector<std::string> ids;  // the advertised IDs
};

double EmptyRoundTripNs(v1beta1::DevicePlugin::Stub& stub, int n) {
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext context;
    v1beta1::DevicePluginOptions options;
    stub.GetDevicePluginOptions(&context, v1beta1::Empty(), &options);
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / n;
}

std::map<std::pair<int, int>, std::unique_ptr<Rig>>& Rigs() {
  static auto* rigs = new std::map<std::pair<int, int>, std::unique_ptr<Rig>>();
  return *rigs;
}

// Stops every server and removes the temp dirs.
void TearDownRigsImpl() {
  for (auto& [key, rig] : Rigs()) {
    rig->plugin->Stop();
    rig->kubelet->Stop();
    std::error_code ec;
    std::filesystem::remove_all(rig->dir, ec);
  }
  Rigs().clear();
}

// `with_allocation_dir`: --allocation-dir set, as the chart sets it (Allocate writes and mounts
// /etc/rdma/allocation.json); the summary's figures are without.
Rig* GetRig(hca::Mode mode, int hcas, bool with_allocation_dir = false) {
  auto& rig = Rigs()[{static_cast<int>(mode) + (with_allocation_dir ? 2 : 0), hcas}];
  if (rig) return rig.get();
  rig = std::make_unique<Rig>();
  std::string tmpl = "/tmp/rdpb-XXXXXX";
  rig->dir = ::mkdtemp(tmpl.data());
  const std::string root = rig->dir + "/node";
  sim::SysfsFixture fixture(root);
  for (int i = 0; i < hcas; ++i) {
    sim::FixtureHca h;
    h.name = absl::StrFormat("mlx5_%d", i);
    h.pci = absl::StrFormat("0000:%02x:00.0", 0x10 + i * 4);
    h.numa = i < hcas / 2 ? 0 : 1;
    h.pcie_root = absl::StrFormat("pci0000:%02x", 0x10 + (i * 4 / hcas) * 0x20);
    fixture.AddHca(h).IgnoreError();
  }
  fixture.AddRdmaCm().IgnoreError();

  Config config;
  config.mode = mode;
  config.kubelet_dir = rig->dir + "/dp";
  config.pod_resources_socket = "";
  config.discovery.sysfs_root = root;
  config.discovery.dev_root = root;
  config.health_interval = absl::Seconds(5);
  if (with_allocation_dir) {
    config.allocation_dir = rig->dir + "/allocations";
    std::filesystem::create_directories(config.allocation_dir);
  }
  NodeSources sources;
  sources.scan = [root] { return topology::ReadSysfsHcas(root, root); };
  sources.discover = [root]() -> absl::StatusOr<topology::TopologyPtr> {
    auto found = topology::ReadSysfsHcas(root, root);
    if (!found.ok()) return found.status();
    return std::make_shared<const topology::Topology>(std::vector<int>{0, 1}, *found,
                                                      std::vector<topology::Gpu>{});
  };
  rig->kubelet = std::make_unique<KubeletSim>(config.kubelet_dir);
  rig->kubelet->Start().IgnoreError();
  rig->plugin = std::make_unique<PluginServer>(config, std::move(sources),
                                               std::vector<resources::Resource>{},
                                               std::vector<grpc::Service*>{&rig->floor});
  if (!rig->plugin->Start().ok()) std::abort();
  rig->kubelet->WaitForRegistration(0, absl::Seconds(10));
  // One connection for both services: the floor's calls share the device plugin's transport.
  std::shared_ptr<grpc::Channel> channel = serving::UnixChannel(config.SocketPath());
  rig->stub = v1beta1::DevicePlugin::NewStub(channel);
  rig->floor_stub = bench::PayloadFloor::NewStub(channel);
  for (const auto& d : rig->plugin->node().resource().Devices().devices) rig->ids.push_back(d.id);
  EmptyRoundTripNs(*rig->stub, 500);  // warm the connection
  return rig.get();
}

// One container asking for `size` of every advertised ID (1000 in shared mode).
v1beta1::PreferredAllocationRequest PreferRequest(const Rig& rig, int size) {
  v1beta1::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : rig.ids) c->add_available_deviceids(id);
  c->set_allocation_size(size);
  return request;
}

// One container given the first `devices` advertised IDs.
v1beta1::AllocateRequest AllocateRequest(const Rig& rig, int devices) {
  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (int i = 0; i < devices; ++i) c->add_devices_ids(rig.ids[i]);
  return request;
}

hca::Mode ModeArg(const benchmark::State& state) {
  return state.range(0) == 0 ? hca::Mode::kExclusive : hca::Mode::kShared;
}

void EmptyCall(Rig* rig) {
  grpc::ClientContext context;
  v1beta1::DevicePluginOptions options;
  benchmark::DoNotOptimize(
      rig->stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options));
}

// A floor a benchmark's call is divided by: its name in the counters and one call of it.
struct Floor {
  const char* name;  // "floor": x_floor and floor_us
  std::function<bool()> call;
  double seconds = 0;
};

// Runs `call` once per iteration and, interleaved, one call of each floor on the same server
// (in turn first after it), so that the floors are measured in the same time window as the call
// (the host is shared and noisy). The reported time is the call's alone (manual time); for each
// floor, x_<name> = call / floor and <name>_us, its mean round trip.
template <typename Call>
void RunBesideFloors(benchmark::State& state, Call&& call, std::vector<Floor> floors) {
  double call_s = 0;
  std::size_t turn = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    if (!call()) {
      state.SkipWithError("RPC failed");
      break;
    }
    const double c = std::chrono::duration<double>(Clock::now() - t0).count();
    call_s += c;
    state.SetIterationTime(c);
    for (std::size_t i = 0; i < floors.size(); ++i) {
      Floor& f = floors[(turn + i) % floors.size()];
      const auto f0 = Clock::now();
      if (!f.call()) {
        state.SkipWithError((std::string(f.name) + " RPC failed").c_str());
        return;
      }
      f.seconds += std::chrono::duration<double>(Clock::now() - f0).count();
    }
    ++turn;
  }
  for (const Floor& f : floors) {
    if (f.seconds <= 0) continue;
    state.counters[std::string("x_") + f.name] = call_s / f.seconds;
    state.counters[std::string(f.name) + "_us"] = f.seconds * 1e6 / state.iterations();
  }
}

Floor EmptyFloor(Rig* rig) {
  return {"floor", [rig] {
            EmptyCall(rig);
            return true;
          }};
}

// The real RPC `method` on `request`, and beside it the payload floor carrying the same request
// and the response the real RPC gave to it (recorded once, before the run).
template <typename Request, typename Response, typename Stub>
void RunBesideBothFloors(benchmark::State& state, Rig* rig, const Request& request,
                         grpc::Status (v1beta1::DevicePlugin::Stub::*method)(
                             grpc::ClientContext*, const Request&, Response*),
                         grpc::Status (Stub::*floor_method)(grpc::ClientContext*, const Request&,
                                                            Response*)) {
  auto real = [&] {
    grpc::ClientContext context;
    Response response;
    return ((*rig->stub).*method)(&context, request, &response).ok();
  };
  {
    grpc::ClientContext context;
    Response recorded;
    if (!((*rig->stub).*method)(&context, request, &recorded).ok()) {
      state.SkipWithError("RPC failed");
      return;
    }
    rig->floor.Record(recorded);
  }
  Floor payload{"payload_floor", [&] {
                  grpc::ClientContext context;
                  Response response;
                  return ((*rig->floor_stub).*floor_method)(&context, request, &response).ok();
                }};
  RunBesideFloors(state, real, {EmptyFloor(rig), std::move(payload)});
}

// args: mode (0 exclusive, 1 shared), HCAs
void BM_EmptyRpc(benchmark::State& state) {
  Rig* rig = GetRig(ModeArg(state), state.range(1));
  RunBesideFloors(
      state,
      [rig] {
        EmptyCall(rig);
        return true;
      },
      {EmptyFloor(rig)});
}

// args: mode, HCAs, allocation size. Available: every advertised ID (1000 in shared mode).
void BM_GetPreferredAllocation(benchmark::State& state) {
  Rig* rig = GetRig(ModeArg(state), state.range(1));
  RunBesideBothFloors(state, rig, PreferRequest(*rig, state.range(2)),
                      &v1beta1::DevicePlugin::Stub::GetPreferredAllocation,
                      &bench::PayloadFloor::Stub::GetPreferredAllocation);
}

// args: mode, HCAs, devices per container
void BM_Allocate(benchmark::State& state) {
  Rig* rig = GetRig(ModeArg(state), state.range(1));
  RunBesideBothFloors(state, rig, AllocateRequest(*rig, state.range(2)),
                      &v1beta1::DevicePlugin::Stub::Allocate, &bench::PayloadFloor::Stub::Allocate);
}

// The transport's share: PreStartContainer does nothing, so this is what a request with the same
// IDs costs over the empty RPC before any handler work. args: mode, HCAs, IDs in the request
// (the advertised ones, repeated as needed).
void BM_PreStartSameIds(benchmark::State& state) {
  Rig* rig = GetRig(ModeArg(state), state.range(1));
  v1beta1::PreStartContainerRequest request;
  for (int i = 0; i < state.range(2); ++i) {
    request.add_devices_ids(rig->ids[i % rig->ids.size()]);
  }
  RunBesideFloors(
      state,
      [&] {
        grpc::ClientContext context;
        v1beta1::PreStartContainerResponse response;
        return rig->stub->PreStartContainer(&context, request, &response).ok();
      },
      {EmptyFloor(rig)});
}

// The handlers alone, called in this thread without gRPC (the RPC benchmarks' share that is ours):
// args as BM_GetPreferredAllocation and BM_Allocate.
void BM_PreferHandler(benchmark::State& state) {
  Rig* rig = GetRig(ModeArg(state), state.range(1));
  const v1beta1::PreferredAllocationRequest request = PreferRequest(*rig, state.range(2));
  for (auto _ : state) {
    v1beta1::PreferredAllocationResponse response;
    bool ok = false;
    HandlePreferredAllocation(rig->plugin->node().resource(), request, &response,
                              [&ok](grpc::Status s) { ok = s.ok(); });
    if (!ok) {
      state.SkipWithError("GetPreferredAllocation failed");
      break;
    }
  }
}

// Args as BM_Allocate's; a first arg of 2: exclusive with --allocation-dir (the chart's default).
void BM_AllocateHandler(benchmark::State& state) {
  Rig* rig = state.range(0) == 2 ? GetRig(hca::Mode::kExclusive, state.range(1), true)
                                 : GetRig(ModeArg(state), state.range(1));
  const v1beta1::AllocateRequest request = AllocateRequest(*rig, state.range(2));
  for (auto _ : state) {
    v1beta1::AllocateResponse response;
    if (!HandleAllocate(rig->plugin->node().resource(), request, &response).ok()) {
      state.SkipWithError("Allocate failed");
      break;
    }
  }
}

// Admission on a busy node: exclusive GetPreferredAllocation (8 HCAs, size 2) with the GPU
// context known, against a pod-resources server holding 250 pods of 4 containers (two of them
// holding 2 GPUs and 1 HCA each, two holding nothing of ours) plus the container being admitted
// (2 GPUs, no HCA). Every call waits for the List it starts (a list at least as new as the call)
// and its answer: the figure is what admission costs on such a node. Reported: the median and
// the 99th percentile in microseconds.
// The calls are paced at the rate a kubelet admits (kAdmissionPace apart: the kubelet admits
// containers one at a time).
constexpr auto kAdmissionPace = std::chrono::milliseconds(60);  // about 16 admissions a second
constexpr int kAdmissionCalls = 100;
struct AdmissionRig {
  std::string dir;
  std::unique_ptr<sim::FakePodResources> pods;
  std::unique_ptr<KubeletSim> kubelet;
  std::unique_ptr<PluginServer> plugin;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
  std::vector<std::string> ids;
};

AdmissionRig* GetAdmissionRig() {
  static AdmissionRig* rig = [] {
    auto* r = new AdmissionRig();
    std::string tmpl = "/tmp/rdpb-XXXXXX";
    r->dir = ::mkdtemp(tmpl.data());
    const std::string root = r->dir + "/node";
    sim::SysfsFixture fixture(root);
    std::vector<topology::Gpu> gpus;
    for (int i = 0; i < 8; ++i) {
      sim::FixtureHca h;
      h.name = absl::StrFormat("mlx5_%d", i);
      h.pci = absl::StrFormat("0000:%02x:00.0", 0x10 + i * 4);
      h.numa = i < 4 ? 0 : 1;
      h.pcie_root = absl::StrFormat("pci0000:%02x", 0x10 + i * 4);
      fixture.AddHca(h).IgnoreError();
      topology::Gpu g;
      g.place.pci = absl::StrFormat("0000:%02x:00.0", 0x11 + i * 4);
      g.place.numa = h.numa;
      g.place.pcie_root = h.pcie_root;
      gpus.push_back(g);
    }
    fixture.AddRdmaCm().IgnoreError();
    // 250 pods of 4 containers: GPUs of the node and one HCA each in two, nothing in two.
    deviceplugin::PodList list;
    for (int p = 0; p < 250; ++p) {
      for (int c = 0; c < 4; ++c) {
        deviceplugin::ContainerDevices d;
        d.key = absl::StrFormat("team-%d/pod-%d/c%d", p % 20, p, c);
        if (c < 2) {
          d.devices["nvidia.com/gpu"] = {gpus[(p + c) % 8].place.pci};
          d.devices["rdma/hca"] = {absl::StrFormat("0000:%02x:00.0", 0x10 + ((p + c) % 8) * 4)};
        }
        list.push_back(std::move(d));
      }
    }
    deviceplugin::ContainerDevices admitted;
    admitted.key = "team-x/admitted/main";
    admitted.devices["nvidia.com/gpu"] = {gpus[1].place.pci, gpus[2].place.pci};
    list.push_back(admitted);
    r->pods = std::make_unique<sim::FakePodResources>(r->dir + "/pr.sock");
    r->pods->Set(list);
    if (!r->pods->Start().ok()) std::abort();

    Config config;
    config.mode = hca::Mode::kExclusive;
    config.kubelet_dir = r->dir + "/dp";
    config.pod_resources_socket = r->dir + "/pr.sock";
    config.discovery.sysfs_root = root;
    config.discovery.dev_root = root;
    config.proc_root = root;
    config.health_interval = absl::Seconds(5);
    config.admission_window = absl::Hours(1);  // the admitted container stays "being admitted"
    NodeSources sources;
    sources.scan = [root] { return topology::ReadSysfsHcas(root, root); };
    sources.discover = [root, gpus]() -> absl::StatusOr<topology::TopologyPtr> {
      auto found = topology::ReadSysfsHcas(root, root);
      if (!found.ok()) return found.status();
      return std::make_shared<const topology::Topology>(std::vector<int>{0, 1}, *found, gpus);
    };
    sources.pod_resources = NewGrpcPodResources(config.pod_resources_socket);
    r->kubelet = std::make_unique<KubeletSim>(config.kubelet_dir);
    r->kubelet->Start().IgnoreError();
    r->plugin = std::make_unique<PluginServer>(config, std::move(sources));
    if (!r->plugin->Start().ok()) std::abort();
    r->kubelet->WaitForRegistration(0, absl::Seconds(10));
    r->stub = r->kubelet->PluginStub();
    for (const auto& d : r->plugin->node().resource().Devices().devices) r->ids.push_back(d.id);
    return r;
  }();
  return rig;
}

void BM_AdmissionDense250(benchmark::State& state) {
  AdmissionRig* rig = GetAdmissionRig();
  v1beta1::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : rig->ids) c->add_available_deviceids(id);
  c->set_allocation_size(2);
  std::vector<double> us;
  auto next = Clock::now();
  for (auto _ : state) {
    std::this_thread::sleep_until(next);  // pacing between calls, outside the measured time
    const auto t0 = Clock::now();
    next = t0 + kAdmissionPace;
    grpc::ClientContext context;
    v1beta1::PreferredAllocationResponse response;
    if (!rig->stub->GetPreferredAllocation(&context, request, &response).ok()) {
      state.SkipWithError("GetPreferredAllocation failed");
      break;
    }
    // The GPU context was known: the HCAs beside the admitted container's GPUs (1 and 2).
    std::vector<std::string> got(response.container_responses(0).deviceids().begin(),
                                 response.container_responses(0).deviceids().end());
    std::sort(got.begin(), got.end());
    if (got != std::vector<std::string>{"0000:14:00.0", "0000:18:00.0"}) {
      state.SkipWithError("the answer did not follow the admitted container's GPUs");
      break;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(s);
    us.push_back(s * 1e6);
  }
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  auto at = [&us](double q) {
    return us[std::min(us.size() - 1, static_cast<std::size_t>(q * (us.size() - 1) + 0.5))];
  };
  state.counters["p50_us"] = at(0.50);
  state.counters["p99_us"] = at(0.99);
}

double RssMb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return 0;
}

// 1e5 calls (half Allocate, half GetPreferredAllocation) on the 32-HCA exclusive server; the
// process's RSS before and after (client and server share the process).
void BM_RssAfter1e5Calls(benchmark::State& state) {
  Rig* rig = GetRig(hca::Mode::kExclusive, 32);
  v1beta1::AllocateRequest alloc;
  alloc.add_container_requests()->add_devices_ids(rig->ids[0]);
  v1beta1::PreferredAllocationRequest prefer;
  auto* c = prefer.add_container_requests();
  for (const auto& id : rig->ids) c->add_available_deviceids(id);
  c->set_allocation_size(4);
  const double before = RssMb();
  for (auto _ : state) {
    for (int i = 0; i < 100000; ++i) {
      grpc::ClientContext context;
      if (i % 2 == 0) {
        v1beta1::AllocateResponse r;
        rig->stub->Allocate(&context, alloc, &r);
      } else {
        v1beta1::PreferredAllocationResponse r;
        rig->stub->GetPreferredAllocation(&context, prefer, &r);
      }
    }
  }
  state.counters["rss_before_mb"] = before;
  state.counters["rss_after_mb"] = RssMb();
}

BENCHMARK(BM_EmptyRpc)->Args({0, 8})->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GetPreferredAllocation)
    ->Args({0, 8, 1})->Args({0, 8, 2})->Args({0, 8, 4})
    ->Args({0, 32, 1})->Args({0, 32, 4})->Args({0, 32, 8})
    ->Args({1, 8, 1})->Args({1, 8, 8})  // shared: 1000 available IDs
    ->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Allocate)
    ->Args({0, 8, 1})->Args({0, 8, 4})->Args({0, 32, 1})->Args({0, 32, 8})
    ->Args({1, 8, 1})  // shared: every HCA's devices
    ->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PreStartSameIds)->Args({0, 8, 8})->Args({0, 32, 32})->Args({1, 8, 1000})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PreferHandler)
    ->Args({0, 8, 1})->Args({0, 8, 2})->Args({0, 8, 4})->Args({0, 32, 4})->Args({1, 8, 8})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AllocateHandler)->Args({0, 8, 1})->Args({0, 8, 4})->Args({2, 8, 4})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RssAfter1e5Calls)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdmissionDense250)
    ->UseManualTime()
    ->Iterations(kAdmissionCalls)  // paced: 6 s a repetition
    ->Unit(benchmark::kMicrosecond);

}  // namespace

void TearDownRigs();
void TearDownRigs() { TearDownRigsImpl(); }

}  // namespace rdp::deviceplugin

int main(int argc, char** argv) {
  rdp::serving::DisableMutexDeadlockDetection();  // as the plugin runs (server/mutexes.h)
  rdp::SetLogLevel("warn");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  rdp::deviceplugin::TearDownRigs();
  return 0;
}
