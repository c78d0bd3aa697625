// Our entries of a claim's status.devices (dra/claim_status.h): the merge that keeps other
// drivers' entries, the read-modify-write against an in-memory API server, and the writing
// thread's retries.

#include "dra/claim_status.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/dra/fake_api.h"

namespace rdp::dra {
namespace {

using ::rdp::dra::testing::FakeApiServer;
using ::rdp::kube::testing::FakeClock;
using ::testing::HasSubstr;

constexpr char kDriver[] = "rdma.example.com";
constexpr char kUid[] = "0c1a1e00-0000-4000-8000-000000000001";
const ClaimRef kRef{"ns", kUid, "claim-1"};

nlohmann::json Entry(const std::string& driver, const std::string& device) {
  return {{"driver", driver}, {"pool", "node-a"}, {"device", device}};
}

nlohmann::json Ours(const std::string& device) {
  nlohmann::json e = Entry(kDriver, device);
  e["data"] = {{"hcaName", "mlx5_0"}};
  e["networkData"] = {{"interfaceName", "ens1f0np0"}, {"hardwareAddress", "02:00:1a:00:00:00"}};
  return e;
}

const nlohmann::json kGpu = Entry("gpu.example.com", "gpu-0");

TEST(DRAClaimStatusTest, MergeReplacesOnlyOurDriversEntries) {
  const nlohmann::json current = {kGpu, Entry(kDriver, "hca-old"),
                                  Entry("net.example.com", "eth-1")};
  EXPECT_EQ(MergeDeviceStatuses(current, kDriver, {Ours("hca-0"), Ours("hca-1")}),
            nlohmann::json::array({kGpu, Entry("net.example.com", "eth-1"), Ours("hca-0"), Ours("hca-1")}));
  // None of ours: the others stay, in their order.
  EXPECT_EQ(MergeDeviceStatuses(current, kDriver, {}),
            nlohmann::json::array({kGpu, Entry("net.example.com", "eth-1")}));
  // No list yet (or not a list): ours alone.
  EXPECT_EQ(MergeDeviceStatuses(nullptr, kDriver, {Ours("hca-0")}), nlohmann::json::array({Ours("hca-0")}));
  EXPECT_EQ(MergeDeviceStatuses("junk", kDriver, {}), nlohmann::json::array());
  // An entry without a driver is not ours: kept.
  EXPECT_EQ(MergeDeviceStatuses(nlohmann::json::array({{{"device", "x"}}}), kDriver, {}), nlohmann::json::array({{{"device", "x"}}}));
  EXPECT_EQ(DriverDeviceStatuses(current, kDriver), std::vector<nlohmann::json>{Entry(kDriver, "hca-old")});
}

class DRAClaimStatusWriterTest : public ::testing::Test {
 protected:
  DRAClaimStatusWriterTest() {
    server_.AddClaim(
        {{"apiVersion", "resource.k8s.io/v1"},
         {"kind", "ResourceClaim"},
         {"metadata", {{"namespace", "ns"}, {"name", "claim-1"}, {"uid", kUid}, {"resourceVersion", "7"}}},
         {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}},
         {"status",
          {{"allocation", {{"devices", {{"results", nlohmann::json::array({Entry(kDriver, "hca-0")})}}}}},
           {"devices", {kGpu, Entry(kDriver, "hca-stale")}}}}});
    auto transport = server_.NewTransport();
    requests_ = static_cast<kube::testing::FuncTransport*>(transport.get())->requests;
    kube::Client::Options client_options;
    client_options.clock = &clock_;  // the client's own retries do not sleep
    client_ = std::make_shared<kube::Client>(kube::Config{"https://fake"}, std::move(transport),
                                           client_options);
  }

  std::unique_ptr<ApiClaimStatusWriter> NewWriter() {
    ApiClaimStatusWriter::Options options;
    options.initial_backoff = absl::Milliseconds(1);
    options.max_backoff = absl::Milliseconds(4);
    return std::make_unique<ApiClaimStatusWriter>(client_, kDriver, options);
  }

  nlohmann::json Devices() { return server_.Claim("ns/claim-1")["status"].value("devices", nlohmann::json()); }

  // The PUTs sent so far.
  std::vector<kube::HttpRequest> Puts() {
    std::vector<kube::HttpRequest> out;
    for (const kube::HttpRequest& r : *requests_) {
      if (r.method == "PUT") out.push_back(r);
    }
    return out;
  }

  const absl::Time deadline_ = absl::InfiniteFuture();
  FakeClock clock_;
  FakeApiServer server_;
  std::shared_ptr<std::vector<kube::HttpRequest>> requests_;
  std::shared_ptr<kube::Client> client_;
};

TEST_F(DRAClaimStatusWriterTest, WriteReplacesOursKeepsTheOthersAndSendsTheVersionItRead) {
  auto writer = NewWriter();
  ASSERT_TRUE(writer->Write(kRef, {Ours("hca-0")}, deadline_).ok());
  EXPECT_EQ(Devices(), nlohmann::json::array({kGpu, Ours("hca-0")}));
  const std::vector<kube::HttpRequest> puts = Puts();
  ASSERT_EQ(puts.size(), 1u);
  EXPECT_EQ(puts[0].url,
            "https://fake/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim-1/status");
  const nlohmann::json body = nlohmann::json::parse(puts[0].body);
  EXPECT_EQ(body["metadata"]["resourceVersion"], "7");  // what the GET read
  EXPECT_EQ(body["metadata"]["uid"], kUid);
  EXPECT_EQ(body["status"]["devices"], nlohmann::json::array({kGpu, Ours("hca-0")}));
  EXPECT_EQ(body["status"]["allocation"]["devices"]["results"][0]["device"], "hca-0");

  // Already so: read, nothing sent.
  ASSERT_TRUE(writer->Write(kRef, {Ours("hca-0")}, deadline_).ok());
  EXPECT_EQ(Puts().size(), 1u);

  // Unprepare: ours go, the GPU driver's stays.
  ASSERT_TRUE(writer->Write(kRef, {}, deadline_).ok());
  EXPECT_EQ(Devices(), nlohmann::json::array({kGpu}));
}

TEST_F(DRAClaimStatusWriterTest, NoListLeftWhenOursWereTheOnlyEntries) {
  auto writer = NewWriter();
  nlohmann::json claim = server_.Claim("ns/claim-1");
  claim["status"]["devices"] = nlohmann::json::array({Ours("hca-0")});
  server_.AddClaim(claim);
  ASSERT_TRUE(writer->Write(kRef, {}, deadline_).ok());
  EXPECT_FALSE(server_.Claim("ns/claim-1")["status"].contains("devices"))
      << server_.Claim("ns/claim-1").dump();
}

TEST_F(DRAClaimStatusWriterTest, AConflictIsReadAgain) {
  auto writer = NewWriter();
  server_.FailNextUpdates(2);  // someone else wrote the claim twice since our GETs
  ASSERT_TRUE(writer->Write(kRef, {Ours("hca-0")}, deadline_).ok());
  EXPECT_EQ(Puts().size(), 3u);
  EXPECT_EQ(Devices(), nlohmann::json::array({kGpu, Ours("hca-0")}));

  server_.FailNextUpdates(100);
  const absl::Status s = writer->Write(kRef, {}, deadline_);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("conflicts 4 times"));
}

TEST_F(DRAClaimStatusWriterTest, AClaimGoneOrMadeAgainIsNotWritten) {
  auto writer = NewWriter();
  EXPECT_TRUE(absl::IsNotFound(writer->Write({"ns", kUid, "other"}, {Ours("hca-0")}, deadline_)));
  // The same name, another uid: deleted and created again; not ours to write.
  const absl::Status s =
      writer->Write({"ns", "0c1a1e00-0000-4000-8000-000000000009", "claim-1"}, {Ours("hca-0")}, deadline_);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(kUid));
  EXPECT_TRUE(Puts().empty());
}

TEST_F(DRAClaimStatusWriterTest, AServerThatDropsTheListIsNoticed) {
  auto writer = NewWriter();
  server_.DropClaimDeviceStatus(true);
  const absl::Status s = writer->Write(kRef, {Ours("hca-0")}, deadline_);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("DRAResourceClaimDeviceStatus"));
}

TEST_F(DRAClaimStatusWriterTest, TheThreadWritesRetriesAndTheLastSetWins) {
  auto writer = NewWriter();
  // Before Start: queued; the second Set replaces the first.
  writer->Set(kRef, {Ours("hca-x")});
  writer->Set(kRef, {Ours("hca-0")});
  server_.FailNextUpdates(4);  // the first write conflicts every time: retried after a back-off
  writer->Start();
  ASSERT_TRUE(writer->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(Devices(), nlohmann::json::array({kGpu, Ours("hca-0")}));
  EXPECT_EQ(writer->counts().successes, 1u);
  EXPECT_EQ(writer->counts().failures, 1u);
  EXPECT_EQ(Puts().size(), 5u);

  // The same entries again (the kubelet prepares the claim for a second pod): nothing sent.
  writer->Set(kRef, {Ours("hca-0")});
  ASSERT_TRUE(writer->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(requests_->size(), 10u);  // 5 GETs and 5 PUTs, as before

  writer->Set(kRef, {});
  ASSERT_TRUE(writer->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(Devices(), nlohmann::json::array({kGpu}));
  EXPECT_EQ(writer->counts().successes, 2u);
  writer->Stop();
}

TEST_F(DRAClaimStatusWriterTest, ARefusedWriteIsNotRetriedButTheNextSetTriesAgain) {
  auto writer = NewWriter();
  writer->Start();
  server_.FailNextClaimRequests(1, 403);  // an RBAC older than the driver
  writer->Set(kRef, {Ours("hca-0")});
  ASSERT_TRUE(writer->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(writer->counts().failures, 1u);
  EXPECT_EQ(requests_->size(), 1u);  // the GET refused; no retry
  EXPECT_EQ(Devices(), nlohmann::json::array({kGpu, Entry(kDriver, "hca-stale")}));
  // The claim's next prepare sets the same entries: they are not taken for written.
  writer->Set(kRef, {Ours("hca-0")});
  ASSERT_TRUE(writer->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(Devices(), nlohmann::json::array({kGpu, Ours("hca-0")}));
}

TEST_F(DRAClaimStatusWriterTest, StopDropsWhatIsPendingAndSetAfterStopIsIgnored) {
  auto writer = NewWriter();
  writer->Set(kRef, {Ours("hca-0")});
  writer->Stop();  // never started: nothing was written
  writer->Set(kRef, {Ours("hca-1")});
  EXPECT_TRUE(writer->WaitIdle(absl::Seconds(1)));
  EXPECT_TRUE(requests_->empty());
}

}  // namespace
}  // namespace rdp::dra
