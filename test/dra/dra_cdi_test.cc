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

std::vector<const topology::Hca*> Hcas(const topology::Topology& t, std::vector<int> idx) {
  std::vector<const topology::Hca*> out;
  for (int i : idx) out.push_back(&t.hcas()[i]);
  return out;
}

TEST(DRACdiTest, IdsAndFileName) {
  EXPECT_EQ(CdiDeviceId(kDriver, "0b1c-uid"), "rdma.example.com/hca=0b1c-uid");
  EXPECT_EQ(CdiSpecFileName(kDriver, "0b1c-uid"), "rdma.example.com-hca_0b1c-uid.json");
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

TEST(DRACdiTest, SpecForOneHca) {
  DraNode n;
  const auto alloc = hca::BuildAllocation(Hcas(n.topology(), {0}), true);
  const nlohmann::json spec = BuildCdiSpec(kDriver, "7e57-uid", alloc, n.env());
  const nlohmann::json want = {
      {"cdiVersion", "0.5.0"},
      {"kind", "rdma.example.com/hca"},
      {"devices",
       {{{"name", "7e57-uid"},
         {"containerEdits",
          {{"env", {"NCCL_IB_HCA==mlx5_0", "RDMA_HCA_NAMES=mlx5_0", "RDMA_HCA_PCI=0000:1a:00.0"}},
           {"deviceNodes",
            {Node("/dev/infiniband/uverbs0", 231, 192), Node("/dev/infiniband/umad0", 231, 0),
             Node("/dev/infiniband/issm0", 231, 64),
             Node("/dev/infiniband/rdma_cm", 10, 58)}}}}}}}};
  EXPECT_EQ(spec, want) << spec.dump(2);
}

TEST(DRACdiTest, SpecForTwoHcasCarriesExactlyTheirNodesAndAllocateEnv) {
  DraNode n;
  const auto alloc = hca::BuildAllocation(Hcas(n.topology(), {1, 3}), true);
  const nlohmann::json spec = BuildCdiSpec(kDriver, "uid-2", alloc, n.env());
  const nlohmann::json& edits = spec["devices"][0]["containerEdits"];
  std::vector<std::string> paths;
  for (const auto& d : edits["deviceNodes"]) paths.push_back(d["path"]);
  EXPECT_EQ(paths, (std::vector<std::string>{
                       "/dev/infiniband/uverbs1", "/dev/infiniband/umad1", "/dev/infiniband/issm1",
                       "/dev/infiniband/uverbs3", "/dev/infiniband/umad3", "/dev/infiniband/issm3",
                       "/dev/infiniband/rdma_cm"}));
  // The env is device-plugin Allocate's, entry for entry.
  std::vector<std::string> env;
  for (const auto& [k, v] : alloc.envs) env.push_back(k + "=" + v);
  EXPECT_EQ(edits["env"], nlohmann::json(env));
  EXPECT_EQ(edits["env"][0], "NCCL_IB_HCA==mlx5_1,mlx5_3");
}

TEST(DRACdiTest, UnknownDeviceNumberIsLeftToTheRuntime) {
  DraNode n;
  std::filesystem::remove(n.root() + "/node/sys/devices/virtual/misc/rdma_cm/dev");
  const auto alloc = hca::BuildAllocation(Hcas(n.topology(), {0}), true);
  const nlohmann::json spec = BuildCdiSpec(kDriver, "u", alloc, n.env());
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
