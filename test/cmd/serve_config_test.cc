// `serve --config FILE` in the built binary: several resources from one process on the node with
// roles (sim/fixture_node.h, dgx-roles: compute InfiniBand NICs, Ethernet storage NICs, two VFs),
// each registered on its own socket listing exactly its NICs; the Mellanox shared plugin's
// config served as it is; a bad file and an HCA two exclusive resources select, each exit 2
// naming what is wrong.

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/fixture_node.h"
#include "sim/kubelet_sim.h"
#include "test/support/child.h"
#include "test/support/temp_dir.h"

namespace rdp::cmd {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using sim::KubeletSim;

constexpr absl::Duration kTimeout = absl::Seconds(20);

// The PCI addresses of dgx-roles' NICs by role.
const std::vector<std::string> kCompute = {"0000:15:00.0", "0000:25:00.0", "0000:45:00.0",
                                           "0000:55:00.0"};
const std::vector<std::string> kStorage = {"0000:31:00.0", "0000:31:00.1", "0000:61:00.0",
                                           "0000:61:00.1"};
const std::vector<std::string> kVfs = {"0000:15:00.1", "0000:15:00.2"};

class ServeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<sim::FixtureNode> node = sim::LayOutNamedNode(dir_.path(), "dgx-roles");
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *node;
    ASSERT_TRUE(kubelet_.Start().ok());
  }
  // `serve` on the node in `mode` with the resources file holding `text`.
  std::vector<std::string> Args(const std::string& mode, const std::string& file,
                                const std::string& text) {
    const std::string path = dir_.Sub(file);
    std::ofstream(path) << text;
    return {"serve",         "--mode",         mode,           "--config",
            path,            "--sysfs-root",   node_.root,     "--dev-root",
            node_.root,      "--topology-xml", node_.xml,      "--kubelet-dir",
            kubelet_dir_,    "--pod-resources-socket=",         "--log-level",
            "info"};
  }
  // The IDs of the latest list of `resource` once it has `n` devices, all Healthy.
  std::vector<std::string> Listed(const std::string& resource, std::size_t n) {
    auto devices = kubelet_.WaitForDevicesOf(
        resource,
        [n](const KubeletSim::Devices& d) {
          return d.size() == n && std::all_of(d.begin(), d.end(), [](const auto& x) {
                   return x.health() == "Healthy";
                 });
        },
        kTimeout);
    if (!devices) return {"<no list of " + std::to_string(n) + " healthy devices>"};
    std::vector<std::string> ids;
    for (const auto& d : *devices) ids.push_back(d.id());
    return ids;
  }
  // Allocate of `ids` on `resource`'s plugin: the status, and the uverbs host paths mounted.
  grpc::Status Allocate(const std::string& resource, const std::vector<std::string>& ids,
                        std::set<std::string>* uverbs) {
    auto stub = kubelet_.PluginStubOf(resource);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
    v1beta1::AllocateRequest request;
    auto* c = request.add_container_requests();
    for (const std::string& id : ids) c->add_devices_ids(id);
    v1beta1::AllocateResponse response;
    grpc::Status status = stub->Allocate(&context, request, &response);
    if (status.ok() && uverbs != nullptr) {
      for (const auto& d : response.container_responses(0).devices()) {
        if (absl::StrContains(d.host_path(), "uverbs")) uverbs->insert(d.host_path());
      }
    }
    return status;
  }

  rdp::testing::TempDir dir_;
  sim::FixtureNode node_;
  const std::string kubelet_dir_ = dir_.Sub("dp");
  KubeletSim kubelet_{kubelet_dir_};
};

// The compute rails and the storage NICs, each a resource of its own: both register on their own
// sockets, each lists exactly its NICs (the VFs in neither: physical NICs unless asked), Allocate
// hands out its own and refuses the other's.
TEST_F(ServeConfigTest, TwoResourcesEachListExactlyTheirNics) {
  rdp::testing::Child plugin(testing::PluginBinary(), Args("exclusive", "resources.yaml", R"(
resources:
  - name: rdma/hca
    selector:
      linkLayers: [InfiniBand]
  - name: rdma/storage
    selector:
      linkLayers: [Ethernet]
)"));
  EXPECT_THAT(Listed("rdma/hca", 4), UnorderedElementsAre(kCompute[0], kCompute[1], kCompute[2],
                                                          kCompute[3]))
      << plugin.output();
  EXPECT_THAT(Listed("rdma/storage", 4), UnorderedElementsAre(kStorage[0], kStorage[1],
                                                              kStorage[2], kStorage[3]))
      << plugin.output();
  struct stat st;
  EXPECT_EQ(::stat((kubelet_dir_ + "/rdma-hca.sock").c_str(), &st), 0);
  EXPECT_EQ(::stat((kubelet_dir_ + "/rdma-storage.sock").c_str(), &st), 0);

  std::set<std::string> uverbs;
  ASSERT_TRUE(Allocate("rdma/storage", {kStorage[2]}, &uverbs).ok());
  EXPECT_THAT(uverbs, UnorderedElementsAre("/dev/infiniband/uverbs6"));  // mlx5_6
  const grpc::Status other = Allocate("rdma/hca", {kStorage[0]}, nullptr);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(other.error_message(), HasSubstr(kStorage[0]));
  EXPECT_THAT(other.error_message(), HasSubstr("rdma/hca"));

  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(kTimeout), 0) << plugin.output();
}

// A VF-only resource lists exactly the VFs; the default one beside it the physical NICs.
TEST_F(ServeConfigTest, AVfOnlyResourceListsExactlyTheVfs) {
  rdp::testing::Child plugin(testing::PluginBinary(), Args("exclusive", "resources.json", R"({
  "resources": [
    {"name": "rdma/hca", "selector": {"linkLayers": ["InfiniBand"]}},
    {"name": "rdma/vf", "selector": {"virtualFunctions": "only"}}
  ]})"));
  EXPECT_THAT(Listed("rdma/vf", 2), UnorderedElementsAre(kVfs[0], kVfs[1])) << plugin.output();
  EXPECT_THAT(Listed("rdma/hca", 4), UnorderedElementsAre(kCompute[0], kCompute[1], kCompute[2],
                                                          kCompute[3]));
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(kTimeout), 0) << plugin.output();
}

// network-operator's ConfigMap as it is: its resource name under its prefix, rdmaHcaMax units
// even on an exclusive node, and each unit mounts exactly the selected HCAs.
TEST_F(ServeConfigTest, TheMellanoxConfigServesItsNameWithThatManyUnits) {
  rdp::testing::Child plugin(testing::PluginBinary(), Args("exclusive", "config.json", R"({
  "periodicUpdateInterval": 300,
  "configList": [{
    "resourceName": "storage_rail",
    "rdmaHcaMax": 5,
    "selectors": {"vendors": ["15b3"], "deviceIDs": ["1021"], "linkTypes": ["ether"]}
  }]})"));
  const std::vector<std::string> units = Listed("rdma/storage_rail", 5);
  ASSERT_EQ(units.size(), 5u) << plugin.output();
  std::set<std::string> uverbs;
  ASSERT_TRUE(Allocate("rdma/storage_rail", {units[0]}, &uverbs).ok()) << plugin.output();
  EXPECT_THAT(uverbs, UnorderedElementsAre("/dev/infiniband/uverbs2", "/dev/infiniband/uverbs3",
                                           "/dev/infiniband/uverbs6", "/dev/infiniband/uverbs7"));
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(kTimeout), 0) << plugin.output();
}

// With --socket-name (the chart's per-mode name), each resource's socket is prefixed by it, so
// that the pods of two modes never share one through a mode swap.
TEST_F(ServeConfigTest, ANamedSocketPrefixesEachResourcesSocket) {
  std::vector<std::string> args = Args("shared", "resources.yaml", R"(
resources:
  - name: rdma/hca
    selector: {linkLayers: [InfiniBand]}
    sharedDevices: 8
)");
  args.push_back("--socket-name=rdp-shared.sock");
  rdp::testing::Child plugin(testing::PluginBinary(), args);
  EXPECT_EQ(Listed("rdma/hca", 8).size(), 8u) << plugin.output();
  struct stat st;
  EXPECT_EQ(::stat((kubelet_dir_ + "/rdp-shared-rdma-hca.sock").c_str(), &st), 0)
      << plugin.output();
  // `probe` with the same file and socket name finds it: the chart's exec probe.
  EXPECT_EQ(rdp::testing::RunToEnd(testing::PluginBinary(),
                                   {"probe", "--kubelet-dir", kubelet_dir_, "--config",
                                    dir_.Sub("resources.yaml"), "--socket-name=rdp-shared.sock"},
                                   kTimeout),
            0);
  EXPECT_EQ(rdp::testing::RunToEnd(testing::PluginBinary(),
                                   {"probe", "--kubelet-dir", kubelet_dir_,
                                    "--socket-name=rdp-shared.sock", "--timeout", "200ms"},
                                   kTimeout),
            1)
      << "no socket of that name without the file's resources";
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(kTimeout), 0) << plugin.output();
}

// Exclusive mode sells each HCA once: an HCA that two resources select ends serve with exit 2
// before anything registers, naming the HCA and both resources.
TEST_F(ServeConfigTest, AnHcaTwoExclusiveResourcesSelectExitsTwoNamingBoth) {
  rdp::testing::Child plugin(testing::PluginBinary(), Args("exclusive", "resources.yaml", R"(
resources:
  - name: rdma/compute
    selector: {linkLayers: [InfiniBand]}
  - name: rdma/numa0
    selector: {numaNodes: [0]}
)"));
  EXPECT_EQ(plugin.Wait(kTimeout), 2) << plugin.output();
  EXPECT_THAT(plugin.output(), HasSubstr("rdma/compute"));
  EXPECT_THAT(plugin.output(), HasSubstr("rdma/numa0"));
  EXPECT_THAT(plugin.output(), HasSubstr("0000:15:00.0"));
  EXPECT_EQ(kubelet_.registrations(), 0);
}

// The same two resources in shared mode may both hold it, as the Mellanox plugin allows.
TEST_F(ServeConfigTest, SharedModeLetsTwoResourcesHoldOneHca) {
  rdp::testing::Child plugin(testing::PluginBinary(), Args("shared", "resources.yaml", R"(
resources:
  - name: rdma/compute
    selector: {linkLayers: [InfiniBand]}
    sharedDevices: 3
  - name: rdma/numa0
    selector: {numaNodes: [0]}
    sharedDevices: 2
)"));
  EXPECT_EQ(Listed("rdma/compute", 3).size(), 3u) << plugin.output();
  EXPECT_EQ(Listed("rdma/numa0", 2).size(), 2u) << plugin.output();
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(kTimeout), 0) << plugin.output();
}

// A wrong file: exit 2 naming the file, the key and the line, nothing registered.
TEST_F(ServeConfigTest, ABadFileExitsTwoNamingTheFileTheKeyAndTheLine) {
  rdp::testing::Child plugin(testing::PluginBinary(), Args("exclusive", "bad.yaml", R"(
resources:
  - name: rdma/hca
    selector:
      linkLayer: [InfiniBand]
)"));
  EXPECT_EQ(plugin.Wait(kTimeout), 2) << plugin.output();
  EXPECT_THAT(plugin.output(), HasSubstr(dir_.Sub("bad.yaml")));
  EXPECT_THAT(plugin.output(), HasSubstr("linkLayer"));
  EXPECT_THAT(plugin.output(), HasSubstr("line 5"));
  EXPECT_EQ(kubelet_.registrations(), 0);
  EXPECT_EQ(rdp::testing::RunToEnd(testing::PluginBinary(),
                                   {"serve", "--config", dir_.Sub("absent.yaml"), "--sysfs-root",
                                    node_.root, "--dev-root", node_.root, "--kubelet-dir",
                                    kubelet_dir_},
                                   kTimeout),
            2);
}

}  // namespace
}  // namespace rdp::cmd
