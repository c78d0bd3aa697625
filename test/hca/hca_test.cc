#include "hca/hca.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rdp::hca {
namespace {

TEST(ModeTest, ParsesItsOwnNames) {
  for (Mode m : {Mode::kExclusive, Mode::kShared}) {
    absl::StatusOr<Mode> parsed = ParseMode(ModeName(m));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  for (const char* bad : {"Shared", "", "both"}) {
    absl::StatusOr<Mode> parsed = ParseMode(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseMode("both").status().message(), "'both' is not a mode: shared or exclusive");
}

TEST(BuildAllocationTest, SpecsAndExactMatchEnvs) {
  topology::Hca a;
  a.name = "mlx5_1";
  a.place.pci = "0000:1a:00.0";
  a.uverbs = "uverbs1";
  a.umad = {"umad1"};
  a.issm = {"issm1"};
  a.char_devices = {{"/x/dev/infiniband/uverbs1", true},
                    {"/x/dev/infiniband/umad1", true},
                    {"/x/dev/infiniband/issm1", false}};
  topology::Hca b;
  b.name = "mlx5_10";
  b.place.pci = "0000:9a:00.0";
  b.uverbs = "uverbs10";
  b.char_devices = {{"/x/dev/infiniband/uverbs10", true}};
  ContainerAllocation got = BuildAllocation({a, b}, true);
  std::vector<std::string> paths;
  for (const auto& s : got.devices) {
    EXPECT_EQ(s.host_path, s.container_path);
    EXPECT_EQ(s.permissions, "rw");
    paths.push_back(s.host_path);
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"/dev/infiniband/uverbs1", "/dev/infiniband/umad1",
                                             "/dev/infiniband/uverbs10",
                                             "/dev/infiniband/rdma_cm"}));
  EXPECT_EQ(got.envs["NCCL_IB_HCA"], "=mlx5_1,mlx5_10");
  EXPECT_EQ(got.envs["RDMA_HCA_NAMES"], "mlx5_1,mlx5_10");
  EXPECT_EQ(got.envs["RDMA_HCA_PCI"], "0000:1a:00.0,0000:9a:00.0");
}

}  // namespace
}  // namespace rdp::hca
