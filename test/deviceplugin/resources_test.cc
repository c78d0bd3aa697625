// Several resources from one process, over one node: each its own device plugin (socket,
// registration, ListAndWatch, Allocate, GetPreferredAllocation), on a node with roles: compute
// InfiniBand PFs beside GPUs, dual-port Ethernet storage PFs and two VFs of one compute NIC.
// The node is built by hand (test/support/node_builder.h) and laid out as sysfs; the test's
// discovery places each HCA and sets its identity (physfn, vendor, device, driver) as the
// hand-built snapshot says, so the tests do not depend on how sysfs spells a VF.

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "deviceplugin/node_state.h"
#include "deviceplugin/plugin_server.h"
#include "deviceplugin/service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/metrics.h"
#include "resources/resources.h"
#include "serving/atomic_file.h"
#include "sim/fake_pod_resources.h"
#include "sim/kubelet_sim.h"
#include "test/deviceplugin/test_node.h"
#include "test/support/log_lines.h"
#include "test/support/node_builder.h"
#include "topology/discovery.h"

namespace rdp::deviceplugin {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;
using Devices = KubeletSim::Devices;

constexpr absl::Duration kWait = absl::Seconds(10);

// The node: two roots with a switch of 2 GPUs + 2 compute IB NICs each (NUMA 0 and 1), a
// dual-port Ethernet storage NIC on a root of each NUMA node, and two VFs of compute NIC c2.
struct RoleNode {
  std::string c0, c1, c2, c3;  // compute PFs (c0, c1 beside g0, g1; c2, c3 beside g2, g3)
  std::string s0, s1;          // storage PFs
  std::string v0, v1;          // VFs of c2
  std::string g0, g1, g2, g3;
  topology::TopologyPtr topology;

  std::vector<std::string> Compute() const { return {c0, c1, c2, c3}; }
  std::vector<std::string> Storage() const { return {s0, s1}; }
  std::vector<std::string> Pfs() const { return {c0, c1, c2, c3, s0, s1}; }
};

RoleNode BuildRoleNode() {
  RoleNode n;
  rdp::testing::NodeBuilder b;
  // A root on `numa` with a switch of two GPUs and two compute NICs.
  auto rail = [&b](int numa, std::string* g0, std::string* g1, std::string* c0,
                   std::string* c1) {
    const int root = b.Root(numa);
    const int sw = b.Switch(root);
    *g0 = b.Gpu(root, sw);
    *g1 = b.Gpu(root, sw);
    *c0 = b.Hca(root, sw);
    *c1 = b.Hca(root, sw);
  };
  rail(0, &n.g0, &n.g1, &n.c0, &n.c1);
  rail(1, &n.g2, &n.g3, &n.c2, &n.c3);
  n.s0 = b.Hca(b.Root(0), -1, "200 Gb/sec (4X HDR)", 2, 2);
  n.s1 = b.Hca(b.Root(1), -1, "200 Gb/sec (4X HDR)", 2, 2);
  const topology::TopologyPtr built = b.Build();
  std::vector<topology::Hca> hcas = built->hcas();
  std::map<std::string, std::string> names = {{n.c0, "mlx5_0"}, {n.c1, "mlx5_1"},
                                              {n.c2, "mlx5_2"}, {n.c3, "mlx5_3"},
                                              {n.s0, "mlx5_4"}, {n.s1, "mlx5_5"}};
  for (topology::Hca& h : hcas) {
    h.name = names[h.place.pci];
    h.vendor = "15b3";
    h.device = "1021";
    h.driver = "mlx5_core";
    if (h.place.pci == n.s0 || h.place.pci == n.s1) {
      const std::string base = h.name == "mlx5_4" ? "ens1f" : "ens2f";
      h.netdevs = {base + "0np0", base + "1np1"};
      for (topology::Port& p : h.ports) p.link_layer = "Ethernet";
    }
  }
  // Two VFs of c2: functions 2 and 3 of its device, placed where it is.
  topology::Hca pf;
  for (const topology::Hca& h : hcas) {
    if (h.place.pci == n.c2) pf = h;
  }
  for (int f : {2, 3}) {
    topology::Hca vf = pf;
    vf.place.pci = pf.place.pci.substr(0, pf.place.pci.size() - 1) + std::to_string(f);
    vf.name = "mlx5_" + std::to_string(4 + f);
    vf.device = "101e";
    vf.physfn = pf.place.pci;
    (f == 2 ? n.v0 : n.v1) = vf.place.pci;
    hcas.push_back(vf);
  }
  n.topology = std::make_shared<const topology::Topology>(
      topology::Topology::WithNumaNodes(built->all_numa_nodes(), hcas, built->gpus()));
  return n;
}

std::vector<std::string> Ids(const Devices& devices) {
  std::vector<std::string> out;
  for (const auto& d : devices) out.push_back(d.id());
  return out;
}

std::vector<std::string> Ids(const ResourceState::DeviceList& list) {
  std::vector<std::string> out;
  for (const DeviceState& d : list.devices) out.push_back(d.id);
  return out;
}

resources::Resource Named(const std::string& name, resources::Selector selector = {}) {
  resources::Resource r;
  r.name = name;
  r.selector = std::move(selector);
  return r;
}

resources::Resource ComputeResource() {
  resources::Selector s;
  s.link_layers = {"InfiniBand"};
  return Named("rdma/hca", s);
}

resources::Resource StorageResource() {
  resources::Selector s;
  s.link_layers = {"Ethernet"};
  return Named("rdma/storage", s);
}

// The role node laid out under a TestNode; its discovery reads sysfs and places each HCA as the
// hand-built snapshot does, with the snapshot's identity fields.
class ResourcesTest : public ::testing::Test {
 protected:
  ResourcesTest() : node_(std::vector<sim::FixtureHca>{}), roles_(BuildRoleNode()) {
    EXPECT_TRUE(node_.fixture().AddTopology(*roles_.topology).ok());
  }

  NodeSources Sources(std::unique_ptr<PodResourcesSource> pods = nullptr) {
    NodeSources sources = node_.Sources(std::move(pods));
    std::shared_ptr<Env> env = node_.NodeEnv();
    topology::TopologyPtr built = roles_.topology;
    sources.discover = [env, built]() -> absl::StatusOr<topology::TopologyPtr> {
      absl::StatusOr<std::vector<topology::Hca>> scanned = topology::ReadSysfsHcas(*env);
      if (!scanned.ok()) return scanned.status();
      for (topology::Hca& h : *scanned) {
        if (const int i = built->HcaIndex(h.place.pci); i >= 0) {
          const topology::Hca& b = built->hcas()[i];
          h.physfn = b.physfn;
          h.vendor = b.vendor;
          h.device = b.device;
          h.driver = b.driver;
        }
      }
      return topology::WithScannedHcas(*built, *std::move(scanned));
    };
    return sources;
  }

  Config MakeConfig(hca::Mode mode) const { return node_.MakeConfig(mode); }

  testing::TestNode node_;
  RoleNode roles_;
};

// No resources given: the one resource of the flags, rdma/hca on rdma-hca.sock, whose empty
// selector takes the physical functions only: the VFs bound on the host are not in it.
TEST_F(ResourcesTest, DefaultExclusiveListsExactlyThePhysicalFunctions) {
  const Config config = MakeConfig(hca::Mode::kExclusive);
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  PluginServer plugin(config, Sources());
  ASSERT_TRUE(plugin.Start().ok());
  std::optional<KubeletSim::Registration> reg = kubelet.WaitForRegistration(0, kWait);
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->resource_name, "rdma/hca");
  EXPECT_EQ(reg->endpoint, "rdma-hca.sock");
  std::optional<Devices> list =
      kubelet.WaitForDevices([](const Devices& d) { return !d.empty(); }, kWait);
  ASSERT_TRUE(list.has_value());
  EXPECT_THAT(Ids(*list), UnorderedElementsAreArray(roles_.Pfs()));
  plugin.Stop();
}

// Two resources, IB and Ethernet: both registered, each on its own socket, each listing exactly
// its NICs; an Allocate gives exactly the asked HCA's device nodes, and a resource refuses the
// other's ID with a status naming the ID and itself.
TEST_F(ResourcesTest, TwoResourcesEachServeExactlyTheirNics) {
  const Config config = MakeConfig(hca::Mode::kExclusive);
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  PluginServer plugin(config, Sources(), {ComputeResource(), StorageResource()});
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(kubelet.WaitForRegistration(1, kWait).has_value());
  std::set<std::pair<std::string, std::string>> registered;
  for (const std::string r : {"rdma/hca", "rdma/storage"}) {
    std::optional<Devices> list =
        kubelet.WaitForDevicesOf(r, [](const Devices& d) { return !d.empty(); }, kWait);
    ASSERT_TRUE(list.has_value()) << r;
    EXPECT_THAT(Ids(*list),
                UnorderedElementsAreArray(r == "rdma/hca" ? roles_.Compute() : roles_.Storage()))
        << r;
    for (const auto& d : *list) {
      ASSERT_EQ(d.topology().nodes_size(), 1) << d.id();
    }
  }
  EXPECT_THAT(plugin.SocketPaths(),
              ElementsAre(config.kubelet_dir + "/rdma-hca.sock",
                          config.kubelet_dir + "/rdma-storage.sock"));

  // Exactly the asked HCA's nodes: mlx5_4 is Ethernet (no umad).
  auto storage = kubelet.PluginStubOf("rdma/storage");
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(roles_.s0);
  v1beta1::AllocateResponse response;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    ASSERT_TRUE(storage->Allocate(&context, request, &response).ok());
  }
  std::vector<std::string> paths;
  for (const auto& d : response.container_responses(0).devices()) paths.push_back(d.host_path());
  const topology::TopologyPtr t = plugin.node().topology();
  const std::string s0_uverbs = "/dev/infiniband/" + t->hcas()[t->HcaIndex(roles_.s0)].uverbs;
  EXPECT_THAT(paths, UnorderedElementsAre(s0_uverbs, "/dev/infiniband/rdma_cm"));
  // rdma/storage is not the first resource: its variables are its own, the plain ones rdma/hca's.
  EXPECT_EQ(response.container_responses(0).envs().at("RDMA_HCA_NAMES_RDMA_STORAGE"), "mlx5_4");
  EXPECT_EQ(response.container_responses(0).envs().count("NCCL_IB_HCA"), 0u);

  // The compute resource refuses the storage NIC's ID, naming it and itself.
  auto compute = kubelet.PluginStubOf("rdma/hca");
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1beta1::AllocateResponse refused;
  const grpc::Status s = compute->Allocate(&context, request, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr(roles_.s0));
  EXPECT_THAT(s.error_message(), HasSubstr("rdma/hca"));
  plugin.Stop();
  EXPECT_FALSE(std::filesystem::exists(config.kubelet_dir + "/rdma-storage.sock"));
}

// GetPreferredAllocation of the compute resource picks the NIC beside the container's GPU, and
// never an HCA of another resource: storage NICs offered to it are no candidates.
TEST_F(ResourcesTest, PreferredAllocationPicksTheComputeNicBesideTheGpus) {
  const std::string socket = node_.dir().Sub("pr.sock");
  sim::FakePodResources pods(socket);
  ASSERT_TRUE(pods.Start().ok());
  Config config = MakeConfig(hca::Mode::kExclusive);
  config.pod_resources_socket = socket;
  NodeState state(config, Sources(NewGrpcPodResources(socket)),
                  {ComputeResource(), StorageResource()});
  ASSERT_TRUE(state.Init().ok());
  pods.Set({{"team-a/train-0/main", {{"nvidia.com/gpu", {roles_.g2}}}}});
  ASSERT_TRUE(state.RefreshPodsAndWait());
  const std::vector<std::string_view> available = {roles_.c0, roles_.c1, roles_.c2, roles_.c3};
  absl::StatusOr<std::vector<std::string>> got = state.resource(0).Prefer(available, {}, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre(roles_.c2));
  pods.Set({{"team-a/train-1/main", {{"nvidia.com/gpu", {roles_.g0, roles_.g1}}}}});
  ASSERT_TRUE(state.RefreshPodsAndWait());
  got = state.resource(0).Prefer(
      {roles_.s0, roles_.c0, roles_.c1, roles_.c2, roles_.c3, roles_.s1}, {}, 2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, UnorderedElementsAre(roles_.c0, roles_.c1));
}

// A resource that selects the VFs only lists exactly them, each on its PF's NUMA node.
TEST_F(ResourcesTest, VfOnlyResourceListsExactlyTheVfs) {
  resources::Selector vfs;
  vfs.virtual_functions = resources::VirtualFunctions::kOnly;
  NodeState state(MakeConfig(hca::Mode::kExclusive), Sources(),
                  {ComputeResource(), Named("rdma/vf", vfs)});
  ASSERT_TRUE(state.Init().ok());
  const ResourceState::DeviceList list = state.resource(1).Devices();
  EXPECT_THAT(Ids(list), UnorderedElementsAre(roles_.v0, roles_.v1));
  for (const DeviceState& d : list.devices) {
    EXPECT_TRUE(d.healthy) << d.id;
    EXPECT_EQ(d.numa, 1) << d.id << ": its PF's";
  }
  EXPECT_THAT(Ids(state.resource(0).Devices()), UnorderedElementsAreArray(roles_.Compute()));
}

// A resource whose selector takes nothing on this node registers with no devices, and the log
// names it once.
TEST_F(ResourcesTest, ResourceSelectingNothingRegistersEmptyAndWarnsOnce) {
  rdp::testing::LogLines log("server");
  const Config config = MakeConfig(hca::Mode::kExclusive);
  KubeletSim kubelet(config.kubelet_dir);
  ASSERT_TRUE(kubelet.Start().ok());
  resources::Selector none;
  none.device_ids = {"a2dc"};  // a BlueField-3 this node does not have
  PluginServer plugin(config, Sources(), {ComputeResource(), Named("rdma/dpu", none)});
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(kubelet.WaitForRegistration(1, kWait).has_value());
  std::optional<Devices> empty =
      kubelet.WaitForDevicesOf("rdma/dpu", [](const Devices&) { return true; }, kWait);
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
  ASSERT_TRUE(kubelet.WaitForDevicesOf("rdma/hca", [](const Devices& d) { return d.size() == 4; },
                                       kWait)
                  .has_value());
  plugin.node().Poll();
  plugin.node().Poll();
  plugin.Stop();
  EXPECT_EQ(log.Count("resource rdma/dpu holds no HCA of this node"), 1);
  EXPECT_EQ(log.Count("resource rdma/hca holds no HCA"), 0);
}

// An always-shared resource (the Mellanox shared plugin's) on an exclusive node: its N units,
// each mounting every HCA of the resource and nothing else.
TEST_F(ResourcesTest, AlwaysSharedResourceServesItsUnitsOnAnExclusiveNode) {
  resources::Resource shared = StorageResource();
  shared.always_shared = true;
  shared.shared_devices = 3;
  NodeState state(MakeConfig(hca::Mode::kExclusive), Sources(), {ComputeResource(), shared});
  ASSERT_TRUE(state.Init().ok());
  EXPECT_EQ(state.resource(0).mode(), hca::Mode::kExclusive);
  EXPECT_EQ(state.resource(1).mode(), hca::Mode::kShared);
  EXPECT_THAT(Ids(state.resource(1).Devices()), ElementsAre("shared-0", "shared-1", "shared-2"));
  absl::StatusOr<node::Grant> grant = state.resource(1).Allocate({"shared-2"});
  ASSERT_TRUE(grant.ok()) << grant.status();
  std::set<std::string> uverbs;
  for (const auto& d : grant->allocation.devices) {
    if (absl::StrContains(d.host_path, "uverbs")) uverbs.insert(d.host_path);
  }
  std::set<std::string> want;
  for (const topology::Hca& h : state.topology()->hcas()) {
    if (h.place.pci == roles_.s0 || h.place.pci == roles_.s1) {
      want.insert("/dev/infiniband/" + h.uverbs);
    }
  }
  EXPECT_EQ(uverbs, want);
  EXPECT_FALSE(state.resource(1).Allocate({"shared-3"}).ok()) << "only 3 units";
  EXPECT_FALSE(state.resource(0).Allocate({"shared-0"}).ok()) << "exclusive: PCI IDs";
}

// When HCAs come and go, each resource's list follows its selector: a storage NIC unplugged is
// listed unhealthy by the storage resource alone, and a new Ethernet NIC joins it.
TEST_F(ResourcesTest, ListsFollowHotplugPerSelector) {
  NodeState state(MakeConfig(hca::Mode::kExclusive), Sources(),
                  {ComputeResource(), StorageResource()});
  ASSERT_TRUE(state.Init().ok());
  const std::uint64_t compute_version = state.resource(0).Devices().version;
  ASSERT_TRUE(node_.fixture().RemoveHca("mlx5_5").ok());
  state.Poll();
  std::map<std::string, bool> health;
  for (const DeviceState& d : state.resource(1).Devices().devices) health[d.id] = d.healthy;
  EXPECT_EQ(health, (std::map<std::string, bool>{{roles_.s0, true}, {roles_.s1, false}}));
  EXPECT_EQ(state.resource(0).Devices().version, compute_version) << "not the compute NICs'";

  sim::FixtureHca added;
  added.name = "mlx5_9";
  added.pci = "0000:e1:00.0";
  added.numa = 1;
  added.pcie_root = "pci0000:e0";
  added.netdevs = {"ens9f0np0"};
  added.ports[0].link_layer = "Ethernet";
  added.umad = false;
  ASSERT_TRUE(node_.fixture().AddHca(added).ok());
  state.Poll();
  EXPECT_THAT(Ids(state.resource(1).Devices()),
              UnorderedElementsAre(roles_.s0, roles_.s1, "0000:e1:00.0"));
  EXPECT_THAT(Ids(state.resource(0).Devices()), UnorderedElementsAreArray(roles_.Compute()));
}

// Across a mode swap each resource withholds its own HCAs only: on a node back in shared mode,
// a container still holding a storage NIC under its exclusive ID keeps that NIC from the storage
// resource's shared pods, and the compute resource offers its units as usual.
TEST_F(ResourcesTest, WithholdingAfterAModeSwapIsPerResource) {
  const std::string socket = node_.dir().Sub("pr.sock");
  sim::FakePodResources pods(socket);
  ASSERT_TRUE(pods.Start().ok());
  pods.Set({{"team-s/ingest-0/main", {{"rdma/storage", {roles_.s0}}}}});
  Config config = MakeConfig(hca::Mode::kShared);
  config.pod_resources_socket = socket;
  NodeState state(config, Sources(NewGrpcPodResources(socket)),
                  {ComputeResource(), StorageResource()});
  ASSERT_TRUE(state.Init().ok());
  ASSERT_TRUE(state.RefreshPodsAndWait());
  EXPECT_TRUE(state.resource(0).Withheld().empty());
  EXPECT_EQ(state.resource(1).Withheld(), std::set<std::string>{roles_.s0});
  absl::StatusOr<node::Grant> grant = state.resource(1).Allocate({"shared-0"});
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->allocation.envs.at("RDMA_HCA_NAMES"), "mlx5_5") << "s1 only: s0 is withheld";
  pods.Set({});
  ASSERT_TRUE(state.RefreshPodsAndWait());
  EXPECT_TRUE(state.resource(1).Withheld().empty());
}

// One container's Allocate answers from several resources, merged as the kubelet's device
// manager merges them (devicemanager podDevices.deviceRunContainerOptions): resource by resource
// in `order`, the first value of each variable name, device path and mount path kept.
struct Merged {
  std::map<std::string, std::string> envs;
  std::map<std::string, std::string> devices;  // container path -> host path
  std::map<std::string, std::string> mounts;   // container path -> host path
  // What the kubelet logs as a conflict: a name or path two answers give different values.
  std::vector<std::string> conflicts;
};

Merged MergeAsTheKubelet(const std::vector<const v1beta1::ContainerAllocateResponse*>& order) {
  Merged out;
  auto keep = [&out](std::map<std::string, std::string>& into, const std::string& key,
                     const std::string& value, const char* what) {
    auto [it, fresh] = into.emplace(key, value);
    if (!fresh && it->second != value) {
      out.conflicts.push_back(
          absl::StrCat(what, " ", key, ": '", it->second, "' and '", value, "'"));
    }
  };
  for (const v1beta1::ContainerAllocateResponse* r : order) {
    for (const auto& [key, value] : r->envs()) keep(out.envs, key, value, "env");
    for (const auto& d : r->devices()) {
      keep(out.devices, d.container_path(), d.host_path(), "device");
    }
    for (const auto& m : r->mounts()) keep(out.mounts, m.container_path(), m.host_path(), "mount");
  }
  return out;
}

// Both orders of one container's answers from `a` and `b`, each asked for `ids_a` / `ids_b`.
std::vector<Merged> BothOrders(const ResourceState& a, const std::string& ids_a,
                               const ResourceState& b, const std::string& ids_b) {
  v1beta1::AllocateRequest request_a, request_b;
  request_a.add_container_requests()->add_devices_ids(ids_a);
  request_b.add_container_requests()->add_devices_ids(ids_b);
  v1beta1::AllocateResponse response_a, response_b;
  EXPECT_TRUE(HandleAllocate(a, request_a, &response_a).ok());
  EXPECT_TRUE(HandleAllocate(b, request_b, &response_b).ok());
  if (response_a.container_responses_size() != 1 || response_b.container_responses_size() != 1) {
    ADD_FAILURE() << "no answer";
    return {};
  }
  const auto* ra = &response_a.container_responses(0);
  const auto* rb = &response_b.container_responses(0);
  return {MergeAsTheKubelet({ra, rb}), MergeAsTheKubelet({rb, ra})};
}

// A container asking for a compute NIC and a storage NIC gets an answer from each resource, which
// the kubelet merges in no fixed order: the merge has no conflicting variable, device or mount,
// whichever comes first; the plain variables and /etc/rdma/allocation.json name the compute NIC
// only (the first resource listed), and each resource's own variables and file name its NICs.
TEST_F(ResourcesTest, ContainerHoldingBothResourcesGetsNamesThatDoNotClash) {
  Config config = MakeConfig(hca::Mode::kExclusive);
  config.allocation_dir = node_.dir().Sub("allocations");
  ASSERT_TRUE(std::filesystem::create_directories(config.allocation_dir));
  NodeState state(config, Sources(), {ComputeResource(), StorageResource()});
  ASSERT_TRUE(state.Init().ok());
  for (const Merged& m : BothOrders(state.resource(0), roles_.c0, state.resource(1), roles_.s0)) {
    EXPECT_THAT(m.conflicts, ::testing::IsEmpty());
    EXPECT_EQ(m.envs.at("NCCL_IB_HCA"), "=mlx5_0");
    EXPECT_EQ(m.envs.at("RDMA_HCA_NAMES"), "mlx5_0");
    EXPECT_EQ(m.envs.at("RDMA_HCA_PCI"), roles_.c0);
    EXPECT_EQ(m.envs.at("UCX_NET_DEVICES"), "mlx5_0:1");
    EXPECT_EQ(m.envs.at("RDMA_HCA_NAMES_RDMA_HCA"), "mlx5_0");
    EXPECT_EQ(m.envs.at("NCCL_IB_HCA_RDMA_HCA"), "=mlx5_0");
    EXPECT_EQ(m.envs.at("RDMA_HCA_NAMES_RDMA_STORAGE"), "mlx5_4");
    EXPECT_EQ(m.envs.at("RDMA_HCA_PCI_RDMA_STORAGE"), roles_.s0);
    EXPECT_EQ(m.envs.at("NCCL_IB_HCA_RDMA_STORAGE"), "=mlx5_4");
    EXPECT_EQ(m.envs.at("UCX_NET_DEVICES_RDMA_STORAGE"), "mlx5_4:1,mlx5_4:2");
    EXPECT_EQ(m.devices.at("/dev/infiniband/rdma_cm"), "/dev/infiniband/rdma_cm");
    std::vector<std::string> paths;
    for (const auto& [path, host] : m.mounts) paths.push_back(path);
    EXPECT_THAT(paths,
                ElementsAre("/etc/rdma/allocation.json", "/etc/rdma/rdma_hca/allocation.json",
                            "/etc/rdma/rdma_storage/allocation.json"));
    if (paths.size() != 3) continue;
    auto content = [&m](const std::string& path) {
      absl::StatusOr<std::string> text = serving::ReadWholeFile(m.mounts.at(path));
      return text.ok() ? *text : std::string(text.status().message());
    };
    EXPECT_THAT(content("/etc/rdma/allocation.json"), HasSubstr("\"name\": \"mlx5_0\""));
    EXPECT_THAT(content("/etc/rdma/allocation.json"), Not(HasSubstr("mlx5_4")));
    EXPECT_EQ(m.mounts.at("/etc/rdma/rdma_hca/allocation.json"),
              m.mounts.at("/etc/rdma/allocation.json"));
    EXPECT_THAT(content("/etc/rdma/rdma_storage/allocation.json"),
                HasSubstr("\"name\": \"mlx5_4\""));
    EXPECT_THAT(content("/etc/rdma/rdma_storage/allocation.json"), Not(HasSubstr("mlx5_0")));
  }
}

// One resource, from the flags or the only one of a config, answers with exactly the plain
// variables and /etc/rdma/allocation.json: no name of its own.
TEST_F(ResourcesTest, OneResourceSetsThePlainNamesOnly) {
  Config config = MakeConfig(hca::Mode::kExclusive);
  config.allocation_dir = node_.dir().Sub("allocations");
  ASSERT_TRUE(std::filesystem::create_directories(config.allocation_dir));
  for (const bool from_config : {false, true}) {
    std::vector<resources::Resource> served;
    if (from_config) served.push_back(StorageResource());
    NodeState state(config, Sources(), served);
    ASSERT_TRUE(state.Init().ok());
    v1beta1::AllocateRequest request;
    request.add_container_requests()->add_devices_ids(from_config ? roles_.s0 : roles_.c0);
    v1beta1::AllocateResponse response;
    ASSERT_TRUE(HandleAllocate(state.resource(0), request, &response).ok());
    const auto& r = response.container_responses(0);
    std::vector<std::string> names;
    for (const auto& [key, value] : r.envs()) names.push_back(key);
    EXPECT_THAT(names, UnorderedElementsAre("NCCL_IB_HCA", "RDMA_HCA_NAMES", "RDMA_HCA_PCI",
                                            "UCX_NET_DEVICES"))
        << from_config;
    ASSERT_EQ(r.mounts_size(), 1) << from_config;
    EXPECT_EQ(r.mounts(0).container_path(), "/etc/rdma/allocation.json");
  }
}

// The Mellanox config's resources (always shared, one HCA in several) follow the same rule: the
// first listed sets the plain names; an HCA both hand out is one device path with one host path,
// which the kubelet gives the container once.
TEST_F(ResourcesTest, SharedResourcesOfOneHcaMergeWithoutConflict) {
  resources::Resource storage = StorageResource();
  storage.name = "rdma/storage_shared";
  storage.always_shared = true;
  resources::Resource everything = Named("rdma/all");
  everything.always_shared = true;
  NodeState state(MakeConfig(hca::Mode::kExclusive), Sources(), {storage, everything});
  ASSERT_TRUE(state.Init().ok());
  for (const Merged& m : BothOrders(state.resource(0), "shared-0", state.resource(1), "shared-0")) {
    EXPECT_THAT(m.conflicts, ::testing::IsEmpty());
    EXPECT_EQ(m.envs.at("RDMA_HCA_NAMES"), "mlx5_4,mlx5_5");
    EXPECT_EQ(m.envs.at("RDMA_HCA_NAMES_RDMA_STORAGE_SHARED"), "mlx5_4,mlx5_5");
    EXPECT_EQ(m.envs.at("RDMA_HCA_NAMES_RDMA_ALL"), "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5");
  }
}

// The resources are checked against the discovered node before anything is served: a check's
// refusal is Prepare's and Start's error, and no socket appears.
TEST_F(ResourcesTest, RefusedResourcesServeNothing) {
  const Config config = MakeConfig(hca::Mode::kExclusive);
  PluginServer plugin(config, Sources(), {ComputeResource(), StorageResource()});
  std::vector<std::string> seen;
  const absl::Status refused = plugin.Prepare(
      [&](const std::vector<resources::Resource>& r, const topology::Topology& t) {
        for (const resources::Resource& x : r) seen.push_back(x.name);
        EXPECT_EQ(t.hcas().size(), 8u);
        return absl::InvalidArgumentError("HCA mlx5_4 is in rdma/hca and rdma/storage");
      });
  EXPECT_EQ(refused.message(), "HCA mlx5_4 is in rdma/hca and rdma/storage");
  EXPECT_THAT(seen, ElementsAre("rdma/hca", "rdma/storage"));
  EXPECT_FALSE(std::filesystem::exists(config.kubelet_dir + "/rdma-hca.sock"));
  EXPECT_FALSE(std::filesystem::exists(config.kubelet_dir + "/rdma-storage.sock"));
}

// Two resources whose names differ only in '/' and '.' would share a socket, and two whose names
// differ only in case and punctuation would set one container variable each: refused at Start,
// naming both.
TEST_F(ResourcesTest, ResourcesSharingASocketAreRefused) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"rdma/hca", "rdma.hca/x", "rdma-hca/x"},
       "resources rdma.hca/x and rdma-hca/x would be served on one socket"},
      {{"rdma/hca", "rdma/hca-x", "rdma/hca_x"},
       "resources rdma/hca-x and rdma/hca_x would set the same container variables, "
       "RDMA_HCA_NAMES_RDMA_HCA_X"},
  };
  for (const auto& [names, says] : cases) {
    std::vector<resources::Resource> served;
    for (const std::string& name : names) served.push_back(Named(name));
    PluginServer plugin(MakeConfig(hca::Mode::kExclusive), Sources(), served);
    const absl::Status s = plugin.Start();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << says;
    EXPECT_THAT(std::string(s.message()), HasSubstr(says));
  }
}

// The per-resource instruments carry the resource's name; the node's are written once.
TEST_F(ResourcesTest, MetricsAreLabelledByResource) {
  NodeState state(MakeConfig(hca::Mode::kExclusive), Sources(),
                  {ComputeResource(), StorageResource()});
  ASSERT_TRUE(state.Init().ok());
  ASSERT_TRUE(state.resource(1).Allocate({roles_.s1}).ok());
  state.resource(1).metrics().registrations.Add();
  metrics::Exposition out;
  state.WriteMetrics(out);
  const std::string text = out.Take();
  EXPECT_THAT(text,
              HasSubstr("rdma_device_plugin_registrations_total{resource=\"rdma/storage\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("rdma_device_plugin_registrations_total{resource=\"rdma/hca\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("rdma_device_plugin_allocation_alignment_total{resource=\"rdma/"
                              "storage\",path_class=\"unknown\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("rdma_device_plugin_allocation_alignment_total{resource=\"rdma/"
                              "hca\",path_class=\"unknown\"} 0\n"));
  std::size_t families = 0;
  for (std::size_t at = 0; (at = text.find("# TYPE rdma_device_plugin_pod_resources_errors_total",
                                           at)) != std::string::npos;
       ++at) {
    ++families;
  }
  EXPECT_EQ(families, 1u);
}

}  // namespace
}  // namespace rdp::deviceplugin
