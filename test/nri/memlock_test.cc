#include "nri/memlock.h"

#include "gtest/gtest.h"

namespace rdp::nri {
namespace {

TEST(NriMemlockTest, ParsesSizes) {
  EXPECT_EQ(*ParseMemlock("unlimited"), kUnlimited);
  EXPECT_EQ(*ParseMemlock("infinity"), kUnlimited);
  EXPECT_EQ(*ParseMemlock("8388608"), 8388608u);
  EXPECT_EQ(*ParseMemlock("64Ki"), 65536u);
  EXPECT_EQ(*ParseMemlock("8Mi"), 8u << 20);
  EXPECT_EQ(*ParseMemlock("64Gi"), std::uint64_t{64} << 30);
  EXPECT_EQ(*ParseMemlock("2Ti"), std::uint64_t{2} << 40);
  for (const char* bad : {"", "0", "-1", "1.5Gi", "Gi", "8M", "8 Mi", "lots", "16777216Ti",
                          "99999999999999999999"}) {
    auto parsed = ParseMemlock(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    if (!parsed.ok()) {
      EXPECT_NE(parsed.status().message().find("--memlock"), std::string::npos) << bad;
    }
  }
}

TEST(NriMemlockTest, FormatsInTheLargestUnit) {
  EXPECT_EQ(FormatMemlock(kUnlimited), "unlimited");
  EXPECT_EQ(FormatMemlock(65536), "64Ki");
  EXPECT_EQ(FormatMemlock(std::uint64_t{64} << 30), "64Gi");
  EXPECT_EQ(FormatMemlock(1000), "1000");
  EXPECT_EQ(FormatMemlock((8u << 20) + 1024), "8193Ki");
}

TEST(NriMemlockTest, VerbsDevicesAreUverbsNodes) {
  EXPECT_TRUE(IsVerbsDevice("/dev/infiniband/uverbs0"));
  EXPECT_TRUE(IsVerbsDevice("/dev/infiniband/uverbs17"));
  for (const char* not_verbs : {"/dev/infiniband/uverbs", "/dev/infiniband/uverbs0x",
                                "/dev/infiniband/umad0", "/dev/infiniband/rdma_cm",
                                "/dev/nvidia0", "/host/dev/infiniband/uverbs0", ""}) {
    EXPECT_FALSE(IsVerbsDevice(not_verbs)) << not_verbs;
  }
}

ContainerView WithDevices(std::vector<std::string> paths) {
  ContainerView v;
  v.id = "c1";
  v.device_paths = std::move(paths);
  return v;
}

TEST(NriMemlockTest, OnlyContainersWithAVerbsDeviceAreRaised) {
  const MemlockDecision none = DecideMemlock(WithDevices({"/dev/nvidia0", "/dev/fuse"}), kUnlimited);
  EXPECT_TRUE(none.verbs_devices.empty());
  EXPECT_FALSE(none.set.has_value());
  // rdma_cm alone (or umad) registers no memory.
  EXPECT_FALSE(DecideMemlock(WithDevices({"/dev/infiniband/rdma_cm", "/dev/infiniband/umad0"}),
                             kUnlimited)
                   .set.has_value());

  const MemlockDecision d = DecideMemlock(
      WithDevices({"/dev/infiniband/uverbs3", "/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"}),
      kUnlimited);
  EXPECT_EQ(d.verbs_devices,
            (std::vector<std::string>{"/dev/infiniband/uverbs3", "/dev/infiniband/uverbs0"}));
  ASSERT_TRUE(d.set.has_value());
  EXPECT_EQ(*d.set, (Rlimit{kUnlimited, kUnlimited}));
}

TEST(NriMemlockTest, NeverLowersALimit) {
  ContainerView v = WithDevices({"/dev/infiniband/uverbs0"});
  const std::uint64_t limit = std::uint64_t{64} << 30;
  v.memlock = Rlimit{8u << 20, 8u << 20};  // the runtime's 8 MiB
  EXPECT_EQ(*DecideMemlock(v, limit).set, (Rlimit{limit, limit}));
  v.memlock = Rlimit{8u << 20, kUnlimited};  // soft low, hard unlimited: hard kept
  EXPECT_EQ(*DecideMemlock(v, limit).set, (Rlimit{limit, kUnlimited}));
  v.memlock = Rlimit{kUnlimited, kUnlimited};  // already more
  const MemlockDecision d = DecideMemlock(v, limit);
  EXPECT_FALSE(d.set.has_value());
  EXPECT_EQ(d.verbs_devices.size(), 1u);
}

}  // namespace
}  // namespace rdp::nri
