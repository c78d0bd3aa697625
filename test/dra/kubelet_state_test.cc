#include "dra/kubelet_state.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "dra/driver.h"
#include "gtest/gtest.h"
#include "test/dra/dra_node.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::Dev;
using testing::kDriver;
using testing::kHca0;
using testing::kHca1;
using testing::kUid1;
using testing::kUid2;
using testing::kUid3;

// A ClaimInfoStateList entry as the kubelet writes it, for `drivers`.
nlohmann::json KubeletClaim(const std::string& uid, const std::string& name,
                            const std::vector<std::string>& drivers) {
  nlohmann::json state = nlohmann::json::object();
  for (const std::string& d : drivers) {
    state[d] = {{"Devices",
                 {{{"PoolName", "node-a"}, {"DeviceName", "hca-x"}, {"ShareID", nullptr},
                   {"RequestNames", {"hca"}}, {"CDIDeviceIDs", {d + "/hca=" + uid + "-hca"}}}}}};
  }
  return {{"ClaimUID", uid},
          {"ClaimName", name},
          {"Namespace", "ns"},
          {"PodUIDs", {{"5a1b2c3d-0000-4000-8000-00000000000a", nlohmann::json::object()}}},
          {"DriverState", state}};
}

struct KubeletFile {
  nlohmann::json list = nullptr;  // ClaimInfoStateList (null: the kubelet holds none)
  std::string api_version = "checkpoint.dra.kubelet.k8s.io/v1";
  bool corrupt_checksum = false;
};

// Writes `f` at `path` in the kubelet's format, modified at `mtime`.
void WriteKubeletState(const std::string& path, const KubeletFile& f, absl::Time mtime) {
  const std::string data =
      nlohmann::json{{"kind", "DRACheckpoint"}, {"apiVersion", f.api_version},
                     {"ClaimInfoStateList", f.list}}
          .dump();
  std::uint32_t checksum = Crc32Ieee(data);
  if (f.corrupt_checksum) checksum ^= 1;
  std::ofstream(path, std::ios::trunc) << nlohmann::json{{"Data", data}, {"Checksum", checksum}}.dump();
  const timespec times[2] = {absl::ToTimespec(mtime), absl::ToTimespec(mtime)};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

TEST(DRAKubeletStateTest, Crc32IsIeee) {
  EXPECT_EQ(Crc32Ieee("123456789"), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(Crc32Ieee(""), 0u);
}

TEST(DRAKubeletStateTest, ListsTheClaimsOfOurDriver) {
  DraNode n;
  const std::string path = n.root() + "/" + kKubeletDraStateFile;
  const absl::Time mtime = absl::FromUnixSeconds(1'800'000'000);
  WriteKubeletState(path,
                    {nlohmann::json::array({KubeletClaim(kUid1, "a", {kDriver, "gpu.example.com"}),
                                            KubeletClaim(kUid2, "b", {"gpu.example.com"}),
                                            KubeletClaim(kUid3, "c", {kDriver})})},
                    mtime);
  absl::StatusOr<KubeletClaims> got = ReadKubeletClaims(path, kDriver);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->uids, (std::set<std::string>{kUid1, kUid3}));
  EXPECT_EQ(got->written, mtime);
  EXPECT_EQ(got->path, path);

  WriteKubeletState(path, {}, mtime);  // ClaimInfoStateList null: the kubelet's empty checkpoint
  got = ReadKubeletClaims(path, kDriver);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->uids.empty());
}

TEST(DRAKubeletStateTest, FilesThatCannotBeTrustedAreErrorsNamingThePath) {
  DraNode n;
  const std::string path = n.root() + "/" + kKubeletDraStateFile;
  const nlohmann::json list = nlohmann::json::array({KubeletClaim(kUid1, "a", {kDriver})});
  const absl::Time mtime = absl::Now();
  struct Case {
    const char* what;
    std::function<void()> write;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"absent", [&] { std::filesystem::remove(path); }, absl::StatusCode::kNotFound},
      {"bad checksum", [&] { WriteKubeletState(path, {list, "checkpoint.dra.kubelet.k8s.io/v1", true}, mtime); },
       absl::StatusCode::kDataLoss},
      {"unknown apiVersion", [&] { WriteKubeletState(path, {list, "checkpoint.dra.kubelet.k8s.io/v2"}, mtime); },
       absl::StatusCode::kUnimplemented},
      {"format before 1.32",
       [&] { std::ofstream(path, std::ios::trunc) << R"({"version":"v1","entries":[],"checksum":1})"; },
       absl::StatusCode::kUnimplemented},
      {"not JSON", [&] { std::ofstream(path, std::ios::trunc) << "{\"Data\":"; }, absl::StatusCode::kDataLoss},
      {"a directory", [&] { std::filesystem::remove(path); std::filesystem::create_directory(path); },
       absl::StatusCode::kInternal},
  };
  for (const Case& c : cases) {
    c.write();
    absl::StatusOr<KubeletClaims> got = ReadKubeletClaims(path, kDriver);
    EXPECT_EQ(got.status().code(), c.code) << c.what << ": " << got.status();
    EXPECT_NE(got.status().message().find(path), std::string::npos) << c.what << ": " << got.status();
    std::filesystem::remove_all(path);
  }
}

// Prepares kUid1 (kHca0), kUid2 and kUid3 (kHca1) through the driver.
void PrepareThree(DraNode& n) {
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca1)});
  n.reader().Set(kUid3, std::vector<AllocatedDevice>{Dev(kHca1)});
  const auto r = n.driver().Prepare({{"ns", kUid1, "a"}, {"ns", kUid2, "b"}, {"ns", kUid3, "c"}});
  for (const char* uid : {kUid1, kUid2, kUid3}) ASSERT_TRUE(r.at(uid).ok()) << uid;
}

std::set<std::string> PreparedUids(DraNode& n) {
  std::set<std::string> out;
  for (const auto& [uid, c] : n.driver().Prepared()) out.insert(uid);
  return out;
}

std::set<std::string> SpecUids(DraNode& n) {
  std::set<std::string> out;
  for (const char* uid : {kUid1, kUid2, kUid3}) {
    if (std::filesystem::exists(n.cdi().PathOf(uid))) out.insert(uid);
  }
  return out;
}

class RecordingStatusWriter : public ClaimStatusWriter {
 public:
  void Set(const ClaimRef& ref, std::vector<nlohmann::json> devices) override {
    calls.emplace_back(ref.uid, devices.size());
  }
  std::vector<std::pair<std::string, std::size_t>> calls;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The regression test of "reconcile against what the kubelet still holds": before it, a claim
// the kubelet had forgotten kept its spec and checkpoint entry for ever.
TEST(DRADriverTest, StartUnpreparesClaimsTheKubeletForgot) {
  DraNode n;
  PrepareThree(n);
  const std::string spec2 = ReadFile(n.cdi().PathOf(kUid2));
  // The kubelet lost its state and rebuilt it (a restart after its state file was wiped): it
  // holds kUid2 now; kUid3 only for another driver.
  const std::string path = n.root() + "/" + kKubeletDraStateFile;
  WriteKubeletState(path,
                    {nlohmann::json::array({KubeletClaim(kUid2, "b", {kDriver}),
                                            KubeletClaim(kUid3, "c", {"gpu.example.com"})})},
                    absl::Now() + absl::Hours(1));
  RecordingStatusWriter status;
  n.SetStatusWriter(&status);
  n.SetKubeletState(path);
  n.NewDriver();

  EXPECT_EQ(PreparedUids(n), (std::set<std::string>{kUid2}));
  EXPECT_EQ(SpecUids(n), (std::set<std::string>{kUid2}));
  EXPECT_EQ(ReadFile(n.cdi().PathOf(kUid2)), spec2);
  EXPECT_EQ(n.driver().UnpreparedAtStart(), 2);
  // Our entries of their status.devices go too.
  EXPECT_EQ(status.calls, (std::vector<std::pair<std::string, std::size_t>>{{kUid1, 0}, {kUid3, 0}}));
  // ... and from the checkpoint on disk: a second start finds nothing to do.
  n.NewDriver();
  EXPECT_EQ(PreparedUids(n), (std::set<std::string>{kUid2}));
  EXPECT_EQ(n.driver().UnpreparedAtStart(), 0);
}

TEST(DRADriverTest, StartKeepsClaimsPreparedAfterTheKubeletsLastWrite) {
  DraNode n;
  const std::string path = n.root() + "/" + kKubeletDraStateFile;
  // The kubelet's file, last written before the prepares (a driver that crashed right after
  // answering: a kubelet may record the claim after our answer).
  WriteKubeletState(path, {nlohmann::json::array({KubeletClaim(kUid2, "b", {kDriver})})},
                    absl::Now() - absl::Hours(1));
  PrepareThree(n);
  n.SetKubeletState(path);
  n.NewDriver();
  EXPECT_EQ(PreparedUids(n), (std::set<std::string>{kUid1, kUid2, kUid3}));
  EXPECT_EQ(SpecUids(n), (std::set<std::string>{kUid1, kUid2, kUid3}));
  EXPECT_EQ(n.driver().UnpreparedAtStart(), 0);
}

TEST(DRADriverTest, StartUnpreparesNothingWhenTheKubeletsFileCannotBeTrusted) {
  DraNode n;
  PrepareThree(n);
  const std::string path = n.root() + "/" + kKubeletDraStateFile;
  const absl::Time later = absl::Now() + absl::Hours(1);
  const nlohmann::json none = nlohmann::json::array();
  const std::vector<std::pair<const char*, std::function<void()>>> cases = {
      {"absent", [&] { std::filesystem::remove(path); }},
      {"bad checksum", [&] { WriteKubeletState(path, {none, "checkpoint.dra.kubelet.k8s.io/v1", true}, later); }},
      {"unknown version", [&] { WriteKubeletState(path, {none, "checkpoint.dra.kubelet.k8s.io/v9"}, later); }},
      {"unreadable", [&] { std::filesystem::remove(path); std::filesystem::create_directory(path); }},
  };
  n.SetKubeletState(path);
  for (const auto& [what, write] : cases) {
    write();
    n.NewDriver();
    EXPECT_EQ(PreparedUids(n), (std::set<std::string>{kUid1, kUid2, kUid3})) << what;
    EXPECT_EQ(SpecUids(n), (std::set<std::string>{kUid1, kUid2, kUid3})) << what;
    std::filesystem::remove_all(path);
  }
}

// Claims in a checkpoint written before "preparedAt" was: prepared no later than the file.
TEST(DRADriverTest, ClaimWithoutATimeOfPrepareWasPreparedBeforeItsCheckpointWasWritten) {
  DraNode n;
  PrepareThree(n);
  nlohmann::json cp = nlohmann::json::parse(ReadFile(n.checkpoint_path()));
  for (auto& [uid, entry] : cp["claims"].items()) entry.erase("preparedAt");
  std::ofstream(n.checkpoint_path(), std::ios::trunc) << cp.dump();
  const absl::Time ours = absl::FromUnixSeconds(1'800'000'000);
  const timespec times[2] = {absl::ToTimespec(ours), absl::ToTimespec(ours)};
  ASSERT_EQ(::utimensat(AT_FDCWD, n.checkpoint_path().c_str(), times, 0), 0);
  const std::string path = n.root() + "/" + kKubeletDraStateFile;
  // Written before our checkpoint: kept.
  WriteKubeletState(path, {nlohmann::json::array({KubeletClaim(kUid2, "b", {kDriver})})},
                    ours - absl::Seconds(1));
  n.SetKubeletState(path);
  n.NewDriver();
  EXPECT_EQ(PreparedUids(n), (std::set<std::string>{kUid1, kUid2, kUid3}));
  // The time was recorded as the checkpoint's; written after it: unprepared.
  EXPECT_EQ(n.driver().Prepared().at(kUid1).prepared_at, ours);
  WriteKubeletState(path, {nlohmann::json::array({KubeletClaim(kUid2, "b", {kDriver})})},
                    ours + absl::Seconds(1));
  n.NewDriver();
  EXPECT_EQ(PreparedUids(n), (std::set<std::string>{kUid2}));
}

// A kubelet that lost its state asks again for a claim we hold: that answer is its new time of
// prepare (a kubelet that records claims after the answer has not recorded it yet).
TEST(DRADriverTest, AnsweringAgainRenewsTheTimeOfPrepare) {
  DraNode n;
  PrepareThree(n);
  const absl::Time first = n.driver().Prepared().at(kUid1).prepared_at;
  absl::Time last = first;
  for (const auto& [uid, c] : n.driver().Prepared()) last = std::max(last, c.prepared_at);
  // The kubelet's file, written after the three prepares, lists none of them.
  const std::string path = n.root() + "/" + kKubeletDraStateFile;
  WriteKubeletState(path, {nlohmann::json::array()}, last + absl::Nanoseconds(1));
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "a"}}).at(kUid1).ok());
  EXPECT_GT(n.driver().Prepared().at(kUid1).prepared_at, first);
  n.SetKubeletState(path);
  n.NewDriver();
  EXPECT_EQ(PreparedUids(n), (std::set<std::string>{kUid1}));
}

}  // namespace
}  // namespace rdp::dra
