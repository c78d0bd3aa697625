#include "dra/driver.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include "test/dra/dra_node.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::Dev;
using testing::kDriver;
using testing::kHca0;
using testing::kHca1;
using testing::kNode;

const ClaimRef kClaim{"ns", "0c1a1m-uid-1", "claim-1"};

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, false);
}

// The device paths in a claim's CDI spec.
std::vector<std::string> SpecPaths(DraNode& n, const std::string& uid) {
  const nlohmann::json spec = ReadJson(n.cdi().PathOf(uid));
  std::vector<std::string> out;
  for (const auto& d : spec["devices"][0]["containerEdits"]["deviceNodes"]) {
    out.push_back(d["path"]);
  }
  return out;
}

TEST(DRADriverTest, PrepareWritesSpecAndCheckpointAndAnswersCdiIds) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0), Dev(kHca1, "hca/sub")});
  auto out = n.driver().Prepare({kClaim});
  ASSERT_EQ(out.size(), 1u);
  const auto& r = out.at(kClaim.uid);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<std::string> ids = {"rdma.example.com/hca=0c1a1m-uid-1"};
  EXPECT_EQ(*r, (std::vector<PreparedDevice>{{{"hca"}, kNode, kHca0, ids},
                                             {{"hca"}, kNode, kHca1, ids}}));
  EXPECT_EQ(n.reader().last_driver(), kDriver);
  EXPECT_EQ(SpecPaths(n, kClaim.uid),
            (std::vector<std::string>{"/dev/infiniband/uverbs0", "/dev/infiniband/umad0",
                                      "/dev/infiniband/issm0", "/dev/infiniband/uverbs1",
                                      "/dev/infiniband/umad1", "/dev/infiniband/issm1",
                                      "/dev/infiniband/rdma_cm"}));
  const nlohmann::json cp = ReadJson(n.checkpoint_path());
  ASSERT_TRUE(cp["claims"].contains(kClaim.uid)) << cp.dump();
  EXPECT_EQ(cp["claims"][kClaim.uid]["name"], "claim-1");
  EXPECT_EQ(cp["claims"][kClaim.uid]["devices"].size(), 2u);
}

TEST(DRADriverTest, PrepareIsIdempotentAndAnsweredFromTheCheckpoint) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0)});
  auto first = n.driver().Prepare({kClaim});
  ASSERT_TRUE(first.at(kClaim.uid).ok());
  EXPECT_EQ(n.reader().reads(), 1);
  n.reader().SetDown(true);  // the API server is gone: a known claim does not need it
  auto again = n.driver().Prepare({kClaim, kClaim});
  ASSERT_EQ(again.size(), 1u);
  ASSERT_TRUE(again.at(kClaim.uid).ok()) << again.at(kClaim.uid).status();
  EXPECT_EQ(*again.at(kClaim.uid), *first.at(kClaim.uid));
  EXPECT_EQ(n.reader().reads(), 1);
}

TEST(DRADriverTest, RestartKeepsPreparedClaimsAndRewritesAMissingSpec) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca1)});
  auto first = n.driver().Prepare({kClaim});
  ASSERT_TRUE(first.at(kClaim.uid).ok());
  const std::string spec = ReadJson(n.cdi().PathOf(kClaim.uid)).dump();
  n.reader().SetDown(true);
  std::filesystem::remove(n.cdi().PathOf(kClaim.uid));  // /var/run/cdi after a reboot
  n.NewDriver();
  EXPECT_EQ(n.driver().Prepared().count(kClaim.uid), 1u);
  auto again = n.driver().Prepare({kClaim});
  ASSERT_TRUE(again.at(kClaim.uid).ok()) << again.at(kClaim.uid).status();
  EXPECT_EQ(*again.at(kClaim.uid), *first.at(kClaim.uid));
  EXPECT_EQ(ReadJson(n.cdi().PathOf(kClaim.uid)).dump(), spec);
  EXPECT_EQ(n.reader().reads(), 1);
  // And it unprepares without the API server.
  auto un = n.driver().Unprepare({kClaim});
  EXPECT_TRUE(un.at(kClaim.uid).ok());
  EXPECT_TRUE(n.CdiFiles().empty());
}

TEST(DRADriverTest, CorruptCheckpointStartsWithWhatCanBeRecovered) {
  DraNode n;
  n.reader().Set("uid-a", std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().Set("uid-b", std::vector<AllocatedDevice>{Dev(kHca1)});
  ASSERT_TRUE(n.driver().Prepare({{"ns", "uid-a", "a"}, {"ns", "uid-b", "b"}}).at("uid-b").ok());
  nlohmann::json cp = ReadJson(n.checkpoint_path());
  cp["claims"]["uid-b"]["devices"] = "garbage";
  std::ofstream(n.checkpoint_path(), std::ios::trunc) << cp.dump();
  n.reader().SetDown(true);
  n.NewDriver();
  const PreparedClaims prepared = n.driver().Prepared();
  ASSERT_EQ(prepared.size(), 1u);
  EXPECT_EQ(prepared.begin()->first, "uid-a");
  EXPECT_TRUE(n.driver().Prepare({{"ns", "uid-a", "a"}}).at("uid-a").ok());  // no API server
  // The recovered state is on disk again, valid; the corrupt file kept beside it.
  EXPECT_EQ(ReadJson(n.checkpoint_path())["claims"].size(), 1u);
  int aside = 0;
  for (const auto& e : std::filesystem::directory_iterator(n.plugin_dir())) {
    aside += e.path().filename().string().find(".corrupt-") != std::string::npos;
  }
  EXPECT_EQ(aside, 1);
  // The claim that was lost from it fails (the API server is down), and is not half-prepared.
  EXPECT_FALSE(n.driver().Prepare({{"ns", "uid-b", "b"}}).at("uid-b").ok());
}

TEST(DRADriverTest, UnprepareRemovesSpecAndEntryAndIsIdempotent) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0)});
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kClaim.uid).ok());
  ASSERT_EQ(n.CdiFiles().size(), 1u);
  auto un = n.driver().Unprepare({kClaim});
  ASSERT_TRUE(un.at(kClaim.uid).ok()) << un.at(kClaim.uid);
  EXPECT_TRUE(n.CdiFiles().empty());
  EXPECT_TRUE(n.driver().Prepared().empty());
  EXPECT_TRUE(ReadJson(n.checkpoint_path())["claims"].empty());
  EXPECT_TRUE(n.driver().Unprepare({kClaim}).at(kClaim.uid).ok());
  EXPECT_TRUE(n.driver().Unprepare({{"ns", "never-seen", "x"}}).at("never-seen").ok());
  n.NewDriver();
  EXPECT_TRUE(n.driver().Prepared().empty());
}

struct ErrorCase {
  std::string name;
  absl::StatusOr<std::vector<AllocatedDevice>> devices;  // what the reader answers
  bool down = false;
  absl::StatusCode code;
  std::string message;  // part of the error
};

TEST(DRADriverTest, PerClaimErrorsWriteNothing) {
  const std::vector<ErrorCase> cases = {
      {"unknown claim", absl::NotFoundError("gone"), false, absl::StatusCode::kNotFound,
       "not found"},
      {"other driver", std::vector<AllocatedDevice>{}, false,
       absl::StatusCode::kFailedPrecondition, "no device of driver rdma.example.com"},
      {"API down", std::vector<AllocatedDevice>{}, true, absl::StatusCode::kUnavailable,
       "API server could not be reached"},
      {"malformed", absl::InvalidArgumentError("result 0 has no device"), false,
       absl::StatusCode::kInvalidArgument, "malformed allocation"},
      {"not allocated", absl::FailedPreconditionError("no allocation"), false,
       absl::StatusCode::kFailedPrecondition, "not allocated"},
      {"another node's pool", std::vector<AllocatedDevice>{{"hca", "node-b", kHca0}}, false,
       absl::StatusCode::kFailedPrecondition, "not in this node's pool node-a"},
      {"device not on this node", std::vector<AllocatedDevice>{Dev(kHca0), Dev("hca-0000-ff-00-0")},
       false, absl::StatusCode::kNotFound, "hca-0000-ff-00-0 is not on node node-a"},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    DraNode n;
    n.reader().Set(kClaim.uid, c.devices);
    n.reader().SetDown(c.down);
    // A good claim in the same call is prepared: errors are per claim.
    const ClaimRef good{"ns", "good-uid", "good"};
    if (!c.down) n.reader().Set(good.uid, std::vector<AllocatedDevice>{Dev(kHca1)});
    auto out = n.driver().Prepare({kClaim, good});
    ASSERT_EQ(out.size(), 2u);
    const auto& r = out.at(kClaim.uid);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("ns/claim-1"), std::string::npos) << r.status();
    EXPECT_EQ(n.driver().Prepared().count(kClaim.uid), 0u);
    EXPECT_FALSE(n.cdi().Exists(kClaim.uid));
    if (!c.down) {
      EXPECT_TRUE(out.at(good.uid).ok());
      EXPECT_EQ(n.CdiFiles(), std::vector<std::string>{"rdma.example.com-hca_good-uid.json"});
    } else {
      EXPECT_TRUE(n.CdiFiles().empty());
    }
    n.NewDriver();
    EXPECT_EQ(n.driver().Prepared().count(kClaim.uid), 0u);
  }
}

TEST(DRADriverTest, HotPluggedHcaIsFoundByDiscoveringAgain) {
  DraNode n;
  int rediscovered = 0;
  n.SetRediscover([&n, &rediscovered] {
    ++rediscovered;
    return n.ReadTopology();
  });
  n.NewDriver();
  // Plugged in after the driver's snapshot was taken.
  ASSERT_TRUE(n.node()
                  .fixture()
                  .AddHca(deviceplugin::testing::FixtureCard("mlx5_4", "0000:da:00.0", 1, "pci0000:d7"))
                  .ok());
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0), Dev("hca-0000-da-00-0")});
  auto r = n.driver().Prepare({kClaim}).at(kClaim.uid);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(rediscovered, 1);
  const std::vector<std::string> paths = SpecPaths(n, kClaim.uid);
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/dev/infiniband/uverbs4"), paths.end());
  // A device that is nowhere: discovered again, still not found.
  const ClaimRef bogus{"ns", "uid-bogus", "bogus"};
  n.reader().Set(bogus.uid, std::vector<AllocatedDevice>{Dev("hca-0000-ee-00-0")});
  auto b = n.driver().Prepare({bogus}).at(bogus.uid);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound) << b.status();
  EXPECT_EQ(rediscovered, 2);
  // Known devices need no discovery.
  const ClaimRef known{"ns", "uid-known", "known"};
  n.reader().Set(known.uid, std::vector<AllocatedDevice>{Dev(kHca1)});
  EXPECT_TRUE(n.driver().Prepare({known}).at(known.uid).ok());
  EXPECT_EQ(rediscovered, 2);
}

TEST(DRADriverTest, MissingDeviceNodeRefusesTheClaim) {
  DraNode n;
  ASSERT_TRUE(n.node().fixture().RemoveUverbs("mlx5_1").ok());
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca1)});
  auto r = n.driver().Prepare({kClaim}).at(kClaim.uid);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("uverbs1 is missing"), std::string::npos) << r.status();
  EXPECT_TRUE(n.CdiFiles().empty());
}

TEST(DRADriverTest, OneDeadlineForAllClaimsOfACall) {
  DraNode n;
  n.reader().SetDown(true);
  const absl::Time before = absl::Now();
  auto out = n.driver().Prepare({{"ns", "a", "a"}, {"ns", "b", "b"}, {"ns", "c", "c"}});
  EXPECT_EQ(out.size(), 3u);
  const std::vector<absl::Time> d = n.reader().deadlines();
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0], d[1]);
  EXPECT_EQ(d[1], d[2]);
  EXPECT_GE(d[0], before + absl::Seconds(1));  // DraNode's api_timeout
  EXPECT_LE(d[0], absl::Now() + absl::Seconds(1));
}

TEST(DRADriverTest, ClaimWithoutUidIsInvalid) {
  DraNode n;
  auto out = n.driver().Prepare({{"ns", "", "x"}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out.begin()->second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(n.reader().reads(), 0);
}

TEST(DRADriverTest, ConcurrentCallsForOneClaimAreSafe) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0)});
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::vector<int> ok(kThreads);  // not vector<bool>: its elements share words
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&n, &ok, i] {
      for (int round = 0; round < 20; ++round) {
        if (i % 2 == 0) {
          ok[i] = n.driver().Prepare({kClaim}).at(kClaim.uid).ok();
        } else {
          ok[i] = n.driver().Unprepare({kClaim}).at(kClaim.uid).ok();
        }
        if (!ok[i]) return;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_TRUE(ok[i] != 0) << i;
  // Whatever the interleaving, the checkpoint and the CDI dir agree.
  const bool prepared = n.driver().Prepared().count(kClaim.uid) == 1;
  EXPECT_EQ(n.cdi().Exists(kClaim.uid), prepared);
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kClaim.uid).ok());
  EXPECT_TRUE(n.cdi().Exists(kClaim.uid));
  EXPECT_EQ(n.CdiFiles().size(), 1u);  // no temporary file left
}

}  // namespace
}  // namespace rdp::dra
