// Load on the real plugin process. The rdma-device-plugin binary is spawned in exclusive mode on a
// fake node (by default the bundled dgx-h100-like node, laid out by SysfsFixture in a temp dir),
// registers with the kubelet simulator in this process, and is driven over its unix socket by
// --clients concurrent clients, each on its own connection, in four phases:
//   warm-up (--warmup)         the load mix; not reported, but its errors count;
//   floor   (--floor-duration) every client loops on the empty RPC GetDevicePluginOptions;
//   load    (--duration)       every client loops on GetPreferredAllocation (random size 1..N,
//                              random must_include drawn from the N advertised IDs), then
//                              Allocate of the IDs it answered;
//   floor   (--floor-duration) again, so that a change in the host's background load during the
//                              run shows as a difference between the two floors.
// Reported: per RPC p50/p90/p99/max and each p50/p99 as a ratio to the floor's (both floor phases
// pooled, same concurrency), throughput, errors by gRPC code (BAD_ANSWER: an OK reply that breaks
// the request's contract), the plugin's CPU time per call, and its VmRSS/threads at each phase
// boundary, VmRSS every 10 s of the load, and VmHWM. The plugin is a separate process, so its
// memory figures are its own.
// By default a fake pod-resources server shows one container holding two GPUs being admitted,
// so every GetPreferredAllocation takes the GPU-context path (pod-resources List + placement).
// Exit 0 only when no call failed, the plugin stayed up and it exited 0 on SIGTERM.
//
//   bench_load [--clients 64] [--duration 60s] [--floor-duration 10s] [--warmup 2s]
//              [--rpc-deadline 5s] [--binary PATH] [--topology-xml X] [--no-pod-resources]
//              [--seed S] [--json OUT] [--scrape] [--scrape-interval 0s]
// --scrape: the plugin also serves --metrics-address on an ephemeral port, and a scraper thread
// here GETs /metrics for the whole run, back to back or one every --scrape-interval
// (docs/metrics.md: scrapes under load).

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "base/log.h"
#include "deviceplugin/pod_resources.h"
#include "kube/transport.h"
#include "sim/fake_pod_resources.h"
#include "sim/kubelet_sim.h"
#include "sim/fixture_node.h"
#include "test/support/child.h"
#include "test/support/temp_dir.h"
#include "topology/discovery.h"

namespace rdp::deviceplugin {
namespace {

using sim::FakePodResources;
using sim::KubeletSim;
using sim::PreferredRequest;

using Clock = std::chrono::steady_clock;
constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kStopTimeout = absl::Seconds(20);

struct Flags {
  int clients = 64;
  std::string duration = "60s";
  std::string floor_duration = "10s";
  std::string warmup = "2s";
  std::string rpc_deadline = "5s";
  std::string binary = testing::PluginBinary();
  std::string topology_xml;  // empty: the bundled dgx-h100-like node
  bool pod_resources = true;
  unsigned seed = 1;
  std::string json;
  bool scrape = false;
  std::string scrape_interval = "0s";
};

// ---- the plugin process ----------------------------------------------------------------------

// What /proc says about a process: memory, threads, CPU time.
struct ProcSample {
  double rss_mb = 0;
  double hwm_mb = 0;
  double anon_mb = 0;  // smaps_rollup "Anonymous": the process's own heap and stacks
  int threads = 0;
  double cpu_s = 0;  // user + system
};

ProcSample SampleProc(pid_t pid) {
  ProcSample s;
  std::ifstream status(absl::StrFormat("/proc/%d/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mb = std::atof(line.c_str() + 6) / 1024.0;
    if (line.rfind("VmHWM:", 0) == 0) s.hwm_mb = std::atof(line.c_str() + 6) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) s.threads = std::atoi(line.c_str() + 8);
  }
  std::ifstream rollup(absl::StrFormat("/proc/%d/smaps_rollup", pid));
  while (std::getline(rollup, line)) {
    if (line.rfind("Anonymous:", 0) == 0) s.anon_mb = std::atof(line.c_str() + 10) / 1024.0;
  }
  std::ifstream stat(absl::StrFormat("/proc/%d/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');  // the command name may hold spaces
  if (paren != std::string::npos) {
    std::istringstream fields(text.substr(paren + 2));
    std::vector<std::string> f((std::istream_iterator<std::string>(fields)),
                               std::istream_iterator<std::string>());
    if (f.size() > 12) {  // f[0] is field 3 (state); utime and stime are fields 14 and 15
      s.cpu_s = (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) / ::sysconf(_SC_CLK_TCK);
    }
  }
  return s;
}

// ---- the fake node ---------------------------------------------------------------------------

// The fake node: its XML (the bundled one unless --topology-xml), its trees under <dir>/node.
using Node = sim::FixtureNode;
using sim::LayOutNode;

// ---- clients ---------------------------------------------------------------------------------

enum Rpc { kOptions, kPrefer, kAllocate, kRpcs };
constexpr const char* kRpcNames[kRpcs] = {"GetDevicePluginOptions", "GetPreferredAllocation",
                                          "Allocate"};

std::string CodeName(grpc::StatusCode code) {
  // grpc::StatusCode values 0..16, in order.
  static const char* const kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                       "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                       "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : absl::StrFormat("CODE_%d", i);
}

// One client's record of one phase.
struct Samples {
  std::array<std::vector<std::int64_t>, kRpcs> ns;  // latency of every call, failed ones too
  std::array<std::map<std::string, std::int64_t>, kRpcs> errors;

  void Merge(const Samples& other) {
    for (int r = 0; r < kRpcs; ++r) {
      ns[r].insert(ns[r].end(), other.ns[r].begin(), other.ns[r].end());
      for (const auto& [code, n] : other.errors[r]) errors[r][code] += n;
    }
  }
};

// A kubelet-like client on its own connection. Not thread-safe: one thread drives each.
class Client {
 public:
  Client(const std::string& socket, const std::vector<std::string>& ids, unsigned seed,
         absl::Duration rpc_deadline)
      : channel_(serving::UnixChannel(socket)),
        stub_(v1beta1::DevicePlugin::NewStub(channel_)),
        ids_(ids),
        rng_(seed),
        rpc_deadline_(rpc_deadline) {}

  bool Connect(absl::Duration timeout) {
    return channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout));
  }

  void Empty(Samples& s) {
    v1beta1::DevicePluginOptions options;
    Call(s, kOptions, [&](grpc::ClientContext* c) {
      return stub_->GetDevicePluginOptions(c, v1beta1::Empty(), &options);
    });
  }

  // GetPreferredAllocation of a random size with a random must_include, then Allocate of the
  // answer; an answer that breaks the request's contract counts as BAD_ANSWER.
  void PreferThenAllocate(Samples& s) {
    const int size = std::uniform_int_distribution<int>(1, static_cast<int>(ids_.size()))(rng_);
    std::vector<std::string> must = ids_;
    std::shuffle(must.begin(), must.end(), rng_);
    must.resize(std::uniform_int_distribution<int>(0, size)(rng_));
    const v1beta1::PreferredAllocationRequest prefer = PreferredRequest(ids_, must, size);
    v1beta1::PreferredAllocationResponse preferred;
    grpc::Status st = Call(s, kPrefer, [&](grpc::ClientContext* c) {
      return stub_->GetPreferredAllocation(c, prefer, &preferred);
    });
    if (!st.ok()) return;
    if (preferred.container_responses_size() != 1) return BadAnswer(s, kPrefer);
    const auto& got = preferred.container_responses(0).deviceids();
    const std::set<std::string> answer(got.begin(), got.end());
    bool good = static_cast<int>(answer.size()) == size && got.size() == size;
    for (const auto& id : answer) good = good && std::count(ids_.begin(), ids_.end(), id) == 1;
    for (const auto& id : must) good = good && answer.count(id) == 1;
    if (!good) return BadAnswer(s, kPrefer);

    v1beta1::AllocateRequest request;
    auto* container = request.add_container_requests();
    for (const auto& id : got) container->add_devices_ids(id);
    v1beta1::AllocateResponse allocated;
    st = Call(s, kAllocate,
              [&](grpc::ClientContext* c) { return stub_->Allocate(c, request, &allocated); });
    if (st.ok() && (allocated.container_responses_size() != 1 ||
                    allocated.container_responses(0).devices().empty())) {
      BadAnswer(s, kAllocate);
    }
  }

 private:
  template <typename F>
  grpc::Status Call(Samples& s, Rpc rpc, F&& rpc_call) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_deadline_));
    const auto start = Clock::now();
    grpc::Status status = rpc_call(&context);
    s.ns[rpc].push_back(std::chrono::nanoseconds(Clock::now() - start).count());
    if (!status.ok()) ++s.errors[rpc][CodeName(status.error_code())];
    return status;
  }
  static void BadAnswer(Samples& s, Rpc rpc) { ++s.errors[rpc]["BAD_ANSWER"]; }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
  const std::vector<std::string>& ids_;
  std::mt19937 rng_;
  const absl::Duration rpc_deadline_;
};

// ---- phases ----------------------------------------------------------------------------------

enum class Work { kEmpty, kPreferAllocate };

struct Phase {
  double seconds = 0;
  double cpu_s = 0;            // the plugin's CPU time during the phase
  Samples samples;             // every call of every client
  ProcSample after;            // the plugin at the end of the phase
  std::vector<double> rss_mb;  // the plugin's VmRSS once a second during the phase

  std::int64_t Calls() const {
    std::int64_t n = 0;
    for (const auto& ns : samples.ns) n += ns.size();
    return n;
  }
  std::int64_t Errors() const {
    std::int64_t n = 0;
    for (const auto& errors : samples.errors) {
      for (const auto& [code, count] : errors) n += count;
    }
    return n;
  }
  double CpuUsPerCall() const { return Calls() > 0 ? cpu_s * 1e6 / Calls() : 0; }
};

// Both phases as one: their calls pooled, their times and CPU added.
Phase Pool(const Phase& a, const Phase& b) {
  Phase p;
  p.seconds = a.seconds + b.seconds;
  p.cpu_s = a.cpu_s + b.cpu_s;
  p.samples.Merge(a.samples);
  p.samples.Merge(b.samples);
  return p;
}

// Every client runs `work` in its own thread until `length` has passed since the common start;
// calls in flight at the end complete and count.
Phase RunPhase(std::vector<std::unique_ptr<Client>>& clients, Work work, absl::Duration length,
               pid_t plugin) {
  std::vector<Samples> per_client(clients.size());
  absl::Notification go;
  Clock::time_point end;  // written before go.Notify(), read after it
  std::vector<std::thread> threads;
  for (size_t i = 0; i < clients.size(); ++i) {
    threads.emplace_back([&, i] {
      go.WaitForNotification();
      while (Clock::now() < end) {
        if (work == Work::kEmpty) {
          clients[i]->Empty(per_client[i]);
        } else {
          clients[i]->PreferThenAllocate(per_client[i]);
        }
      }
    });
  }
  Phase phase;
  const double cpu_before = SampleProc(plugin).cpu_s;
  const auto start = Clock::now();
  end = start + absl::ToChronoNanoseconds(length);
  go.Notify();
  // A timer, not synchronisation: the clients stop by themselves at `end`.
  for (auto tick = start + std::chrono::seconds(1); tick < end; tick += std::chrono::seconds(1)) {
    std::this_thread::sleep_until(tick);
    phase.rss_mb.push_back(SampleProc(plugin).rss_mb);
  }
  for (auto& t : threads) t.join();
  phase.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  phase.after = SampleProc(plugin);
  phase.cpu_s = phase.after.cpu_s - cpu_before;
  for (const auto& s : per_client) phase.samples.Merge(s);
  return phase;
}

struct RpcStats {
  std::int64_t calls = 0;
  double per_s = 0;
  double p50_us = 0, p90_us = 0, p99_us = 0, max_us = 0;
  std::map<std::string, std::int64_t> errors;
};

// Nearest-rank percentile of sorted latencies, in microseconds.
double PercentileUs(const std::vector<std::int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p * sorted.size()));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1] / 1e3;
}

RpcStats Stats(const Phase& phase, Rpc rpc) {
  std::vector<std::int64_t> ns = phase.samples.ns[rpc];
  std::sort(ns.begin(), ns.end());
  RpcStats r;
  r.calls = ns.size();
  r.per_s = phase.seconds > 0 ? r.calls / phase.seconds : 0;
  r.p50_us = PercentileUs(ns, 0.50);
  r.p90_us = PercentileUs(ns, 0.90);
  r.p99_us = PercentileUs(ns, 0.99);
  r.max_us = ns.empty() ? 0 : ns.back() / 1e3;
  r.errors = phase.samples.errors[rpc];
  return r;
}

// ---- report ----------------------------------------------------------------------------------

struct Run {
  Flags flags;
  Node node;
  size_t ids = 0;
  pid_t pid = 0;
  ProcSample idle;  // registered, listed, clients connected, no traffic yet
  // In order. The floor is measured before and after the load, so that a change in the host's
  // background load during the run shows as a difference between the two.
  Phase warmup, floor_before, load, floor_after;
  Phase floor;  // both floor phases pooled: what ratios are taken against
  int pod_resources_lists = 0;
  // --scrape: /metrics fetched over the run, failures, and the slowest and median fetch.
  std::int64_t scrapes = 0, scrape_failures = 0;
  double scrape_p50_ms = 0, scrape_max_ms = 0, scrape_bytes = 0;
  bool alive = false;  // the plugin was running after the last phase
  std::string stop;    // "exit 0" or what went wrong
  std::int64_t Errors() const {
    return warmup.Errors() + floor_before.Errors() + load.Errors() + floor_after.Errors();
  }
};

std::string ErrorText(const std::map<std::string, std::int64_t>& errors) {
  std::string out;
  for (const auto& [code, n] : errors) {
    out += absl::StrFormat("%s%s=%d", out.empty() ? "" : ",", code, n);
  }
  return out.empty() ? "0" : out;
}

void PrintRow(const std::string& label, Rpc rpc, const RpcStats& r, const RpcStats& floor) {
  absl::PrintF("%-12s %-23s %8d %8.0f %7.0f %7.0f %7.0f %8.0f %6.2f %6.2f  %s\n", label,
               kRpcNames[rpc], r.calls, r.per_s, r.p50_us, r.p90_us, r.p99_us, r.max_us,
               r.p50_us / floor.p50_us, r.p99_us / floor.p99_us, ErrorText(r.errors));
}

void PrintMemory(const Run& run) {
  absl::PrintF("plugin memory         VmRSS MB   anon MB  threads\n");
  const std::pair<const char*, const ProcSample*> rows[] = {
      {"idle", &run.idle},
      {"after warm-up", &run.warmup.after},
      {"after floor", &run.floor_before.after},
      {"after load", &run.load.after},
      {"after 2nd floor", &run.floor_after.after}};
  for (const auto& [label, s] : rows) {
    absl::PrintF("  %-18s %9.2f %9.2f %8d\n", label, s->rss_mb, s->anon_mb, s->threads);
  }
  absl::PrintF("  during load, at 10 s, 20 s, ...:");
  for (size_t i = 9; i < run.load.rss_mb.size(); i += 10) absl::PrintF(" %.2f", run.load.rss_mb[i]);
  absl::PrintF("\n  VmHWM (peak) %.2f MB; load phase %+.2f MB; since idle %+.2f MB\n",
               run.floor_after.after.hwm_mb, run.load.after.rss_mb - run.floor_before.after.rss_mb,
               run.floor_after.after.rss_mb - run.idle.rss_mb);
}

void PrintReport(const Run& run) {
  const auto& topo = *run.node.topology;
  absl::PrintF(
      "bench_load: %d clients (one connection each), %u CPUs; plugin pid %d, exclusive mode, "
      "%d HCAs (%d IDs advertised), %d GPUs, pod-resources %s\n",
      run.flags.clients, std::thread::hardware_concurrency(), run.pid,
      static_cast<int>(topo.hcas().size()), static_cast<int>(run.ids),
      static_cast<int>(topo.gpus().size()), run.flags.pod_resources ? "on" : "off");
  absl::PrintF("phases: warm-up %.1f s, floor %.1f s, load %.1f s, floor %.1f s\n\n",
               run.warmup.seconds, run.floor_before.seconds, run.load.seconds,
               run.floor_after.seconds);
  absl::PrintF("%-12s %-23s %8s %8s %7s %7s %7s %8s %6s %6s  %s\n", "phase", "rpc", "calls",
               "calls/s", "p50 us", "p90 us", "p99 us", "max us", "p50 x", "p99 x", "errors");
  const RpcStats floor = Stats(run.floor, kOptions);
  PrintRow("floor", kOptions, floor, floor);
  PrintRow(" before load", kOptions, Stats(run.floor_before, kOptions), floor);
  PrintRow(" after load", kOptions, Stats(run.floor_after, kOptions), floor);
  PrintRow("load", kPrefer, Stats(run.load, kPrefer), floor);
  PrintRow("load", kAllocate, Stats(run.load, kAllocate), floor);
  absl::PrintF("(p50 x, p99 x: the percentile divided by the same percentile of the floor, both "
               "floor phases pooled)\n\n");
  absl::PrintF("plugin CPU per call: floor %.1f us, load %.1f us (x%.2f)\n",
               run.floor.CpuUsPerCall(), run.load.CpuUsPerCall(),
               run.load.CpuUsPerCall() / run.floor.CpuUsPerCall());
  if (run.flags.pod_resources) {
    absl::PrintF("pod-resources List calls from the plugin: %d\n", run.pod_resources_lists);
  }
  if (run.flags.scrape) {
    absl::PrintF("/metrics scrapes during the run: %d (%s), %d failed, p50 %.2f ms, "
                 "max %.2f ms, %.0f bytes each\n",
                 run.scrapes,
                 run.flags.scrape_interval == "0s" ? "back to back"
                                                   : "every " + run.flags.scrape_interval,
                 run.scrape_failures, run.scrape_p50_ms, run.scrape_max_ms, run.scrape_bytes);
  }
  absl::PrintF("\n");
  PrintMemory(run);
  absl::PrintF("\nerrors: %d (warm-up %d, floor %d, load %d, floor %d); plugin %s at the end; "
               "stop: %s\n",
               run.Errors(), run.warmup.Errors(), run.floor_before.Errors(), run.load.Errors(),
               run.floor_after.Errors(), run.alive ? "running" : "NOT RUNNING", run.stop);
}

nlohmann::json ToJson(const ProcSample& s) {
  return {{"rss_mb", s.rss_mb},   {"hwm_mb", s.hwm_mb}, {"anon_mb", s.anon_mb},
          {"threads", s.threads}, {"cpu_s", s.cpu_s}};
}

nlohmann::json ToJson(const Phase& p) {
  nlohmann::json rpcs = nlohmann::json::object();
  for (Rpc r : {kOptions, kPrefer, kAllocate}) {
    const RpcStats s = Stats(p, r);
    if (s.calls == 0) continue;
    rpcs[kRpcNames[r]] = {{"calls", s.calls},   {"per_s", s.per_s},   {"p50_us", s.p50_us},
                          {"p90_us", s.p90_us}, {"p99_us", s.p99_us}, {"max_us", s.max_us},
                          {"errors", s.errors}};
  }
  return {{"seconds", p.seconds},
          {"rpcs", rpcs},
          {"plugin_cpu_us_per_call", p.CpuUsPerCall()},
          {"plugin_after", ToJson(p.after)},
          {"rss_mb_each_second", p.rss_mb}};
}

nlohmann::json ToJson(const Run& run) {
  const RpcStats floor = Stats(run.floor, kOptions);
  nlohmann::json ratios;
  for (Rpc r : {kPrefer, kAllocate}) {
    const RpcStats s = Stats(run.load, r);
    ratios[kRpcNames[r]] = {{"p50", s.p50_us / floor.p50_us}, {"p99", s.p99_us / floor.p99_us}};
  }
  return {{"clients", run.flags.clients},
          {"cpus", std::thread::hardware_concurrency()},
          {"hcas", run.node.topology->hcas().size()},
          {"gpus", run.node.topology->gpus().size()},
          {"pod_resources", run.flags.pod_resources},
          {"idle", ToJson(run.idle)},
          {"warmup", ToJson(run.warmup)},
          {"floor_before", ToJson(run.floor_before)},
          {"load", ToJson(run.load)},
          {"floor_after", ToJson(run.floor_after)},
          {"floor_pooled", {{"p50_us", floor.p50_us}, {"p99_us", floor.p99_us}}},
          {"x_floor", ratios},
          {"pod_resources_lists", run.pod_resources_lists},
          {"scrape", run.flags.scrape},
          {"scrapes", run.scrapes},
          {"scrape_failures", run.scrape_failures},
          {"scrape_p50_ms", run.scrape_p50_ms},
          {"scrape_max_ms", run.scrape_max_ms},
          {"errors", run.Errors()},
          {"alive", run.alive},
          {"stop", run.stop}};
}

// ---- the run ---------------------------------------------------------------------------------

struct Durations {
  absl::Duration load, floor, warmup, rpc_deadline, scrape_interval;
};

// The plugin's command line: exclusive mode on the fake node, our kubelet directory.
std::vector<std::string> PluginArgs(const Node& node, const std::string& dir, bool pod_resources,
                                    bool scrape) {
  std::vector<std::string> args = {
      "serve", "--mode", "exclusive", "--topology-xml", node.xml, "--sysfs-root", node.root,
      "--dev-root", node.root, "--kubelet-dir", dir + "/device-plugins",
      "--pod-resources-socket", pod_resources ? dir + "/pod-resources.sock" : "",
      // the GPU container stays "being admitted" for the whole run
      "--admission-window", "24h", "--node-name", "bench-node",
      // info for the "metrics: serving on" line; nothing is logged at info under load
      "--log-level", scrape ? "info" : "warn"};
  if (scrape) {
    args.push_back("--metrics-address");
    args.push_back("127.0.0.1:0");
  }
  return args;
}

// Fetches `url` back to back until `stop`, through kube/'s HTTP transport (libcurl, the
// connection kept); fills run's scrape figures.
class Scraper {
 public:
  Scraper(std::string url, absl::Duration interval, Run* run)
      : url_(std::move(url)), interval_(interval), run_(run) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Scraper() {
    stop_ = true;
    thread_.join();
    std::sort(ms_.begin(), ms_.end());
    if (!ms_.empty()) {
      run_->scrape_p50_ms = ms_[ms_.size() / 2];
      run_->scrape_max_ms = ms_.back();
    }
  }

 private:
  void Loop() {
    const std::unique_ptr<kube::Transport> transport = kube::NewCurlTransport({});
    kube::HttpRequest request;
    request.method = "GET";
    request.url = url_;
    request.timeout = absl::Seconds(10);
    auto next = std::chrono::steady_clock::now();
    while (!stop_) {
      // Paced like a Prometheus with a short scrape_interval (a benchmark's pace, not a
      // synchronisation); back to back when the interval is 0.
      next += absl::ToChronoNanoseconds(interval_);
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<kube::HttpResponse> got = transport->RoundTrip(request);
      ms_.push_back(std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start).count());
      ++run_->scrapes;
      if (!got.ok() || got->status != 200) ++run_->scrape_failures;
      run_->scrape_bytes = got.ok() ? static_cast<double>(got->body.size()) : 0;
      std::this_thread::sleep_until(next);
    }
  }

  const std::string url_;
  const absl::Duration interval_;
  Run* const run_;  // its scrape fields are this thread's until the destructor joins it
  std::vector<double> ms_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The two GPUs under the node's last PCIe root, held by one container (as in `demo`).
PodList GpuPod(const topology::Topology& topo) {
  const auto& gpus = topo.gpus();
  if (gpus.size() < 2) return {};
  return {{"default/train-0/main",
           {{"nvidia.com/gpu", {gpus[gpus.size() - 2].place.pci, gpus.back().place.pci}}}}};
}

// Waits for the plugin to register and list every HCA Healthy; the advertised IDs, or empty.
std::vector<std::string> WaitUntilListed(const KubeletSim& kubelet, size_t hcas,
                                         std::string* endpoint) {
  auto reg = kubelet.WaitForRegistration(0, kStartTimeout);
  auto devices = kubelet.WaitForDevices(
      [hcas](const KubeletSim::Devices& list) {
        return list.size() == hcas && std::all_of(list.begin(), list.end(), [](const auto& dev) {
                 return dev.health() == "Healthy";
               });
      },
      kStartTimeout);
  if (!reg || !devices) return {};
  *endpoint = reg->endpoint;
  std::vector<std::string> ids;
  for (const auto& dev : *devices) ids.push_back(dev.id());
  return ids;
}

// The phases, against a registered plugin; fills run.
void RunPhases(const Durations& d, const std::vector<std::string>& ids, const std::string& socket,
               Run& run) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < run.flags.clients; ++i) {
    clients.push_back(std::make_unique<Client>(socket, ids, run.flags.seed + i, d.rpc_deadline));
    // A client that cannot connect shows up as UNAVAILABLE errors in the first phase.
    clients.back()->Connect(kStartTimeout);
  }
  run.idle = SampleProc(run.pid);
  run.warmup = RunPhase(clients, Work::kPreferAllocate, d.warmup, run.pid);
  run.floor_before = RunPhase(clients, Work::kEmpty, d.floor, run.pid);
  run.load = RunPhase(clients, Work::kPreferAllocate, d.load, run.pid);
  run.floor_after = RunPhase(clients, Work::kEmpty, d.floor, run.pid);
  run.floor = Pool(run.floor_before, run.floor_after);
}

int RunLoad(const Flags& flags, const Durations& d, const std::string& dir) {
  Run run;
  run.flags = flags;
  absl::StatusOr<Node> node = LayOutNode(dir, flags.topology_xml);
  if (!node.ok()) {
    std::cerr << "bench_load: cannot lay out the node: " << node.status() << "\n";
    return 1;
  }
  run.node = *node;
  KubeletSim kubelet(dir + "/device-plugins");
  FakePodResources pods(dir + "/pod-resources.sock");
  if (absl::Status s = kubelet.Start(); !s.ok()) {
    std::cerr << "bench_load: kubelet simulator: " << s << "\n";
    return 1;
  }
  if (flags.pod_resources) {
    if (absl::Status s = pods.Start(); !s.ok()) {
      std::cerr << "bench_load: pod-resources server: " << s << "\n";
      return 1;
    }
    pods.Set(GpuPod(*run.node.topology));
  }
  // The plugin dies with this process, so an interrupted run leaves no plugin behind.
  testing::Child plugin(flags.binary,
                        PluginArgs(run.node, dir, flags.pod_resources, flags.scrape));
  if (!plugin.running()) {
    std::cerr << "bench_load: cannot start " << flags.binary << "\n";
    return 1;
  }
  run.pid = plugin.pid();
  const size_t hcas = run.node.topology->hcas().size();
  std::string endpoint;
  const std::vector<std::string> ids = WaitUntilListed(kubelet, hcas, &endpoint);
  if (ids.empty()) {
    std::cerr << "bench_load: the plugin did not register and list " << hcas
              << " healthy HCAs within " << kStartTimeout
              << (plugin.Exited() ? "; it exited:\n" + plugin.output() : "") << "\n";
    return 1;
  }
  run.ids = ids.size();
  std::unique_ptr<Scraper> scraper;
  if (flags.scrape) {
    const std::string address = sim::WaitForMetricsAddress(plugin, kStartTimeout);
    if (address.empty()) {
      std::cerr << "bench_load: the plugin did not serve metrics:\n" << plugin.output() << "\n";
      return 1;
    }
    scraper = std::make_unique<Scraper>("http://" + address + "/metrics", d.scrape_interval, &run);
  }
  RunPhases(d, ids, kubelet.dir() + "/" + endpoint, run);
  scraper.reset();
  run.alive = !plugin.Exited();
  if (flags.pod_resources) run.pod_resources_lists = pods.list_calls();

  plugin.Signal(SIGTERM);
  const int code = plugin.Wait(kStopTimeout);
  run.stop = code >= 0 ? absl::StrFormat("exit %d", code)
                       : "no clean exit after SIGTERM (killed, or died of a signal)";
  PrintReport(run);
  if (!flags.json.empty()) std::ofstream(flags.json) << ToJson(run).dump(2) << "\n";
  const bool clean = code == 0;
  return run.Errors() == 0 && run.alive && clean ? 0 : 1;
}

bool ParseDurations(const Flags& f, Durations* d) {
  const std::pair<const std::string*, absl::Duration*> fields[] = {
      {&f.duration, &d->load},
      {&f.floor_duration, &d->floor},
      {&f.warmup, &d->warmup},
      {&f.rpc_deadline, &d->rpc_deadline},
      {&f.scrape_interval, &d->scrape_interval}};
  for (const auto& [text, out] : fields) {
    if (!absl::ParseDuration(*text, out) || *out < absl::ZeroDuration()) {
      std::cerr << "bench_load: '" << *text << "': not a duration such as 60s or 500ms\n";
      return false;
    }
  }
  if (d->load == absl::ZeroDuration() || d->floor == absl::ZeroDuration() ||
      d->rpc_deadline == absl::ZeroDuration()) {
    std::cerr << "bench_load: --duration, --floor-duration and --rpc-deadline must be positive\n";
    return false;
  }
  return true;
}

}  // namespace
}  // namespace rdp::deviceplugin

int main(int argc, char** argv) {
  rdp::deviceplugin::Flags f;
  CLI::App app{"Load on the rdma-device-plugin binary: concurrent GetPreferredAllocation + "
               "Allocate over its unix socket, beside an empty-RPC floor",
               "bench_load"};
  app.add_option("--clients", f.clients, "Concurrent clients, one connection each")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--duration", f.duration, "Load phase")->capture_default_str();
  app.add_option("--floor-duration", f.floor_duration,
                 "Each empty-RPC phase (one before, one after the load)")
      ->capture_default_str();
  app.add_option("--warmup", f.warmup, "Unreported warm-up with the load mix")
      ->capture_default_str();
  app.add_option("--rpc-deadline", f.rpc_deadline, "Deadline of every call")
      ->capture_default_str();
  app.add_option("--binary", f.binary, "The rdma-device-plugin binary")->capture_default_str();
  app.add_option("--topology-xml", f.topology_xml,
                 "hwloc XML of the node (default: the bundled dgx-h100-like node)");
  app.add_flag("--pod-resources,!--no-pod-resources", f.pod_resources,
               "Serve pod-resources with one GPU container being admitted (default on)");
  app.add_option("--seed", f.seed, "Seed of client i is seed + i")->capture_default_str();
  app.add_option("--json", f.json, "Also write the results as JSON to this file");
  app.add_flag("--scrape", f.scrape,
               "Serve --metrics-address and scrape /metrics for the whole run");
  app.add_option("--scrape-interval", f.scrape_interval,
                 "With --scrape: one scrape every this long; 0s: back to back")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "bench_load: " << e.what() << "\n";
    return 2;
  }
  rdp::deviceplugin::Durations d;
  if (!rdp::deviceplugin::ParseDurations(f, &d)) return 2;
  rdp::SetLogLevel("warn");

  std::string dir = "/tmp/rdpl-XXXXXX";  // short: unix socket paths are limited to 107 bytes
  if (::mkdtemp(dir.data()) == nullptr) {
    std::cerr << "bench_load: cannot create a temporary directory\n";
    return 1;
  }
  const int code = rdp::deviceplugin::RunLoad(f, d, dir);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return code;
}
