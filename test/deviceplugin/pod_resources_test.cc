#include "deviceplugin/gpu_context.h"
#include "deviceplugin/nvidia_gpus.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/withholding.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "sim/fake_pod_resources.h"
#include "test/deviceplugin/test_node.h"

namespace rdp::deviceplugin {
namespace {

topology::Topology Node() {
  std::vector<topology::Hca> hcas(2);
  hcas[0].name = "mlx5_0";
  hcas[0].place.pci = "0000:1a:00.0";
  hcas[1].name = "mlx5_1";
  hcas[1].place.pci = "0000:9a:00.0";
  std::vector<topology::Gpu> gpus(3);
  gpus[0].place.pci = "0000:1b:00.0";
  gpus[1].place.pci = "0000:1c:00.0";
  gpus[2].place.pci = "0000:9b:00.0";
  return topology::Topology({0, 1}, hcas, gpus);
}

// Regression: destroying the gRPC client right after a List failed (no kubelet) aborted the
// process about one time in twenty: gRPC 1.51's callback completion queue lost a reference
// (grpc_cq_internal_unref: "prior > 0") when the channel went while its "nexting" thread still
// held the call's event. The race is timing-dependent: on the old code this test (a hundred
// clients, two failed Lists each) aborted in 1 of 6 runs, NodeMetricsTest
// .PodResourcesErrorsAreCounted in about 1 of 20 (never in 300 runs since): channels now live for the
// process.
TEST(GrpcPodResourcesTest, DestroyedRightAfterAFailedListDoesNotAbort) {
  testing::TestNode node;
  for (int i = 0; i < 100; ++i) {
    auto client = NewGrpcPodResources(node.dir().Sub("absent.sock"));
    for (int call = 0; call < 2; ++call) {
      absl::Notification done;
      absl::Status status;
      client->List(absl::Milliseconds(5), [&](absl::StatusOr<PodList> pods) {
        status = pods.status();
        done.Notify();
      });
      ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
      EXPECT_FALSE(status.ok());
    }
  }
}

// A List answer larger than gRPC's default 4 MiB (a node with many pods and long names) is
// read: the client accepts 16 MiB, as the kubelet's own clients do (the List used to fail with
// RESOURCE_EXHAUSTED, and on such a node the pod list was never known).
TEST(GrpcPodResourcesTest, AnswersLargerThanFourMebibytesAreRead) {
  testing::TestNode node;
  const std::string socket = node.dir().Sub("pr.sock");
  sim::FakePodResources server(socket);
  PodList pods;
  for (int i = 0; i < 2500; ++i) {
    pods.push_back({absl::StrCat("namespace-", i, "/", std::string(2000, 'p'), i, "/main"),
                    {{"rdma/hca", {"shared-1"}}}});
  }
  server.Set(pods);
  ASSERT_TRUE(server.Start().ok());
  auto client = NewGrpcPodResources(socket);
  absl::Notification done;
  absl::StatusOr<PodList> got;
  client->List(absl::Seconds(30), [&](absl::StatusOr<PodList> answer) {
    got = std::move(answer);
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), pods.size());
}

// Cancel (shutdown) ends a List in flight at once and refuses later ones: a List waiting on a
// slow kubelet must not hold the plugin's stop for its whole deadline.
TEST(GrpcPodResourcesTest, CancelEndsTheListInFlight) {
  testing::TestNode node;
  const std::string socket = node.dir().Sub("pr.sock");
  sim::FakePodResources server(socket);
  server.SetDelay(absl::Hours(1));
  ASSERT_TRUE(server.Start().ok());
  auto client = NewGrpcPodResources(socket);
  absl::Notification done;
  absl::Status status;
  client->List(absl::Hours(1), [&](absl::StatusOr<PodList> answer) {
    status = answer.status();
    done.Notify();
  });
  while (server.list_calls() == 0 && !done.HasBeenNotified()) {
    done.WaitForNotificationWithTimeout(absl::Milliseconds(10));
  }
  client->Cancel();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(status.ok());
  absl::Notification later;
  client->List(absl::Hours(1), [&](absl::StatusOr<PodList> answer) {
    status = answer.status();
    later.Notify();
  });
  ASSERT_TRUE(later.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
}

TEST(WithheldTest, ExclusiveWithholdsEverythingFromSharedHolders) {
  PodList pods = {{"ns/a/c", {{"rdma/hca", {"shared-3"}}}},
                  {"ns/b/c", {{"rdma/hca", {"0000:1a:00.0"}}}}};
  Withholding w = ComputeWithheld(pods, "rdma/hca", hca::Mode::kExclusive, Node());
  EXPECT_EQ(w.pcis, (std::set<std::string>{"0000:1a:00.0", "0000:9a:00.0"}));
  ASSERT_EQ(w.reasons.size(), 1u);
  EXPECT_NE(w.reasons[0].find("ns/a/c"), std::string::npos);
}

TEST(WithheldTest, SharedWithholdsExclusivelyHeldHcas) {
  PodList pods = {{"ns/a/c", {{"rdma/hca", {"shared-3"}}}},
                  {"ns/b/c", {{"rdma/hca", {"0000:9A:00.0"}}, {"nvidia.com/gpu", {"x"}}}},
                  {"ns/c/c", {{"other/res", {"0000:1a:00.0"}}}}};
  Withholding w = ComputeWithheld(pods, "rdma/hca", hca::Mode::kShared, Node());
  EXPECT_EQ(w.pcis, (std::set<std::string>{"0000:9a:00.0"}));
}

TEST(WithheldTest, NothingWithheldInTheSameMode) {
  PodList pods = {{"ns/b/c", {{"rdma/hca", {"0000:1a:00.0"}}}}};
  EXPECT_TRUE(ComputeWithheld(pods, "rdma/hca", hca::Mode::kExclusive, Node()).pcis.empty());
}

TEST(GpuIdsTest, ReadsNvidiaInformation) {
  testing::TempDir dir;
  const auto gpu_dir = std::filesystem::path(dir.path()) / "proc/driver/nvidia/gpus/0000:1b:00.0";
  std::filesystem::create_directories(gpu_dir);
  std::ofstream(gpu_dir / "information") << "Model: \t\t NVIDIA H100\nIRQ: 12\n"
                                         << "GPU UUID: \t GPU-aaaa-bbbb\nBus Location: 0000:1b:00.0\n";
  auto ids = ReadNvidiaGpuIds(dir.path());
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids["GPU-aaaa-bbbb"], "0000:1b:00.0");
  EXPECT_EQ(ids["0"], "0000:1b:00.0");  // its index
  EXPECT_TRUE(ReadNvidiaGpuIds(dir.Sub("missing")).empty());
}

// The NVIDIA driver's view of three GPUs, listed out of address order: 0000:9b:00.0 (GPU-bbbb),
// 0000:1b:00.0 (GPU-aaaa), 0000:1c:00.0 (GPU-cccc).
void WriteNvidiaProc(const testing::TempDir& dir) {
  const std::vector<std::pair<std::string, std::string>> gpus = {
      {"0000:9b:00.0", "GPU-bbbb"}, {"0000:1b:00.0", "GPU-aaaa"}, {"0000:1c:00.0", "GPU-cccc"}};
  for (const auto& [pci, uuid] : gpus) {
    const auto gpu_dir = std::filesystem::path(dir.path()) / "proc/driver/nvidia/gpus" / pci;
    std::filesystem::create_directories(gpu_dir);
    std::ofstream(gpu_dir / "information") << "Model: \t\t NVIDIA H100\nGPU UUID: \t " << uuid
                                           << "\nBus Location: " << pci << "\n";
  }
}

// NVIDIA's device plugin names a GPU in more forms than its UUID: a replica of a time-sliced (or
// MPS-shared) GPU "GPU-<uuid>::<n>", an index (--device-id-strategy=index: NVML's order, the PCI
// address order), a MIG device of an older driver "MIG-GPU-<uuid>/<gi>/<ci>" and of the index
// strategy "<gpu>:<mig>". Each names its GPU. Before, only a bare UUID or a PCI address did: the
// GPU context was empty, silently, and the HCAs were placed as if the pod had no GPU.
TEST(GpuContextTest, EveryNvidiaIdFormNamesItsGpu) {
  testing::TempDir dir;
  WriteNvidiaProc(dir);
  const std::map<std::string, std::string> ids = ReadNvidiaGpuIds(dir.path());
  Config config;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"GPU-bbbb::3", "0000:9b:00.0"},      {"GPU-aaaa", "0000:1b:00.0"},
      {"0", "0000:1b:00.0"},                {"2", "0000:9b:00.0"},
      {"1::0", "0000:1c:00.0"},             {"MIG-GPU-cccc/1/0", "0000:1c:00.0"},
      {"MIG-GPU-aaaa/2/0::4", "0000:1b:00.0"}, {"2:1", "0000:9b:00.0"},
  };
  for (const auto& [id, pci] : cases) {
    SCOPED_TRACE(id);
    PodList pods = {{"ns/a/c", {{"nvidia.com/gpu", {id}}}}};
    std::map<std::string, absl::Time> seen;
    UpdateFirstSeen(pods, config.gpu_resources, t0, &seen);
    GpuSelection s = GpuContextFor(pods, seen, t0, config, config.resource_name, ids, Node());
    EXPECT_EQ(s.context.container_gpus, (std::vector<std::string>{pci}));
    EXPECT_EQ(std::count(s.context.free_gpus.begin(), s.context.free_gpus.end(), pci), 0);
  }
}

TEST(GpuIdsTest, CanonicalIds) {
  EXPECT_EQ(CanonicalGpuId("GPU-a::12"), "GPU-a");
  EXPECT_EQ(CanonicalGpuId("MIG-GPU-a/1/0"), "GPU-a");
  EXPECT_EQ(CanonicalGpuId("MIG-GPU-a/1/0::2"), "GPU-a");
  EXPECT_EQ(CanonicalGpuId("3:1"), "3");
  EXPECT_EQ(CanonicalGpuId("3"), "3");
  EXPECT_EQ(CanonicalGpuId("MIG-0f1e"), "MIG-0f1e");
  // PCI addresses, with and without the domain, and odd forms are left as they are.
  EXPECT_EQ(CanonicalGpuId("0000:1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(CanonicalGpuId("1b:00.0"), "1b:00.0");
  EXPECT_EQ(CanonicalGpuId("GPU-a::x"), "GPU-a::x");
  EXPECT_EQ(CanonicalGpuId(":1"), ":1");
}

// A MIG device's own UUID (drivers from R470) is in no /proc file: `nvidia-smi -L`'s output,
// given as a file, maps it to its GPU, and its indexes replace the PCI order (which they equal
// unless the GPUs were renumbered). A GPU it names that the driver does not show is skipped; a
// missing file leaves the PCI order.
TEST(GpuIdsTest, AnNvidiaSmiListGivesIndexesAndMigDevices) {
  testing::TempDir dir;
  WriteNvidiaProc(dir);
  const std::string list = dir.Sub("nvidia-smi-L.txt");
  std::ofstream(list) << "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-cccc)\n"
                      << "  MIG 3g.40gb     Device  0: (UUID: MIG-1111)\n"
                      << "  MIG 3g.40gb     Device  1: (UUID: MIG-2222)\n"
                      << "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)\n"
                      << "GPU 2: NVIDIA A100-SXM4-80GB (UUID: GPU-gone)\n"
                      << "  MIG 1g.10gb     Device  0: (UUID: MIG-3333)\n";
  auto ids = ReadNvidiaGpuIds(dir.path(), list);
  EXPECT_EQ(ids["0"], "0000:1c:00.0");
  EXPECT_EQ(ids["1"], "0000:1b:00.0");
  EXPECT_EQ(ids["MIG-1111"], "0000:1c:00.0");
  EXPECT_EQ(ids["MIG-2222"], "0000:1c:00.0");
  EXPECT_EQ(ids.count("2"), 0u);
  EXPECT_EQ(ids.count("MIG-3333"), 0u);
  EXPECT_EQ(ids["GPU-bbbb"], "0000:9b:00.0");

  auto fallback = ReadNvidiaGpuIds(dir.path(), dir.Sub("absent.txt"));
  EXPECT_EQ(fallback["0"], "0000:1b:00.0");
  EXPECT_EQ(fallback["1"], "0000:1c:00.0");
  EXPECT_EQ(fallback["2"], "0000:9b:00.0");
  EXPECT_EQ(fallback.count("MIG-1111"), 0u);
}

TEST(GpuContextTest, TheOneRecentGpuHolderWithoutHcasIsTheContext) {
  Config config;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  PodList pods = {
      {"ns/old/c", {{"nvidia.com/gpu", {"0000:9b:00.0"}}}},                           // too old
      {"ns/done/c", {{"nvidia.com/gpu", {"GPU-x"}}, {"rdma/hca", {"0000:9a:00.0"}}}},  // has HCAs
      {"ns/new/c", {{"nvidia.com/gpu", {"GPU-b", "GPU-unknown"}}}},
  };
  std::map<std::string, absl::Time> seen;
  UpdateFirstSeen({pods[0]}, config.gpu_resources, t0, &seen);
  UpdateFirstSeen(pods, config.gpu_resources, t0 + absl::Seconds(30), &seen);
  EXPECT_EQ(seen["ns/old/c"], t0);
  const std::map<std::string, std::string> ids = {{"GPU-x", "0000:1b:00.0"},
                                                  {"GPU-b", "0000:1c:00.0"}};
  GpuSelection s = GpuContextFor(pods, seen, t0 + absl::Seconds(31), config, config.resource_name, ids, Node());
  EXPECT_EQ(s.candidates, 1);
  EXPECT_EQ(s.container, "ns/new/c");
  EXPECT_EQ(s.context.container_gpus, (std::vector<std::string>{"0000:1c:00.0"}));
  EXPECT_TRUE(s.context.free_gpus_known);
  EXPECT_TRUE(s.context.free_gpus.empty());  // all three GPUs are held
}

TEST(GpuContextTest, TwoCandidatesMeanNoContext) {
  Config config;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  PodList pods = {{"ns/a/c", {{"nvidia.com/gpu", {"0000:1b:00.0"}}}},
                  {"ns/b/c", {{"amd.com/gpu", {"0000:1c:00.0"}}}}};
  std::map<std::string, absl::Time> seen;
  UpdateFirstSeen(pods, config.gpu_resources, t0, &seen);
  GpuSelection s = GpuContextFor(pods, seen, t0, config, config.resource_name, {}, Node());
  EXPECT_EQ(s.candidates, 2);
  EXPECT_TRUE(s.context.container_gpus.empty());
  EXPECT_EQ(s.context.free_gpus, (std::vector<std::string>{"0000:9b:00.0"}));
}

// A GPU plugin that names GPUs by PCI address without the domain: on a node with one PCI domain
// per root complex (GB200: a GPU at 01:00.0 of domains 0008 and 0018), "01:00.0" is either GPU,
// so it is none of them; it was taken for 0000:01:00.0 (another domain's function), and a GPU
// of domain 0000 would have been given the context of a container that holds another.
TEST(GpuContextTest, AnAddressWithoutItsDomainNamesOnlyAUniqueGpu) {
  std::vector<topology::Gpu> gpus(3);
  gpus[0].place.pci = "0000:01:00.0";
  gpus[1].place.pci = "0008:01:00.0";
  gpus[2].place.pci = "0018:02:00.0";
  const topology::Topology node({0, 1}, {}, gpus);
  Config config;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  PodList pods = {{"ns/a/c", {{"nvidia.com/gpu", {"01:00.0", "02:00.0"}}}}};
  std::map<std::string, absl::Time> seen;
  UpdateFirstSeen(pods, config.gpu_resources, t0, &seen);
  GpuSelection s = GpuContextFor(pods, seen, t0, config, config.resource_name, {}, node);
  EXPECT_EQ(s.context.container_gpus, (std::vector<std::string>{"0018:02:00.0"}));
  EXPECT_EQ(s.context.free_gpus, (std::vector<std::string>{"0000:01:00.0", "0008:01:00.0"}));
}

}  // namespace
}  // namespace rdp::deviceplugin
