// Discovery cost per fixture, beside hwloc loading the same input with I/O discovery on.
// The figure is the ratio ours / hwloc alone, printed as the "ratio_to_hwloc" counter of each
// BM_Discover run (the hwloc floor is measured in the same process first).
//
//   build/bench/bench_discovery --benchmark_min_time=0.2

#include <hwloc.h>

#include <time.h>

#include <cstdlib>
#include <map>
#include <string>

#include "benchmark/benchmark.h"
#include "topology/discovery.h"
#include "base/log.h"
#include "sim/sysfs_fixture.h"

namespace {

const char* kFixtures[] = {"dgx-h100-like.xml", "nvidiaDGX2.xml", "16intel64-manyVFs.xml",
                           "32em64t-2n8c2t-pci-normalio.xml", "96em64t-4n4d3ca2co-pci.xml"};

std::string Data(const std::string& f) { return std::string(RDP_TEST_DATA) + "/" + f; }

// One hwloc load of the XML, with the same filters discovery uses.
void HwlocLoad(const std::string& xml) {
  hwloc_topology_t t;
  hwloc_topology_init(&t);
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_xml(t, xml.c_str());
  if (hwloc_topology_load(t) != 0) std::abort();
  hwloc_topology_destroy(t);
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Each iteration loads the input with hwloc alone, then runs our discovery on it; both are
// timed in thread CPU time, interleaved, so a busy machine slows both alike. The reported time is
// ours; "ratio_to_hwloc" is ours / hwloc alone over the whole run.
void RunInterleaved(benchmark::State& state, const std::string& xml,
                    const rdp::topology::DiscoveryOptions& o) {
  double ours = 0, floor = 0;
  for (auto _ : state) {
    double t0 = ThreadCpuSeconds();
    HwlocLoad(xml);
    double t1 = ThreadCpuSeconds();
    auto t = rdp::topology::Discover(o);
    double t2 = ThreadCpuSeconds();
    if (!t.ok()) state.SkipWithError("discovery failed");
    benchmark::DoNotOptimize(t);
    floor += t1 - t0;
    ours += t2 - t1;
    state.SetIterationTime(t2 - t1);
  }
  state.counters["hwloc_floor_us"] = floor / static_cast<double>(state.iterations()) * 1e6;
  state.counters["ratio_to_hwloc"] = floor > 0 ? ours / floor : 0;
}

void BM_HwlocLoad(benchmark::State& state) {
  const std::string xml = Data(kFixtures[state.range(0)]);
  for (auto _ : state) HwlocLoad(xml);
  state.SetLabel(kFixtures[state.range(0)]);
}

void BM_Discover(benchmark::State& state) {
  const std::string xml = Data(kFixtures[state.range(0)]);
  rdp::topology::DiscoveryOptions o;
  o.topology_xml = xml;
  RunInterleaved(state, xml, o);
  state.SetLabel(kFixtures[state.range(0)]);
}

// sysfs + XML: the fake node laid out from the same XML, as a real node would have it.
void BM_DiscoverSysfsAndXml(benchmark::State& state) {
  const std::string xml = Data("dgx-h100-like.xml");
  char templ[] = "/tmp/rdp-bench-XXXXXX";
  const std::string root = mkdtemp(templ);
  rdp::topology::DiscoveryOptions o;
  o.topology_xml = xml;
  {
    auto t = rdp::topology::Discover(o);
    rdp::sim::SysfsFixture node(root);
    if (!t.ok() || !node.AddTopology(**t).ok()) state.SkipWithError("fixture failed");
  }
  o.sysfs_root = root;
  o.dev_root = root;
  RunInterleaved(state, xml, o);
  state.SetLabel("dgx-h100-like.xml + sysfs");
  std::system(("rm -rf '" + root + "'").c_str());
}

}  // namespace

BENCHMARK(BM_HwlocLoad)->DenseRange(0, 4);
BENCHMARK(BM_Discover)->DenseRange(0, 4)->UseManualTime();
BENCHMARK(BM_DiscoverSysfsAndXml)->UseManualTime();

int main(int argc, char** argv) {
  rdp::SetLogLevel("off");
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
