// Early-warning health (hca/early_warning.h) on observations whose counters grow, with the time
// given: no sleeps, no clock.

#include "hca/early_warning.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rdp::hca {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kPci[] = "0000:1a:00.0";
const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

HcaObservation Port1(bool active, std::optional<std::uint64_t> symbol_error,
                     std::optional<std::uint64_t> link_downed = 0) {
  HcaObservation o;
  o.pci = kPci;
  o.name = "mlx5_0";
  o.active[1] = active;
  o.errors[1] = {symbol_error, link_downed};
  return o;
}

// Polls every `step` from kStart; returns the log lines of every poll.
class Timeline {
 public:
  explicit Timeline(EarlyWarningConfig config = {}) : w_(config) {}
  std::vector<std::string> At(absl::Duration t, const HcaObservation& o) {
    return w_.Update(kStart + t, {o});
  }
  EarlyWarningStatus status() const { return w_.Status(kPci); }
  EarlyWarning& warning() { return w_; }

 private:
  EarlyWarning w_;
};

TEST(EarlyWarningTest, SymbolErrorsGrowingFasterThanTheRateDegradeUntilTheyStop) {
  Timeline t;
  std::uint64_t errors = 500;  // since boot: only growth counts
  EXPECT_THAT(t.At(absl::ZeroDuration(), Port1(true, errors)), IsEmpty());
  // +2 every 30 s: 12 within 10 minutes after 3 minutes.
  for (int i = 1; i <= 5; ++i) {
    errors += 2;
    EXPECT_THAT(t.At(absl::Seconds(30 * i), Port1(true, errors)), IsEmpty()) << i;
    EXPECT_FALSE(t.status().degraded) << i;
  }
  errors += 2;
  const std::vector<std::string> lines = t.At(absl::Seconds(180), Port1(true, errors));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "HCA mlx5_0 (PCI=0000:1a:00.0) is degraded: port 1's symbol_error grew by 12 within "
            "10m (more than 10); new pods get other HCAs while there are any");
  EXPECT_TRUE(t.status().degraded);
  EXPECT_EQ(t.status().degraded_counter, "symbol_error");
  EXPECT_FALSE(t.status().held);  // degraded is not unhealthy
  // The errors stop: degraded while the growth within the last 10 minutes is above 10, i.e.
  // while the window still reaches back to the poll at 0 (the one at 30 s leaves 10).
  EXPECT_THAT(t.At(absl::Minutes(10), Port1(true, errors)), IsEmpty());
  EXPECT_TRUE(t.status().degraded);
  EXPECT_THAT(t.At(absl::Minutes(10) + absl::Seconds(1), Port1(true, errors)),
              ElementsAre(HasSubstr("is no longer degraded")));
  EXPECT_FALSE(t.status().degraded);
}

TEST(EarlyWarningTest, SlowGrowthIsNotDegraded) {
  Timeline t;
  // +1 every 2 minutes for an hour: 5 within any 10 minutes.
  for (int i = 0; i <= 30; ++i) {
    t.At(absl::Minutes(2 * i), Port1(true, 100 + i));
    ASSERT_FALSE(t.status().degraded) << i;
  }
}

TEST(EarlyWarningTest, LinkDownedAboveItsRateDegrades) {
  Timeline t;
  t.At(absl::ZeroDuration(), Port1(true, 0, 7));
  t.At(absl::Minutes(1), Port1(true, 0, 8));
  EXPECT_FALSE(t.status().degraded);  // one more: not more than 1
  t.At(absl::Minutes(2), Port1(true, 0, 9));
  EXPECT_TRUE(t.status().degraded);
  EXPECT_EQ(t.status().degraded_counter, "link_downed");
  EXPECT_THAT(t.status().degraded_reason, HasSubstr("link_downed grew by 2"));
}

TEST(EarlyWarningTest, ACounterResetIsNotGrowth) {
  Timeline t;
  t.At(absl::ZeroDuration(), Port1(true, 1000000));
  t.At(absl::Seconds(5), Port1(true, 0));  // the driver reloaded
  t.At(absl::Seconds(10), Port1(true, 3));
  EXPECT_FALSE(t.status().degraded);
  t.At(absl::Seconds(15), Port1(true, 14));
  EXPECT_TRUE(t.status().degraded);
  EXPECT_THAT(t.status().degraded_reason, HasSubstr("grew by 14"));
}

TEST(EarlyWarningTest, NoCountersNoWarning) {
  Timeline t;
  for (int i = 0; i < 10; ++i) t.At(absl::Seconds(5 * i), Port1(true, std::nullopt, std::nullopt));
  EXPECT_EQ(t.status(), EarlyWarningStatus{});
}

TEST(EarlyWarningTest, AFlappingPortIsHeldUnhealthyUntilStable) {
  Timeline t;
  absl::Duration at = absl::ZeroDuration();
  auto poll = [&](bool active) {
    at += absl::Seconds(30);
    return t.At(at, Port1(active, 0, std::nullopt));
  };
  poll(true);
  for (int flap = 1; flap <= 3; ++flap) {  // three flaps: not more than 3
    poll(false);
    poll(true);
    EXPECT_FALSE(t.status().held) << flap;
  }
  EXPECT_THAT(poll(false), ElementsAre(
                               "HCA mlx5_0 (PCI=0000:1a:00.0) is flapping: its ports flapped 4 "
                               "times within 10m (more than 3); unhealthy until stable for 10m"));
  EXPECT_TRUE(t.status().held);
  const absl::Duration last_flap = at;
  // Up again and stable: held for 10 minutes after the last flap.
  EXPECT_THAT(poll(true), IsEmpty());
  while (at + absl::Seconds(30) < last_flap + absl::Minutes(10)) {
    poll(true);
    ASSERT_TRUE(t.status().held) << at;
  }
  EXPECT_THAT(poll(true), ElementsAre(HasSubstr("has been stable for 10m: no longer held")));
  EXPECT_FALSE(t.status().held);
  // The flaps before are history: one more flap does not hold it again.
  poll(false);
  poll(true);
  EXPECT_FALSE(t.status().held);
}

TEST(EarlyWarningTest, FlapsBetweenPollsShowInLinkDowned) {
  // Every poll sees the port ACTIVE, but the link went down and up in between each time.
  EarlyWarningConfig config;
  config.link_downed = 100;
  Timeline t(config);
  for (int i = 0; i <= 4; ++i) t.At(absl::Seconds(5 * i), Port1(true, 0, 20 + i));
  EXPECT_TRUE(t.status().held);
  EXPECT_THAT(t.status().held_reason, HasSubstr("flapped 4 times"));
  EXPECT_FALSE(t.status().degraded);  // 4 link_downed: not more than 100
}

TEST(EarlyWarningTest, SlowFlapsAreNotFlapping) {
  Timeline t;
  // A flap every 4 minutes: at most 3 within any 10 minutes.
  for (int i = 0; i < 20; ++i) {
    t.At(absl::Minutes(4 * i), Port1(true, 0, std::nullopt));
    t.At(absl::Minutes(4 * i) + absl::Seconds(30), Port1(false, 0, std::nullopt));
    ASSERT_FALSE(t.status().held) << i;
  }
}

TEST(EarlyWarningTest, AnHcaNoLongerObservedIsForgotten) {
  Timeline t;
  t.At(absl::ZeroDuration(), Port1(true, 0));
  t.At(absl::Seconds(5), Port1(true, 50));
  EXPECT_TRUE(t.status().degraded);
  EXPECT_THAT(t.warning().Update(kStart + absl::Seconds(10), {}), IsEmpty());
  EXPECT_EQ(t.status(), EarlyWarningStatus{});
}

TEST(EarlyWarningTest, ObservesAnHcasPortsFromTheScan) {
  topology::Hca h;
  h.name = "mlx5_0";
  h.place.pci = kPci;
  h.ports = {{1, "ACTIVE", "LinkUp", "Ethernet", ""}, {2, "DOWN", "Disabled", "Ethernet", ""}};
  const HcaObservation o = Observe(h, {{1, PortErrors{5, 0}}});
  EXPECT_EQ(o.pci, kPci);
  EXPECT_EQ(o.active, (std::map<int, bool>{{1, true}, {2, false}}));
  EXPECT_EQ(o.errors.at(1).symbol_error, 5u);
}

TEST(EarlyWarningTest, ValidatesItsConfig) {
  EXPECT_TRUE(ValidateEarlyWarning({}).ok());
  EarlyWarningConfig c;
  c.window = absl::ZeroDuration();
  EXPECT_THAT(ValidateEarlyWarning(c).message(), HasSubstr("--degraded-window"));
  c = {};
  c.stable_for = -absl::Seconds(1);
  EXPECT_THAT(ValidateEarlyWarning(c).message(), HasSubstr("--flap-stable"));
  c = {};
  c.max_flaps = -1;
  EXPECT_THAT(ValidateEarlyWarning(c).message(), HasSubstr("--flap-count"));
}

// The rule's verdict on top of Assess: held (flapping) is unusable with its reason; degraded
// stays usable; an HCA Assess refuses keeps Assess's reason.
TEST(EarlyWarningTest, AssessWithHistory) {
  topology::Hca h;
  h.name = "mlx5_0";
  h.place.pci = kPci;
  h.uverbs = "uverbs0";
  h.ports = {{1, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)"}};
  h.char_devices = {{"/dev/infiniband/uverbs0", true}};
  EarlyWarningStatus held;
  held.held = true;
  held.held_reason = "its ports flapped 4 times within 10m (more than 3)";
  EarlyWarningStatus degraded;
  degraded.degraded = true;
  EXPECT_TRUE(AssessWithHistory(h, {}).usable);
  EXPECT_TRUE(AssessWithHistory(h, {{kPci, degraded}}).usable);
  const Verdict v = AssessWithHistory(h, {{kPci, held}});
  EXPECT_FALSE(v.usable);
  EXPECT_EQ(v.reason, "flapping: its ports flapped 4 times within 10m (more than 3)");
  EXPECT_TRUE(AssessWithHistory(h, {{"0000:ff:00.0", held}}).usable);
  h.ports[0].state = "DOWN";
  EXPECT_EQ(AssessWithHistory(h, {{kPci, held}}).reason, Assess(h).reason);
}

}  // namespace
}  // namespace rdp::hca
