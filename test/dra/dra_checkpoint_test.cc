#include "dra/checkpoint.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "test/support/temp_dir.h"

namespace rdp::dra {
namespace {

PreparedClaims Two() {
  PreparedClaims c;
  c["uid-1"] = {{"ns", "uid-1", "claim-1"},
                {{"hca", "node-a", "hca-0000-1a-00-0", ""},
                 {"hca/x", "node-a", "hca-0000-3a-00-0", "share-1"}},
                {{"hca", {"hca-0000-1a-00-0", "hca-0000-3a-00-0", "hca-0000-9a-00-0"}}},
                false,
                {{"hca", {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"}}}};
  c["uid-1"].pod_claim_name = "hcas";
  c["uid-2"] = {{"other", "uid-2", "claim-2"}, {{"r", "node-a", "hca-0000-9a-00-0", ""}}, {}, true};
  return c;
}

bool Same(const PreparedClaims& a, const PreparedClaims& b) { return a == b; }

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

TEST(DRACheckpointTest, NoFileIsEmpty) {
  rdp::testing::TempDir dir;
  Checkpoint cp(dir.Sub("p/checkpoint.json"));
  auto loaded = cp.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->empty());
}

TEST(DRACheckpointTest, RoundTrip) {
  rdp::testing::TempDir dir;
  Checkpoint cp(dir.Sub("p/checkpoint.json"));  // the directory is created
  ASSERT_TRUE(cp.Save(Two()).ok());
  auto loaded = Checkpoint(dir.Sub("p/checkpoint.json")).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(Same(*loaded, Two()));
  EXPECT_EQ(Files(dir.Sub("p")), std::vector<std::string>{"checkpoint.json"});  // no temp left
  ASSERT_TRUE(cp.Save({}).ok());
  EXPECT_TRUE(cp.Load()->empty());
}

TEST(DRACheckpointTest, PodClaimNameIsKeptAndAbsentInOlderFiles) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  ASSERT_TRUE(Checkpoint(path).Save(Two()).ok());
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["claims"]["uid-1"]["podClaimName"], "hcas");
  EXPECT_FALSE(j["claims"]["uid-2"].contains("podClaimName"));
  WriteText(path, R"({"version": 2, "claims": {"u": {"namespace": "ns", "name": "n",
      "devices": [{"request": "hca", "pool": "p", "device": "d"}], "podClaimName": 7}}})");
  auto loaded = Checkpoint(path).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->empty()) << "a podClaimName that is not a string makes the entry bad";
}

// Admin access is recorded per device ("adminAccess": true), so that a restarted driver keeps
// the claim out of every holder's accounting; a device without the key (every file written before
// it) is an ordinary one, and a key that is not a boolean makes the entry bad.
TEST(DRACheckpointTest, AdminAccessIsKeptAndAbsentInOlderFiles) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  PreparedClaims claims = Two();
  claims["uid-3"] = {{"ops", "uid-3", "monitor"}, {{"hca", "node-a", "hca-0000-1a-00-0", "", true}}};
  ASSERT_TRUE(Checkpoint(path).Save(claims).ok());
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["claims"]["uid-3"]["devices"][0]["adminAccess"], true);
  EXPECT_FALSE(j["claims"]["uid-1"]["devices"][0].contains("adminAccess"));
  auto loaded = Checkpoint(path).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(Same(*loaded, claims));
  EXPECT_TRUE(loaded->at("uid-3").devices[0].admin_access);
  EXPECT_FALSE(loaded->at("uid-1").devices[0].admin_access);
  WriteText(path, R"({"version": 2, "claims": {"u": {"namespace": "ns", "name": "n",
      "devices": [{"request": "hca", "pool": "p", "device": "d", "adminAccess": "yes"}]}}})");
  loaded = Checkpoint(path).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->empty()) << "an adminAccess that is not a boolean makes the entry bad";
}

// A shared device's shareID and consumed capacity are kept per device, so that a restarted
// driver knows what each claim was allocated; a device without them (exclusive mode, files
// written before) has none, and a consumedCapacity that is not an object of strings makes the
// entry bad.
TEST(DRACheckpointTest, ShareIdAndConsumedCapacityAreKept) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  PreparedClaims claims = Two();
  AllocatedDevice shared{"hca", "node-a", "hca-0000-1a-00-0",
                         "0a1b2c3d-0000-4000-8000-000000000001"};
  shared.consumed_capacity = {{"bandwidthGbps", "100"}, {"pods", "1"}};
  claims["uid-3"] = {{"ns", "uid-3", "trainer"}, {shared}};
  ASSERT_TRUE(Checkpoint(path).Save(claims).ok());
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["claims"]["uid-3"]["devices"][0]["consumedCapacity"],
            nlohmann::json({{"bandwidthGbps", "100"}, {"pods", "1"}}));
  EXPECT_EQ(j["claims"]["uid-3"]["devices"][0]["shareID"], shared.share_id);
  EXPECT_FALSE(j["claims"]["uid-1"]["devices"][0].contains("consumedCapacity"));
  auto loaded = Checkpoint(path).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(Same(*loaded, claims));
  EXPECT_EQ(loaded->at("uid-3").devices[0], shared);
  for (const char* bad : {R"("100")", R"({"pods": 1})"}) {
    WriteText(path, std::string(R"({"version": 2, "claims": {"u": {"namespace": "ns", "name": "n",
        "devices": [{"request": "hca", "pool": "p", "device": "d", "consumedCapacity": )") +
                        bad + "}]}}}");
    loaded = Checkpoint(path).Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->empty()) << "consumedCapacity " << bad << " makes the entry bad";
  }
}

TEST(DRACheckpointTest, NotJsonIsMovedAsideAndStartsEmpty) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  WriteText(path, "{\"version\": 1, \"claims\": {\"uid-1\": ");  // torn
  auto loaded = Checkpoint(path).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->empty());
  const auto files = Files(dir.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].rfind("checkpoint.json.corrupt-", 0), 0u) << files[0];
  std::ifstream in(dir.Sub(files[0]));
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "{\"version\": 1, \"claims\": {\"uid-1\": ");  // nothing lost
}

TEST(DRACheckpointTest, ABadEntryKeepsTheGoodOnesAndTheFileAside) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  Checkpoint cp(path);
  ASSERT_TRUE(cp.Save(Two()).ok());
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  j["claims"]["uid-2"].erase("namespace");
  WriteText(path, j.dump());
  auto loaded = cp.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ(loaded->begin()->first, "uid-1");
  EXPECT_EQ(loaded->begin()->second.devices.size(), 2u);
  const auto files = Files(dir.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].find(".corrupt-"), std::string::npos);
}

// A version 1 file (one CDI device per claim) is read as such claims.
TEST(DRACheckpointTest, VersionOneEntriesAreClaimLayout) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  WriteText(path, R"({"version": 1, "claims": {"u": {"namespace": "ns", "name": "c",
      "devices": [{"request": "hca", "pool": "p", "device": "d"}],
      "cdiDeviceIds": ["rdma.example.com/hca=u"]}}})");
  Checkpoint cp(path);
  auto loaded = cp.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_TRUE(loaded->at("u").legacy);
  EXPECT_EQ(loaded->at("u").devices.size(), 1u);
  ASSERT_TRUE(cp.Save(*loaded).ok());
  auto again = cp.Load();
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(Same(*again, *loaded));
}

// A version 2 file written before podEnv: its claims load with no names, and the file is kept.
TEST(DRACheckpointTest, AFileWithoutPodEnvLoads) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  WriteText(path, R"({"version": 2, "claims": {"u": {"namespace": "ns", "name": "c",
      "devices": [{"request": "hca", "pool": "p", "device": "d"}],
      "common": {"hca": ["d"]}}}})");
  auto loaded = Checkpoint(path).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ(loaded->at("u").common.at("hca"), std::vector<std::string>{"d"});
  EXPECT_TRUE(loaded->at("u").pod_env.empty());
  EXPECT_EQ(Files(dir.path()), std::vector<std::string>{"checkpoint.json"});  // not set aside
}

TEST(DRACheckpointTest, AMalformedPodEnvIsABadEntry) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  WriteText(path, R"({"version": 2, "claims": {"u": {"namespace": "ns", "name": "c",
      "devices": [{"request": "hca", "pool": "p", "device": "d"}],
      "podEnv": {"hca": "NCCL_IB_HCA"}}}})");
  auto loaded = Checkpoint(path).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->empty());
  EXPECT_FALSE(std::filesystem::exists(path));  // moved aside
}

TEST(DRACheckpointTest, OtherVersionIsMovedAside) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("checkpoint.json");
  WriteText(path, R"({"version": 3, "claims": {}})");
  auto loaded = Checkpoint(path).Load();
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(loaded->empty());
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace rdp::dra
