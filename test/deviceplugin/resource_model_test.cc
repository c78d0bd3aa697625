#include "deviceplugin/resource_model.h"

#include <limits>

#include "allocator/allocator.h"
#include "gtest/gtest.h"

namespace rdp::deviceplugin {
namespace {

hca::AdvertisedHca H(const std::string& pci, std::optional<int> numa, bool present = true,
            bool healthy = true) {
  return {pci, "mlx5_x", numa, present, healthy};
}

TEST(ExclusiveDevicesTest, OneDevicePerHcaWithNuma) {
  auto d = ExclusiveDevices({H("0000:1a:00.0", 0), H("0000:9a:00.0", 1)}, {});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], (DeviceState{"0000:1a:00.0", true, 0}));
  EXPECT_EQ(d[1], (DeviceState{"0000:9a:00.0", true, 1}));
}

TEST(ExclusiveDevicesTest, NoTopologyForAnyWhenOneIsUnknown) {
  auto d = ExclusiveDevices({H("0000:1a:00.0", 0), H("0000:9a:00.0", std::nullopt)}, {});
  for (const auto& s : d) EXPECT_FALSE(s.numa.has_value()) << s.id;
}

TEST(ExclusiveDevicesTest, AbsentUnhealthyAndWithheldAreUnhealthy) {
  auto d = ExclusiveDevices({H("0000:01:00.0", 0, false, false), H("0000:02:00.0", 0, true, false),
                             H("0000:03:00.0", 0), H("0000:04:00.0", 0)},
                            {"0000:03:00.0"});
  EXPECT_FALSE(d[0].healthy);
  EXPECT_FALSE(d[1].healthy);
  EXPECT_FALSE(d[2].healthy);
  EXPECT_TRUE(d[3].healthy);
}

TEST(SharedDevicesTest, CountIdsHealthWhileAnyHcaUsable) {
  auto d = SharedDevices(1000, {H("0000:01:00.0", 0, true, false), H("0000:02:00.0", 0)}, {});
  ASSERT_EQ(d.size(), 1000u);
  EXPECT_EQ(d.front().id, "shared-0");
  EXPECT_EQ(d.back().id, "shared-999");
  for (const auto& s : d) {
    EXPECT_TRUE(s.healthy);
    EXPECT_FALSE(s.numa.has_value());
  }
  auto none = SharedDevices(3, {H("0000:02:00.0", 0)}, {"0000:02:00.0"});
  for (const auto& s : none) EXPECT_FALSE(s.healthy);
}

TEST(SharedIdTest, Canonical) {
  EXPECT_TRUE(IsSharedId("shared-0", 1000));
  EXPECT_TRUE(IsSharedId("shared-999", 1000));
  for (const char* bad : {"shared-1000", "shared-01", "shared--1", "shared-", "shared-x",
                          "0000:1a:00.0", "", "shared-+1", "shared-1 ", "Shared-1", "xshared-1",
                          "shared-2147483648", "shared-99999999999999999999"}) {
    EXPECT_FALSE(IsSharedId(bad, 1000)) << bad;
  }
  EXPECT_TRUE(IsSharedId("shared-99999", 100000)) << "the largest --shared-devices";
  EXPECT_FALSE(IsSharedId("shared-100000", 100000));
}

// The plugin's IDs and the allocator's indexed path read shared IDs through one definition:
// every ID the plugin accepts, the allocator answers on its index (two parsers used to have
// different limits, 10 and 7 digits).
TEST(SharedIdTest, OneDefinitionWithTheAllocator) {
  for (const char* id : {"shared-0", "shared-7", "shared-99999", "shared-1048575", "shared-1048576",
                         "shared-2147483646", "shared-01", "shared-"}) {
    EXPECT_EQ(IsSharedId(id, std::numeric_limits<int>::max()),
              allocator::SharedIndex(id).has_value())
        << id;
  }
  EXPECT_EQ(SharedId(42), "shared-42");
  EXPECT_EQ(allocator::SharedIndex(SharedId(42)), 42u);
}

}  // namespace
}  // namespace rdp::deviceplugin
