// The entries of a claim's status.devices (dra/device_status.h), from a fixture node.

#include "dra/device_status.h"

#include <unistd.h>

#include "gtest/gtest.h"
#include "test/dra/dra_node.h"
#include "topology/discovery.h"

namespace rdp::dra {
namespace {

using rdp::testing::FixtureCard;

TEST(DRADeviceStatusTest, NamesTheHcaItsUverbsNodeAndItsFirstNetdev) {
  sim::FixtureHca roce = FixtureCard("mlx5_0", "0000:1a:00.0", 0, "pci0000:15");
  roce.netdevs = {"ens1f0np0", "ens1f0v0"};
  rdp::testing::TestNode node({roce, FixtureCard("mlx5_1", "0000:3a:00.0", 0, "pci0000:37")});
  std::shared_ptr<Env> env = node.NodeEnv();
  absl::StatusOr<std::vector<topology::Hca>> hcas = topology::ReadSysfsHcas(*env);
  ASSERT_TRUE(hcas.ok()) << hcas.status();
  ASSERT_EQ(hcas->size(), 2u);

  EXPECT_EQ(AllocatedDeviceStatus("rdma.example.com", "node-a", (*hcas)[0], *env),
            nlohmann::json::parse(R"({
              "driver": "rdma.example.com", "pool": "node-a", "device": "hca-0000-1a-00-0",
              "data": {"hcaName": "mlx5_0", "uverbs": "/dev/infiniband/uverbs0"},
              "networkData": {"interfaceName": "ens1f0np0", "hardwareAddress": "02:00:1a:00:00:00"}
            })"));
  // No netdev (InfiniBand without IPoIB): no networkData.
  EXPECT_EQ(AllocatedDeviceStatus("rdma.example.com", "node-a", (*hcas)[1], *env),
            nlohmann::json::parse(R"({
              "driver": "rdma.example.com", "pool": "node-a", "device": "hca-0000-3a-00-0",
              "data": {"hcaName": "mlx5_1", "uverbs": "/dev/infiniband/uverbs1"}
            })"));
  // An address that cannot be read is left out, the interface still named.
  ASSERT_EQ(::unlink(node.dir().Sub("node/sys/bus/pci/devices/0000:1a:00.0/net/ens1f0np0/address").c_str()), 0);
  EXPECT_EQ(AllocatedDeviceStatus("rdma.example.com", "node-a", (*hcas)[0], *env)["networkData"],
            nlohmann::json::parse(R"({"interfaceName": "ens1f0np0"})"));
}

}  // namespace
}  // namespace rdp::dra
