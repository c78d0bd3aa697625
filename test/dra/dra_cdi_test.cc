#include "dra/cdi.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "hca/hca.h"
#include "test/dra/dra_node.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::kDriver;

nlohmann::json Node(const std::string& path, int major, int minor) {
  return {{"path", path}, {"type", "c"}, {"permissions", "rw"}, {"major", major},
          {"minor", minor}};
}

// What a container holding HCAs `idx` of `t` gets, with rdma_cm and no allocation file.
hca::ContainerAllocation Allocation(const topology::Topology& t, std::vector<int> idx) {
  std::vector<hca::HcaNow> now;
  for (int i : idx) now.push_back(hca::AsScanned(t.hcas()[i]));
  return hca::BuildAllocation(std::move(now), true, {}, /*allocation_dir=*/"");
}

constexpr char kUid[] = "7e57a1b2-c3d4-4e5f-a6b7-c8d9e0f1a2b3";

TEST(DRACdiTest, IdsAndFileName) {
  EXPECT_EQ(CdiDeviceName(kUid, "hca"), "7e57a1b2-c3d4-4e5f-a6b7-c8d9e0f1a2b3-hca");
  EXPECT_EQ(CdiDeviceId(kDriver, kUid, "hca"),
            "rdma.example.com/hca=7e57a1b2-c3d4-4e5f-a6b7-c8d9e0f1a2b3-hca");
  EXPECT_EQ(LegacyCdiDeviceId(kDriver, kUid),
            "rdma.example.com/hca=7e57a1b2-c3d4-4e5f-a6b7-c8d9e0f1a2b3");
  EXPECT_EQ(CdiSpecFileName(kDriver, kUid),
            "rdma.example.com-hca_7e57a1b2-c3d4-4e5f-a6b7-c8d9e0f1a2b3.json");
  EXPECT_EQ(OwnVariableSuffix("7E57A1B2-C3D4-4E5F-A6B7-C8D9E0F1A2B3", "gpu-0-hca"),
            "7e57a1b2c3d44e5fa6b7c8d9e0f1a2b3_gpu_0_hca");
}

TEST(DRACdiTest, UidsAreUuids) {
  EXPECT_TRUE(ValidateClaimUid(kUid).ok());
  EXPECT_TRUE(ValidateClaimUid("7E57A1B2-C3D4-4E5F-A6B7-C8D9E0F1A2B3").ok());
  for (const char* bad : {"", "7e57", "../7e57a1b2-c3d4-4e5f-a6b7-c8d9e0f1a2", "7e57a1b2c3d44e5fa6b7c8d9e0f1a2b3",
                          "7e57a1b2-c3d4-4e5f-a6b7-c8d9e0f1a2bz", "7e57a1b2-c3d4-4e5f-a6b7/c8d9e0f1a2b3"}) {
    EXPECT_EQ(ValidateClaimUid(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(DRACdiTest, DeviceNumbersFromSysfs) {
  DraNode n;
  auto uverbs1 = ReadDeviceNumber(n.env(), "/dev/infiniband/uverbs1");
  ASSERT_TRUE(uverbs1.has_value());
  EXPECT_EQ(uverbs1->major, 231);
  EXPECT_EQ(uverbs1->minor, 193);
  auto issm2 = ReadDeviceNumber(n.env(), "/dev/infiniband/issm2");
  ASSERT_TRUE(issm2.has_value());
  EXPECT_EQ(issm2->minor, 66);
  auto cm = ReadDeviceNumber(n.env(), "/dev/infiniband/rdma_cm");
  ASSERT_TRUE(cm.has_value());
  EXPECT_EQ(cm->major, 10);
  EXPECT_FALSE(ReadDeviceNumber(n.env(), "/dev/infiniband/uverbs9").has_value());
  EXPECT_FALSE(ReadDeviceNumber(n.env(), "/dev/null").has_value());
  EXPECT_FALSE(ReadDeviceNumber(n.env(), "/dev/infiniband/../uverbs0").has_value());
}

TEST(DRACdiTest, SpecForOneRequestOfOneHca) {
  DraNode n;
  const auto alloc = Allocation(n.topology(), {0});
  const nlohmann::json spec = BuildCdiSpec(kDriver, kUid, {{"hca", alloc, alloc.envs}}, n.env());
  const std::string own = "_7e57a1b2c3d44e5fa6b7c8d9e0f1a2b3_hca=";
  const nlohmann::json want = {
      {"cdiVersion", "0.5.0"},
      {"kind", "rdma.example.com/hca"},
      {"devices",
       {{{"name", std::string(kUid) + "-hca"},
         {"containerEdits",
          {{"env",
            {"NCCL_IB_HCA==mlx5_0", "NCCL_IB_HCA" + own + "=mlx5_0", "RDMA_HCA_NAMES=mlx5_0",
             "RDMA_HCA_NAMES" + own + "mlx5_0", "RDMA_HCA_PCI=0000:1a:00.0",
             "RDMA_HCA_PCI" + own + "0000:1a:00.0", "UCX_NET_DEVICES=mlx5_0:1",
             "UCX_NET_DEVICES" + own + "mlx5_0:1"}},
           {"deviceNodes",
            {Node("/dev/infiniband/uverbs0", 231, 192), Node("/dev/infiniband/umad0", 231, 0),
             Node("/dev/infiniband/issm0", 231, 64),
             Node("/dev/infiniband/rdma_cm", 10, 58)}}}}}}}};
  EXPECT_EQ(spec, want) << spec.dump(2);
}

// Two requests: a device each, with exactly its HCAs' nodes and its own variables; the common
// ones only where given.
TEST(DRACdiTest, SpecForTwoRequestsKeepsThemApart) {
  DraNode n;
  const auto one = Allocation(n.topology(), {1});
  const auto three = Allocation(n.topology(), {3});
  const auto both = Allocation(n.topology(), {1, 3});
  const nlohmann::json spec =
      BuildCdiSpec(kDriver, kUid, {{"a", one, both.envs}, {"b", three, std::nullopt}}, n.env());
  ASSERT_EQ(spec["devices"].size(), 2u);
  auto paths = [&spec](int i) {
    std::vector<std::string> out;
    for (const auto& d : spec["devices"][i]["containerEdits"]["deviceNodes"]) out.push_back(d["path"]);
    return out;
  };
  EXPECT_EQ(spec["devices"][0]["name"], std::string(kUid) + "-a");
  EXPECT_EQ(paths(0), (std::vector<std::string>{"/dev/infiniband/uverbs1", "/dev/infiniband/umad1",
                                                "/dev/infiniband/issm1", "/dev/infiniband/rdma_cm"}));
  EXPECT_EQ(paths(1), (std::vector<std::string>{"/dev/infiniband/uverbs3", "/dev/infiniband/umad3",
                                                "/dev/infiniband/issm3", "/dev/infiniband/rdma_cm"}));
  const nlohmann::json& env_a = spec["devices"][0]["containerEdits"]["env"];
  const nlohmann::json& env_b = spec["devices"][1]["containerEdits"]["env"];
  EXPECT_EQ(env_a[0], "NCCL_IB_HCA==mlx5_1,mlx5_3");
  EXPECT_EQ(env_a.size(), 8u);
  EXPECT_EQ(env_b.size(), 4u);  // its own only
  EXPECT_EQ(env_b[0], "NCCL_IB_HCA_7e57a1b2c3d44e5fa6b7c8d9e0f1a2b3_b==mlx5_3");
}

// The allocation file: mounted read-only at /etc/rdma/allocation.json by a device that sets the
// common variables (it describes every HCA of the containers that get it), by no other.
TEST(DRACdiTest, AllocationFileMountedWithTheCommonVariablesOnly) {
  DraNode n;
  const auto one = Allocation(n.topology(), {1});
  const auto three = Allocation(n.topology(), {3});
  const auto both = Allocation(n.topology(), {1, 3});
  const nlohmann::json spec = BuildCdiSpec(
      kDriver, kUid,
      {{"a", one, both.envs, "/run/rdp/allocations/0123456789abcdef.json"},
       {"b", three, std::nullopt, "/run/rdp/allocations/fedcba9876543210.json"}},
      n.env());
  ASSERT_EQ(spec["devices"].size(), 2u);
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["mounts"],
            nlohmann::json::parse(R"([{"hostPath": "/run/rdp/allocations/0123456789abcdef.json",
                                       "containerPath": "/etc/rdma/allocation.json",
                                       "options": ["ro", "nosuid", "nodev", "bind"]}])"));
  EXPECT_FALSE(spec["devices"][1]["containerEdits"].contains("mounts"));
}

TEST(DRACdiTest, LegacySpecIsOneDeviceNamedAfterTheClaim) {
  DraNode n;
  const auto alloc = Allocation(n.topology(), {0});
  const nlohmann::json spec = BuildLegacyCdiSpec(kDriver, kUid, alloc, n.env());
  ASSERT_EQ(spec["devices"].size(), 1u);
  EXPECT_EQ(spec["devices"][0]["name"], kUid);
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["env"][0], "NCCL_IB_HCA==mlx5_0");
}

TEST(DRACdiTest, UnknownDeviceNumberIsLeftToTheRuntime) {
  DraNode n;
  std::filesystem::remove(n.root() + "/node/sys/devices/virtual/misc/rdma_cm/dev");
  const auto alloc = Allocation(n.topology(), {0});
  const nlohmann::json spec = BuildCdiSpec(kDriver, kUid, {{"hca", alloc, std::nullopt}}, n.env());
  const nlohmann::json& cm = spec["devices"][0]["containerEdits"]["deviceNodes"].back();
  EXPECT_EQ(cm["path"], "/dev/infiniband/rdma_cm");
  EXPECT_FALSE(cm.contains("major"));
  EXPECT_FALSE(cm.contains("minor"));
  EXPECT_EQ(cm["type"], "c");
}

TEST(DRACdiTest, StoreWritesAtomicallyWithMode0644AndRemoves) {
  DraNode n;
  CdiStore store(n.cdi_dir(), kDriver);
  const nlohmann::json spec = {{"cdiVersion", kCdiVersion}};
  ::umask(077);
  ASSERT_TRUE(store.Write("uid-1", spec).ok());
  ::umask(022);
  struct stat st;
  ASSERT_EQ(::stat(store.PathOf("uid-1").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  std::ifstream in(store.PathOf("uid-1"));
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(text.str()), spec);
  EXPECT_EQ(n.CdiFiles(), std::vector<std::string>{"rdma.example.com-hca_uid-1.json"});
  ASSERT_TRUE(store.Remove("uid-1").ok());
  EXPECT_TRUE(n.CdiFiles().empty());
  EXPECT_TRUE(store.Remove("uid-1").ok());  // gone already: fine
}

}  // namespace
}  // namespace rdp::dra
