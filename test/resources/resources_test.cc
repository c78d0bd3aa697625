#include "resources/resources.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace rdp::resources {
namespace {

using ::testing::ElementsAre;

topology::Hca Make(std::string name, std::string pci, int numa, std::string link_layer,
                   std::vector<std::string> netdevs, std::string physfn = "") {
  topology::Hca h;
  h.name = std::move(name);
  h.place.pci = std::move(pci);
  h.place.numa = numa;
  topology::Port p;
  p.number = 1;
  p.link_layer = std::move(link_layer);
  h.ports = {p};
  h.netdevs = std::move(netdevs);
  h.netdev_link_type = h.netdevs.empty() ? ""
                       : h.ports[0].link_layer == "InfiniBand" ? "infiniband"
                                                              : "ether";
  h.vendor = "15b3";
  h.device = physfn.empty() ? "1021" : "101e";
  h.driver = "mlx5_core";
  h.physfn = std::move(physfn);
  return h;
}

// Two compute IB PFs, one Ethernet storage PF, one VF of the first compute PF.
std::vector<topology::Hca> Node() {
  return {Make("mlx5_0", "0000:1a:00.0", 0, "InfiniBand", {"ibp26s0"}),
          Make("mlx5_1", "0000:9a:00.0", 1, "InfiniBand", {"ibp154s0"}),
          Make("mlx5_2", "0000:2b:00.0", 0, "Ethernet", {"ens2f0np0"}),
          Make("mlx5_3", "0000:1a:00.2", 0, "InfiniBand", {}, "0000:1a:00.0")};
}

TEST(SelectorTest, AnEmptySelectorTakesThePhysicalFunctions) {
  EXPECT_THAT(Select(Selector{}, Node()), ElementsAre(0, 1, 2));
}

TEST(SelectorTest, VirtualFunctionsAreTakenOnlyWhereAsked) {
  Selector include;
  include.virtual_functions = VirtualFunctions::kInclude;
  EXPECT_THAT(Select(include, Node()), ElementsAre(0, 1, 2, 3));
  Selector only;
  only.virtual_functions = VirtualFunctions::kOnly;
  EXPECT_THAT(Select(only, Node()), ElementsAre(3));
}

TEST(SelectorTest, ValuesOfOneKeyAreOredAndKeysAreAnded) {
  Selector s;
  s.link_layers = {"InfiniBand", "Ethernet"};
  EXPECT_THAT(Select(s, Node()), ElementsAre(0, 1, 2));
  s.numa_nodes = {0};
  EXPECT_THAT(Select(s, Node()), ElementsAre(0, 2));
  s.link_layers = {"infiniband"};  // link layers in any case, as operators write them
  EXPECT_THAT(Select(s, Node()), ElementsAre(0));
}

TEST(SelectorTest, NamesAndNetdevsAreGlobsAndAddressesMayOmitTheDomain) {
  Selector s;
  s.hca_names = {"mlx5_[01]"};
  EXPECT_THAT(Select(s, Node()), ElementsAre(0, 1));
  Selector n;
  n.netdevs = {"ens*"};
  EXPECT_THAT(Select(n, Node()), ElementsAre(2));
  Selector p;
  p.pci_addresses = {"9A:00.0", "0000:2b:00.0"};
  EXPECT_THAT(Select(p, Node()), ElementsAre(1, 2));
}

TEST(SelectorTest, PciIdsAndDriversAreExact) {
  Selector s;
  s.virtual_functions = VirtualFunctions::kInclude;
  s.device_ids = {"101e"};
  EXPECT_THAT(Select(s, Node()), ElementsAre(3));
  s.device_ids = {};
  s.drivers = {"mlx5_ib"};
  EXPECT_THAT(Select(s, Node()), ElementsAre());
  s.drivers = {"mlx5_core"};
  s.vendors = {"15B3"};
  EXPECT_THAT(Select(s, Node()), ElementsAre(0, 1, 2, 3));
}

TEST(SelectorTest, TheMellanoxKeysReadTheFirstNetdevAndNeverMatchAFunctionWithout) {
  Selector s;
  s.virtual_functions = VirtualFunctions::kInclude;
  s.link_types = {"infiniband"};
  EXPECT_THAT(Select(s, Node()), ElementsAre(0, 1));  // the VF has no netdev
  s.link_types = {};
  s.if_names = {"ens2f0np0", "ibp26"};  // exact, not a prefix
  EXPECT_THAT(Select(s, Node()), ElementsAre(2));
}

TEST(ResourceTest, TheSocketIsNamedForTheResource) {
  EXPECT_EQ(Resource{}.SocketName(), "rdma-hca.sock");
  Resource r;
  r.name = "example.com/storage";
  EXPECT_EQ(r.SocketName(), "example-com-storage.sock");
}

}  // namespace
}  // namespace rdp::resources
