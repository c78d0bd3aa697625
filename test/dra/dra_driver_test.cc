#include "dra/driver.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "dra/device_status.h"
#include "test/dra/dra_node.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::Dev;
using testing::kDriver;
using testing::kHca0;
using testing::kHca1;
using testing::kNode;
using testing::kUid1;
using testing::kUid2;
using testing::kUid3;
using testing::ReadJson;
using testing::SpecDevice;
using testing::SpecEnv;

const ClaimRef kClaim{"ns", kUid1, "claim-1"};

// The device paths of a request's CDI device.
std::vector<std::string> SpecPaths(DraNode& n, const std::string& uid,
                                   const std::string& request = "hca") {
  std::vector<std::string> out;
  const nlohmann::json device = SpecDevice(n, uid, request);
  for (const auto& d : device["containerEdits"]["deviceNodes"]) out.push_back(d["path"]);
  return out;
}

std::string Id(const std::string& uid, const std::string& request = "hca") {
  return CdiDeviceId(kDriver, uid, request);
}

// What the first device of a request answers: its CDI device and its metadata file's.
std::vector<std::string> Ids(const std::string& uid, const std::string& request = "hca") {
  return {Id(uid, request), MetadataCdiDeviceId(kDriver, uid, request)};
}

TEST(DRADriverTest, PrepareWritesSpecAndCheckpointAndAnswersCdiIds) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0), Dev(kHca1, "hca/sub")});
  auto out = n.driver().Prepare({kClaim});
  ASSERT_EQ(out.size(), 1u);
  const auto& r = out.at(kClaim.uid);
  ASSERT_TRUE(r.ok()) << r.status();
  // One CDI device for the request and one for its metadata file, on its first device: the
  // kubelet hands a container the IDs of every device of the requests it uses.
  const std::vector<std::string> ids = {"rdma.example.com/hca=" + std::string(kUid1) + "-hca",
                                        "rdma.example.com/hca=" + std::string(kUid1) + "_hca"};
  EXPECT_EQ(*r, (std::vector<PreparedDevice>{{{"hca"}, kNode, kHca0, ids, ""},
                                             {{"hca"}, kNode, kHca1, {}, ""}}));
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
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca1)});
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "a"}, {"ns", kUid2, "b"}}).at(kUid2).ok());
  nlohmann::json cp = ReadJson(n.checkpoint_path());
  cp["claims"][kUid2]["devices"] = "garbage";
  std::ofstream(n.checkpoint_path(), std::ios::trunc) << cp.dump();
  n.reader().SetDown(true);
  n.NewDriver();
  const PreparedClaims prepared = n.driver().Prepared();
  ASSERT_EQ(prepared.size(), 1u);
  EXPECT_EQ(prepared.begin()->first, kUid1);
  EXPECT_TRUE(n.driver().Prepare({{"ns", kUid1, "a"}}).at(kUid1).ok());  // no API server
  // The recovered state is on disk again, valid; the corrupt file kept beside it.
  EXPECT_EQ(ReadJson(n.checkpoint_path())["claims"].size(), 1u);
  int aside = 0;
  for (const auto& e : std::filesystem::directory_iterator(n.plugin_dir())) {
    aside += e.path().filename().string().find(".corrupt-") != std::string::npos;
  }
  EXPECT_EQ(aside, 1);
  // The claim that was lost from it fails (the API server is down), and is not half-prepared.
  EXPECT_FALSE(n.driver().Prepare({{"ns", kUid2, "b"}}).at(kUid2).ok());
}

// Start made no effort to agree with the CDI directory: a spec a crash left between the spec
// and the checkpoint stayed for ever, so did the temporary files of interrupted writes, and a
// spec written before the HCA driver was reloaded kept naming the old uverbs node and
// major:minor, so a restarted container got another HCA's node or none.
TEST(DRADriverTest, StartReconcilesTheCdiDirectoryWithTheCheckpoint) {
  DraNode n;
  constexpr char kUid4[] = "0c1a1e00-0000-4000-8000-000000000004";
  constexpr char kUid5[] = "0c1a1e00-0000-4000-8000-000000000005";
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca1)});
  n.reader().Set(kUid3, std::vector<AllocatedDevice>{Dev(kHca1)});
  const auto first = n.driver().Prepare({{"ns", kUid1, "a"}, {"ns", kUid2, "b"}, {"ns", kUid3, "c"}});
  for (const char* uid : {kUid1, kUid2, kUid3}) ASSERT_TRUE(first.at(uid).ok()) << uid;
  const std::string fresh2 = ReadJson(n.cdi().PathOf(kUid2)).dump();

  // kUid1: the kernel module was reloaded; uverbs0 has another minor now.
  std::ofstream(n.root() + "/node/sys/class/infiniband_verbs/uverbs0/dev", std::ios::trunc)
      << "231:200\n";
  // kUid2: a spec from before the reload, naming a uverbs node that is another HCA's now.
  {
    std::string old = ReadJson(n.cdi().PathOf(kUid2)).dump();
    for (std::size_t at; (at = old.find("uverbs1")) != std::string::npos;) old.replace(at, 7, "uverbs0");
    std::ofstream(n.cdi().PathOf(kUid2), std::ios::trunc) << old;
  }
  // kUid3: its spec is gone (/var/run/cdi is a tmpfs). It is written again when the kubelet
  // prepares the claim again, not at start: after a reboot the checkpoint still holds claims of
  // pods deleted just before it, and their specs must not come back (TestRealNodeDRA/Restarts).
  std::filesystem::remove(n.cdi().PathOf(kUid3));
  // kUid4: a spec without an entry (a crash before the checkpoint was written).
  std::filesystem::copy_file(n.cdi().PathOf(kUid1), n.cdi().PathOf(kUid4));
  // kUid5: an entry naming a device the node no longer has, and its old spec.
  {
    nlohmann::json cp = ReadJson(n.checkpoint_path());
    cp["claims"][kUid5] = cp["claims"][kUid1];
    cp["claims"][kUid5]["devices"][0]["device"] = "hca-0000-ff-00-0";
    std::ofstream(n.checkpoint_path(), std::ios::trunc) << cp.dump();
    std::filesystem::copy_file(n.cdi().PathOf(kUid1), n.cdi().PathOf(kUid5));
  }
  // Writes a crash interrupted, ours and another driver's (left alone, as is its spec).
  const std::string ours_tmp =
      n.cdi_dir() + "/." + CdiSpecFileName(kDriver, kUid1) + ".4242.0.tmp";
  const std::string checkpoint_tmp = n.plugin_dir() + "/." + kCheckpointFile + ".4242.7.tmp";
  const std::string other_tmp =
      n.cdi_dir() + "/." + CdiSpecFileName("other.example.com", kUid1) + ".4242.0.tmp";
  const std::string other_spec = n.cdi_dir() + "/" + CdiSpecFileName("other.example.com", kUid4);
  for (const std::string& f : {ours_tmp, checkpoint_tmp, other_tmp, other_spec}) {
    std::ofstream(f) << "{";
  }

  n.reader().SetDown(true);
  n.NewDriver();

  EXPECT_EQ(n.CdiFiles(),
            (std::vector<std::string>{"." + CdiSpecFileName("other.example.com", kUid1) + ".4242.0.tmp",
                                      CdiSpecFileName("other.example.com", kUid4),
                                      CdiSpecFileName(kDriver, kUid1),
                                      CdiSpecFileName(kDriver, kUid2)}));
  EXPECT_FALSE(std::filesystem::exists(checkpoint_tmp));
  const nlohmann::json uverbs0 = SpecDevice(n, kUid1, "hca")["containerEdits"]["deviceNodes"][0];
  EXPECT_EQ(uverbs0["path"], "/dev/infiniband/uverbs0");
  EXPECT_EQ(uverbs0["minor"], 200) << uverbs0.dump();
  EXPECT_EQ(ReadJson(n.cdi().PathOf(kUid2)).dump(), fresh2);
  EXPECT_TRUE(n.driver().Prepare({{"ns", kUid3, "c"}}).at(kUid3).ok());
  EXPECT_EQ(SpecPaths(n, kUid3)[0], "/dev/infiniband/uverbs1");
  // The entry without a device stays for the kubelet to unprepare; nothing else is lost.
  EXPECT_EQ(n.driver().Prepared().size(), 4u);
  EXPECT_FALSE(n.driver().Prepare({{"ns", kUid5, "e"}}).at(kUid5).ok());
  EXPECT_TRUE(n.driver().Unprepare({{"ns", kUid5, "e"}}).at(kUid5).ok());
}

// What the driver hands its ClaimStatusWriter, in order.
class RecordingStatusWriter : public ClaimStatusWriter {
 public:
  void Set(const ClaimRef& ref, std::vector<nlohmann::json> devices) override {
    calls.emplace_back(ref.uid, std::move(devices));
  }
  std::vector<std::pair<std::string, std::vector<nlohmann::json>>> calls;
};

TEST(DRADriverTest, PrepareAndUnprepareSetTheClaimsDeviceStatus) {
  DraNode n;
  RecordingStatusWriter status;
  n.SetStatusWriter(&status);
  n.NewDriver();
  AllocatedDevice shared = Dev(kHca1, "hca/sub");
  shared.share_id = "0a1b2c3d-0000-4000-8000-000000000001";
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0), shared});
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kClaim.uid).ok());
  nlohmann::json second = AllocatedDeviceStatus(kDriver, kNode, n.topology().hcas()[1], n.env());
  second["shareID"] = shared.share_id;
  const std::vector<nlohmann::json> want = {
      AllocatedDeviceStatus(kDriver, kNode, n.topology().hcas()[0], n.env()), second};
  ASSERT_EQ(status.calls.size(), 1u);
  EXPECT_EQ(status.calls[0].first, kClaim.uid);
  EXPECT_EQ(status.calls[0].second, want);
  EXPECT_EQ(want[0]["data"]["hcaName"], "mlx5_0");
  // Answered from the checkpoint (another pod of the claim): set again (the writer sends nothing
  // when they are there already).
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kClaim.uid).ok());
  ASSERT_EQ(status.calls.size(), 2u);
  EXPECT_EQ(status.calls[1].second, want);
  // A claim that fails to prepare gets none.
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev("hca-0000-ff-00-0")});
  EXPECT_FALSE(n.driver().Prepare({{"ns", kUid2, "claim-2"}}).at(kUid2).ok());
  EXPECT_EQ(status.calls.size(), 2u);
  // Unprepare removes ours.
  ASSERT_TRUE(n.driver().Unprepare({kClaim}).at(kClaim.uid).ok());
  ASSERT_EQ(status.calls.size(), 3u);
  EXPECT_EQ(status.calls[2].first, kClaim.uid);
  EXPECT_TRUE(status.calls[2].second.empty());
}

// A shared HCA's allocation (shareID, consumed capacity) is what Prepare keeps in the checkpoint:
// a restarted driver answers the claim with the same shareID and knows what it consumed.
TEST(DRADriverTest, PrepareKeepsTheSharesAndConsumedCapacityAcrossARestart) {
  DraNode n;
  AllocatedDevice a = Dev(kHca0);
  a.share_id = "0a1b2c3d-0000-4000-8000-000000000001";
  a.consumed_capacity = {{"bandwidthGbps", "100"}, {"pods", "1"}};
  AllocatedDevice b = Dev(kHca0, "second");
  b.share_id = "0a1b2c3d-0000-4000-8000-000000000002";
  b.consumed_capacity = {{"bandwidthGbps", "0"}, {"pods", "1"}};
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{a, b});
  auto first = n.driver().Prepare({kClaim});
  ASSERT_TRUE(first.at(kClaim.uid).ok()) << first.at(kClaim.uid).status();
  n.NewDriver();
  ASSERT_EQ(n.driver().Prepared().size(), 1u);
  EXPECT_EQ(n.driver().Prepared().at(kClaim.uid).devices, (std::vector<AllocatedDevice>{a, b}));
  n.reader().Set(kClaim.uid, absl::UnavailableError("API server down"));
  auto again = n.driver().Prepare({kClaim});
  ASSERT_TRUE(again.at(kClaim.uid).ok()) << again.at(kClaim.uid).status();
  ASSERT_EQ(again.at(kClaim.uid)->size(), 2u);
  EXPECT_EQ((*again.at(kClaim.uid))[0].share_id, a.share_id);
  EXPECT_EQ((*again.at(kClaim.uid))[1].share_id, b.share_id);
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
  EXPECT_TRUE(n.driver().Unprepare({{"ns", kUid3, "x"}}).at(kUid3).ok());
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
    const ClaimRef good{"ns", kUid2, "good"};
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
      EXPECT_EQ(n.CdiFiles(), std::vector<std::string>{"rdma.example.com-hca_" + std::string(kUid2) + ".json"});
    } else {
      EXPECT_TRUE(n.CdiFiles().empty());
    }
    n.NewDriver();
    EXPECT_EQ(n.driver().Prepared().count(kClaim.uid), 0u);
  }
}

// A driver reload under a prepared claim: the claim stays prepared (checkpoint, spec) while the
// RDMA devices are away; once they are back with new uverbs numbers the claim's spec names the new
// nodes (RefreshSpecs), and a claim prepared after the reload gets them too.
TEST(DRADriverTest, AClaimPreparedBeforeADriverReloadNamesTheNewNodesAfterIt) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0)});
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kClaim.uid).ok());
  ASSERT_EQ(SpecPaths(n, kClaim.uid)[0], "/dev/infiniband/uverbs0");
  for (const char* name : {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}) {
    ASSERT_TRUE(n.node().fixture().UnbindRdma(name).ok()) << name;
  }
  n.core().Poll(std::set<std::string>{});
  ASSERT_EQ(n.core().Now()->driver_away.size(), 4u);
  n.driver().RefreshSpecs();  // while away: nothing is rebuilt from an HCA without its nodes
  EXPECT_EQ(n.driver().Prepared().count(kClaim.uid), 1u);
  EXPECT_EQ(SpecPaths(n, kClaim.uid)[0], "/dev/infiniband/uverbs0");
  ASSERT_TRUE(n.node().fixture().BindRdma("0000:1a:00.0", "mlx5_7").ok());  // uverbs4
  for (const auto& [pci, name] : std::vector<std::pair<std::string, std::string>>{
           {"0000:3a:00.0", "mlx5_4"}, {"0000:9a:00.0", "mlx5_5"}, {"0000:ba:00.0", "mlx5_6"}}) {
    ASSERT_TRUE(n.node().fixture().BindRdma(pci, name).ok()) << pci;
  }
  n.core().Poll(std::set<std::string>{});
  ASSERT_TRUE(n.core().Now()->driver_away.empty());
  n.driver().RefreshSpecs();
  EXPECT_EQ(SpecPaths(n, kClaim.uid)[0], "/dev/infiniband/uverbs4");
  EXPECT_EQ(SpecEnv(n, kClaim.uid)["NCCL_IB_HCA"], "=mlx5_7");
  const ClaimRef after{"ns", kUid2, "after"};
  n.reader().Set(after.uid, std::vector<AllocatedDevice>{Dev(kHca1)});
  ASSERT_TRUE(n.driver().Prepare({after}).at(after.uid).ok());
  EXPECT_EQ(SpecPaths(n, after.uid)[0], "/dev/infiniband/uverbs5");
}

TEST(DRADriverTest, HotPluggedHcaIsFoundByDiscoveringAgain) {
  DraNode n;
  const int at_start = n.discoveries();
  // Plugged in after the driver's snapshot was taken.
  ASSERT_TRUE(n.node()
                  .fixture()
                  .AddHca(rdp::testing::FixtureCard("mlx5_4", "0000:da:00.0", 1, "pci0000:d7"))
                  .ok());
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0), Dev("hca-0000-da-00-0")});
  auto r = n.driver().Prepare({kClaim}).at(kClaim.uid);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(n.discoveries() - at_start, 1);
  const std::vector<std::string> paths = SpecPaths(n, kClaim.uid);
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/dev/infiniband/uverbs4"), paths.end());
  // A device that is nowhere: discovered again, still not found.
  const ClaimRef bogus{"ns", kUid2, "bogus"};
  n.reader().Set(bogus.uid, std::vector<AllocatedDevice>{Dev("hca-0000-ee-00-0")});
  auto b = n.driver().Prepare({bogus}).at(bogus.uid);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound) << b.status();
  EXPECT_EQ(n.discoveries() - at_start, 2);
  // Known devices need no discovery.
  const ClaimRef known{"ns", kUid3, "known"};
  n.reader().Set(known.uid, std::vector<AllocatedDevice>{Dev(kHca1)});
  EXPECT_TRUE(n.driver().Prepare({known}).at(known.uid).ok());
  EXPECT_EQ(n.discoveries() - at_start, 2);
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
  auto out = n.driver().Prepare({{"ns", kUid1, "a"}, {"ns", kUid2, "b"}, {"ns", kUid3, "c"}});
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

// A uid becomes part of the CDI spec's file name and of device and variable names: only what
// the API server gives (a UUID) gets that far, checked before anything is read or written.
TEST(DRADriverTest, UidThatIsNotAUuidIsRefusedBeforeAnyReadOrWrite) {
  DraNode n;
  for (const std::string& uid : std::vector<std::string>{
           "../../etc/cdi/evil", "x/../../y", "0c1a1e00-0000-4000-8000-00000000000g",
           "0c1a1e00000040008000000000000001", std::string(kUid1) + "0"}) {
    SCOPED_TRACE(uid);
    n.reader().Set(uid, std::vector<AllocatedDevice>{Dev(kHca0)});
    auto out = n.driver().Prepare({{"ns", uid, "c"}});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out.at(uid).status().code(), absl::StatusCode::kInvalidArgument) << out.at(uid).status();
    EXPECT_NE(out.at(uid).status().message().find("is not a UUID"), std::string::npos);
    EXPECT_EQ(n.driver().Unprepare({{"ns", uid, "c"}}).at(uid).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(n.reader().reads(), 0);
  EXPECT_TRUE(n.CdiFiles().empty());
  EXPECT_TRUE(n.driver().Prepared().empty());
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


// Two requests of one claim: a CDI device each, with exactly that request's HCAs and its own
// variables; a container using both (the default pod: one container using the claim whole) gets
// common variables naming both HCAs, from each device alike.
TEST(DRADriverTest, OneCdiDevicePerRequest) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0, "a"), Dev(kHca1, "b")});
  auto r = n.driver().Prepare({kClaim}).at(kClaim.uid);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<PreparedDevice>{{{"a"}, kNode, kHca0, Ids(kUid1, "a"), ""},
                                             {{"b"}, kNode, kHca1, Ids(kUid1, "b"), ""}}));
  EXPECT_EQ(SpecPaths(n, kUid1, "a"),
            (std::vector<std::string>{"/dev/infiniband/uverbs0", "/dev/infiniband/umad0",
                                      "/dev/infiniband/issm0", "/dev/infiniband/rdma_cm"}));
  EXPECT_EQ(SpecPaths(n, kUid1, "b"),
            (std::vector<std::string>{"/dev/infiniband/uverbs1", "/dev/infiniband/umad1",
                                      "/dev/infiniband/issm1", "/dev/infiniband/rdma_cm"}));
  const std::string a = OwnVariableSuffix(kUid1, "a");
  EXPECT_EQ(a, "0c1a1e00000040008000000000000001_a");
  const std::map<std::string, std::string> env_a = SpecEnv(n, kUid1, "a");
  EXPECT_EQ(env_a.at("NCCL_IB_HCA_" + a), "=mlx5_0");
  EXPECT_EQ(env_a.at("RDMA_HCA_NAMES_" + a), "mlx5_0");
  EXPECT_EQ(env_a.at("NCCL_IB_HCA"), "=mlx5_0,mlx5_1");
  EXPECT_EQ(SpecEnv(n, kUid1, "b").at("NCCL_IB_HCA"), "=mlx5_0,mlx5_1");
  EXPECT_EQ(SpecEnv(n, kUid1, "b").at("RDMA_HCA_NAMES_" + OwnVariableSuffix(kUid1, "b")),
            "mlx5_1");
}

// Each request used by a container of its own: each device's common variables name its HCA.
TEST(DRADriverTest, RequestsOfOneClaimInTwoContainers) {
  DraNode n;
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0, "left"), Dev(kHca1, "right")});
  n.reader().SetName(kUid1, "pair");
  const PodRef pod{"ns", "p", "pod-1"};
  n.reader().SetReserved(kUid1, {pod});
  n.reader().SetPod({pod, {{"l", {{"pair", "left"}}}, {"r", {{"pair", "right"}}}}});
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "pair"}}).at(kUid1).ok());
  EXPECT_EQ(SpecEnv(n, kUid1, "left").at("NCCL_IB_HCA"), "=mlx5_0");
  EXPECT_EQ(SpecEnv(n, kUid1, "right").at("NCCL_IB_HCA"), "=mlx5_1");
  EXPECT_EQ(SpecEnv(n, kUid1, "right").at("RDMA_HCA_PCI"), "0000:3a:00.0");
}

// One container using two claims (the GPU+HCA template used once per GPU): both claims' devices
// set common variables naming both HCAs, so whichever the runtime applies last is right.
TEST(DRADriverTest, ContainerWithTwoClaimsIsToldAboutBoth) {
  DraNode n;
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca1)});
  n.reader().SetName(kUid1, "gpu0-hca");
  n.reader().SetName(kUid2, "gpu1-hca");
  const PodRef pod{"ns", "trainer", "pod-1"};
  n.reader().SetReserved(kUid1, {pod});
  n.reader().SetReserved(kUid2, {pod});
  n.reader().SetPod({pod, {{"gpu-only", {{"gpus", ""}}}, {"trainer", {{"gpu0-hca", ""}, {"gpu1-hca", ""}}}}});
  auto out = n.driver().Prepare({{"ns", kUid1, "gpu0-hca"}, {"ns", kUid2, "gpu1-hca"}});
  ASSERT_TRUE(out.at(kUid1).ok()) << out.at(kUid1).status();
  ASSERT_TRUE(out.at(kUid2).ok()) << out.at(kUid2).status();
  for (const char* uid : {kUid1, kUid2}) {
    const auto env = SpecEnv(n, uid);
    EXPECT_EQ(env.at("NCCL_IB_HCA"), "=mlx5_0,mlx5_1") << uid;
    EXPECT_EQ(env.at("RDMA_HCA_NAMES"), "mlx5_0,mlx5_1") << uid;
  }
  EXPECT_EQ(SpecEnv(n, kUid1).at("RDMA_HCA_NAMES_" + OwnVariableSuffix(kUid1, "hca")), "mlx5_0");
  EXPECT_EQ(SpecEnv(n, kUid2).at("RDMA_HCA_NAMES_" + OwnVariableSuffix(kUid2, "hca")), "mlx5_1");
  EXPECT_EQ(n.reader().pod_reads(), 1);
  // The checkpoint keeps it: a spec re-written after a reboot says the same.
  const std::string before = ReadJson(n.cdi().PathOf(kUid1)).dump();
  std::filesystem::remove(n.cdi().PathOf(kUid1));
  n.reader().SetDown(true);
  n.NewDriver();
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "gpu0-hca"}}).at(kUid1).ok());
  EXPECT_EQ(ReadJson(n.cdi().PathOf(kUid1)).dump(), before);
}

// A request held by two containers that hold different sets: no value of the common variables
// is right for both, so its device sets none (each set keeps its own variables); the other
// request, held by one container, names that container's every HCA.
TEST(DRADriverTest, HoldersThatDisagreeGetNoCommonVariables) {
  DraNode n;
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0, "a"), Dev(kHca1, "b")});
  n.reader().SetName(kUid1, "x");
  const PodRef pod{"ns", "p", "pod-1"};
  n.reader().SetReserved(kUid1, {pod});
  n.reader().SetPod({pod, {{"only-a", {{"x", "a"}}}, {"all", {{"x", ""}}}}});
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "x"}}).at(kUid1).ok());
  const auto a = SpecEnv(n, kUid1, "a");
  EXPECT_EQ(a.count("NCCL_IB_HCA"), 0u);
  EXPECT_EQ(a.at("NCCL_IB_HCA_" + OwnVariableSuffix(kUid1, "a")), "=mlx5_0");
  EXPECT_EQ(SpecEnv(n, kUid1, "b").at("NCCL_IB_HCA"), "=mlx5_0,mlx5_1");
}

// A pod that cannot be read (no RBAC, a failing server) or is gone: the consumers are not
// known, so no common variables; the claim is prepared, its request's own variables set.
TEST(DRADriverTest, UnreadablePodMeansNoCommonVariables) {
  for (const absl::Status& error :
       {absl::PermissionDeniedError("pods is forbidden"), absl::NotFoundError("pods not found")}) {
    SCOPED_TRACE(error.ToString());
    DraNode n;
    n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
    n.reader().SetReserved(kUid1, {{"ns", "p", "pod-1"}});
    n.reader().SetPodError("pod-1", error);
    ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kUid1).ok());
    EXPECT_EQ(SpecEnv(n, kUid1).count("NCCL_IB_HCA"), 0u);
    EXPECT_EQ(SpecEnv(n, kUid1).at("NCCL_IB_HCA_" + OwnVariableSuffix(kUid1, "hca")), "=mlx5_0");
  }
}

// A Pod object whose containers use the claims named ("claim" or "claim/request", each claim in
// spec.resourceClaims under its own name) and set the variables named in their env.
struct TestContainer {
  std::string name;
  std::vector<std::string> uses;
  nlohmann::json env = nlohmann::json::array();
};
nlohmann::json PodObject(const PodRef& ref, const std::vector<TestContainer>& containers) {
  nlohmann::json pod = {{"metadata", {{"namespace", ref.ns}, {"name", ref.name}, {"uid", ref.uid}}}};
  std::set<std::string> claims;
  for (const TestContainer& c : containers) {
    nlohmann::json uses = nlohmann::json::array();
    for (const std::string& use : c.uses) {
      const std::size_t slash = use.find('/');
      const std::string claim = use.substr(0, slash);
      uses.push_back({{"name", claim}, {"request", slash == std::string::npos ? "" : use.substr(slash + 1)}});
      if (claims.insert(claim).second) {
        pod["spec"]["resourceClaims"].push_back({{"name", claim}, {"resourceClaimName", claim}});
      }
    }
    pod["spec"]["containers"].push_back(
        {{"name", c.name}, {"env", c.env}, {"resources", {{"claims", std::move(uses)}}}});
  }
  return pod;
}

const PodRef kFirst{"ns", "first", "pod-1"};
const PodRef kSecond{"ns", "second", "pod-2"};

// Claim "shared" (kUid1, mlx5_0) prepared for pod kFirst, whose one container uses it whole;
// then claim "own" (kUid2, mlx5_1) prepared for pod kSecond, which uses both: ReadPod answers
// kSecond with `second`.
void PrepareSharedThenOwn(DraNode& n, const nlohmann::json& second) {
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().SetName(kUid1, "shared");
  n.reader().SetReserved(kUid1, {kFirst});
  n.reader().SetPodObject(PodObject(kFirst, {{"c", {"shared"}}}));
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "shared"}}).at(kUid1).ok());
  EXPECT_EQ(SpecEnv(n, kUid1).at("NCCL_IB_HCA"), "=mlx5_0");

  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca1)});
  n.reader().SetName(kUid2, "own");
  n.reader().SetReserved(kUid1, {kFirst, kSecond});
  n.reader().SetReserved(kUid2, {kSecond});
  n.reader().SetPodObject(second);
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid2, "own"}}).at(kUid2).ok());
}

// A claim prepared for one pod, then used by a new pod's container beside another claim: the
// new claim's common variables name both; the old claim's, which named one, are withdrawn
// (its spec re-written) rather than left to win over the new ones.
TEST(DRADriverTest, SharedClaimWithdrawsCommonVariablesThatNoLongerHold) {
  DraNode n;
  ASSERT_NO_FATAL_FAILURE(PrepareSharedThenOwn(n, PodObject(kSecond, {{"c", {"shared", "own"}}})));
  EXPECT_EQ(SpecEnv(n, kUid2).at("NCCL_IB_HCA"), "=mlx5_0,mlx5_1");
  EXPECT_EQ(SpecEnv(n, kUid1).count("NCCL_IB_HCA"), 0u);
  EXPECT_EQ(SpecEnv(n, kUid1).at("NCCL_IB_HCA_" + OwnVariableSuffix(kUid1, "hca")), "=mlx5_0");
  EXPECT_TRUE(n.driver().Prepared().at(kUid1).common.empty());
}

// A variable the pod spec sets (a value, or from a ConfigMap key) is left to it: the runtime
// applies CDI's env after the pod spec's, so a common variable of ours would replace it. The
// others and the request's own variables stay; a restart that re-writes the spec from the
// checkpoint (the API server gone) leaves them out too.
TEST(DRADriverTest, APodSpecValueIsNotSetOver) {
  DraNode n;
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0), Dev(kHca1)});
  n.reader().SetName(kUid1, "mine");
  const PodRef pod{"ns", "p", "pod-1"};
  n.reader().SetReserved(kUid1, {pod});
  n.reader().SetPodObject(PodObject(
      pod, {{"c",
             {"mine"},
             {{{"name", "NCCL_IB_HCA"}, {"value", "=mlx5_1"}},
              {{"name", "RDMA_HCA_PCI"},
               {"valueFrom", {{"configMapKeyRef", {{"name", "nccl"}, {"key", "pci"}}}}}},
              {{"name", "NCCL_DEBUG"}, {"value", "INFO"}}}}}));
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "mine"}}).at(kUid1).ok());
  const std::string own = "_" + OwnVariableSuffix(kUid1, "hca");
  const std::map<std::string, std::string> want = {
      {"RDMA_HCA_NAMES", "mlx5_0,mlx5_1"},
      {"NCCL_IB_HCA" + own, "=mlx5_0,mlx5_1"},
      {"RDMA_HCA_NAMES" + own, "mlx5_0,mlx5_1"},
      {"RDMA_HCA_PCI" + own, "0000:1a:00.0,0000:3a:00.0"},
      {"UCX_NET_DEVICES", "mlx5_0:1,mlx5_1:1"},
      {"UCX_NET_DEVICES" + own, "mlx5_0:1,mlx5_1:1"}};
  EXPECT_EQ(SpecEnv(n, kUid1), want);
  std::filesystem::remove(n.cdi().PathOf(kUid1));
  n.reader().SetDown(true);
  n.NewDriver();
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "mine"}}).at(kUid1).ok());
  EXPECT_EQ(SpecEnv(n, kUid1), want);
}

// Only the holders' variables count: a container of the pod that does not hold the request sets
// NCCL_IB_HCA for itself, and the request's holder still gets ours.
TEST(DRADriverTest, AnotherContainersVariablesDoNotCount) {
  DraNode n;
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0, "a"), Dev(kHca1, "b")});
  n.reader().SetName(kUid1, "x");
  const PodRef pod{"ns", "p", "pod-1"};
  n.reader().SetReserved(kUid1, {pod});
  n.reader().SetPodObject(
      PodObject(pod, {{"left", {"x/a"}, {{{"name", "NCCL_IB_HCA"}, {"value", "=mlx5_9"}}}},
                      {"right", {"x/b"}}}));
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "x"}}).at(kUid1).ok());
  EXPECT_EQ(SpecEnv(n, kUid1, "a").count("NCCL_IB_HCA"), 0u);
  EXPECT_EQ(SpecEnv(n, kUid1, "a").at("RDMA_HCA_NAMES"), "mlx5_0");
  EXPECT_EQ(SpecEnv(n, kUid1, "b").at("NCCL_IB_HCA"), "=mlx5_1");
}

// A claim prepared for one pod, then held by a container of a new pod (prepared for its other
// claim) that sets NCCL_IB_HCA itself: the shared claim's spec is re-written without it.
TEST(DRADriverTest, ANewHolderOfASharedClaimKeepsItsOwnValue) {
  DraNode n;
  ASSERT_NO_FATAL_FAILURE(PrepareSharedThenOwn(
      n, PodObject(kSecond, {{"reader", {"shared"}, {{{"name", "NCCL_IB_HCA"}, {"value", "=mlx5_0:1"}}}},
                             {"writer", {"own"}}})));
  EXPECT_EQ(SpecEnv(n, kUid2).at("NCCL_IB_HCA"), "=mlx5_1");
  EXPECT_EQ(SpecEnv(n, kUid1).count("NCCL_IB_HCA"), 0u);
  EXPECT_EQ(SpecEnv(n, kUid1).at("RDMA_HCA_NAMES"), "mlx5_0");
}

// A claim prepared by a version with one CDI device per claim (checkpoint version 1): the kubelet
// holds that device's ID, so the claim keeps it (answer and re-written spec) until unprepared.
TEST(DRADriverTest, ClaimFromAVersionOneCheckpointKeepsItsClaimDevice) {
  DraNode n;
  const std::string legacy_id = LegacyCdiDeviceId(kDriver, kUid1);
  nlohmann::json cp = {{"version", 1},
                       {"claims",
                        {{kUid1,
                          {{"namespace", "ns"},
                           {"name", "old"},
                           {"devices", {{{"request", "hca"}, {"pool", kNode}, {"device", kHca0}},
                                        {{"request", "hca"}, {"pool", kNode}, {"device", kHca1}}}},
                           {"cdiDeviceIds", {legacy_id}}}}}}};
  std::filesystem::create_directories(n.plugin_dir());
  std::ofstream(n.checkpoint_path(), std::ios::trunc) << cp.dump();
  n.reader().SetDown(true);
  n.NewDriver();
  auto r = n.driver().Prepare({{"ns", kUid1, "old"}}).at(kUid1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<PreparedDevice>{{{"hca"}, kNode, kHca0, {legacy_id}, ""},
                                             {{"hca"}, kNode, kHca1, {legacy_id}, ""}}));
  const nlohmann::json spec = ReadJson(n.cdi().PathOf(kUid1));
  ASSERT_EQ(spec["devices"].size(), 1u);
  EXPECT_EQ(spec["devices"][0]["name"], kUid1);
  EXPECT_EQ(ReadJson(n.checkpoint_path())["claims"][kUid1]["layout"], "claim");
}

}  // namespace
}  // namespace rdp::dra
