#include "dra/claim_reader.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/dra/fake_api.h"

namespace rdp::dra {
namespace {

using ::rdp::dra::testing::FakeApiServer;
using ::rdp::kube::testing::FakeClock;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr char kDriver[] = "rdma.example.com";

nlohmann::json Result(const std::string& driver, const std::string& device) {
  return {{"request", "hca"}, {"driver", driver}, {"pool", "node-a"}, {"device", device}};
}

nlohmann::json Claim(nlohmann::json results) {
  nlohmann::json claim = {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"namespace", "team"}, {"name", "claim-1"}, {"uid", "uid-1"}}},
      {"spec", {{"devices", {{"requests", {{{"name", "hca"}}}}}}}},
  };
  if (!results.is_null()) claim["status"]["allocation"]["devices"]["results"] = std::move(results);
  return claim;
}

class DRAClaimReaderTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::vector<AllocatedDevice>> Read(const nlohmann::json& claim,
                                                    ClaimRef ref = {"team", "uid-1", "claim-1"}) {
    auto full = ReadClaim(claim, ref);
    if (!full.ok()) return full.status();
    return full->devices;
  }
  absl::StatusOr<ClaimAllocation> ReadClaim(const nlohmann::json& claim,
                                            ClaimRef ref = {"team", "uid-1", "claim-1"}) {
    if (!claim.is_null()) server_.AddClaim(claim);
    return Reader().Read(ref, kDriver, clock_.Now() + absl::Seconds(5));
  }
  ApiClaimReader Reader() {
    kube::Client::Options options;
    options.clock = &clock_;
    return ApiClaimReader(std::make_shared<kube::Client>(kube::Config{"https://fake"},
                                                       server_.NewTransport(), options));
  }

  FakeApiServer server_;
  FakeClock clock_;
};

TEST_F(DRAClaimReaderTest, KeepsOurResultsInOrder) {
  auto devices = Read(Claim({Result(kDriver, "hca-3"), Result("gpu.example.com", "gpu-0"),
                             Result(kDriver, "hca-1")}));
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_THAT(*devices, ElementsAre(AllocatedDevice{"hca", "node-a", "hca-3", ""},
                                    AllocatedDevice{"hca", "node-a", "hca-1", ""}));
}

TEST_F(DRAClaimReaderTest, AllocatedWithNothingOfOursIsEmpty) {
  // json::array: a braced list of one json is a copy of it to clang, an array to gcc.
  auto devices = Read(Claim(nlohmann::json::array({Result("gpu.example.com", "gpu-0")})));
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_TRUE(devices->empty());
  nlohmann::json no_results = Claim(nullptr);
  no_results["status"]["allocation"] = nlohmann::json::object();
  devices = Read(no_results);
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_TRUE(devices->empty());
}

TEST_F(DRAClaimReaderTest, UidMismatchIsNotFoundNamingBoth) {
  auto devices = Read(Claim(nlohmann::json::array({Result(kDriver, "hca-0")})),
                      {"team", "uid-old", "claim-1"});
  EXPECT_TRUE(absl::IsNotFound(devices.status())) << devices.status();
  EXPECT_THAT(devices.status().message(), HasSubstr("uid-old"));
  EXPECT_THAT(devices.status().message(), HasSubstr("uid-1"));
  EXPECT_THAT(devices.status().message(), HasSubstr("team/claim-1"));
}

TEST_F(DRAClaimReaderTest, MissingClaimIsNotFound) {
  auto devices = Read(nullptr);
  EXPECT_TRUE(absl::IsNotFound(devices.status())) << devices.status();
  EXPECT_THAT(devices.status().message(), HasSubstr("team/claim-1"));
}

TEST_F(DRAClaimReaderTest, NotAllocatedIsFailedPrecondition) {
  auto devices = Read(Claim(nullptr));
  EXPECT_TRUE(absl::IsFailedPrecondition(devices.status())) << devices.status();
  EXPECT_THAT(devices.status().message(), HasSubstr("not allocated"));
}

TEST_F(DRAClaimReaderTest, MalformedAllocationNamesTheField) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto& c) { c["status"]["allocation"] = "yes"; }, "status.allocation is not an object"},
      {[](auto& c) { c["status"]["allocation"]["devices"] = 1; }, "status.allocation.devices is"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"] = {{"x", 1}}; },
       "status.allocation.devices.results is not an array"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"][1] = 7; },
       "results[1] is not an object"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"][1].erase("pool"); },
       "results[1].pool is missing"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"][1]["device"] = 3; },
       "results[1].device is not a non-empty string"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"][1]["request"] = ""; },
       "results[1].request is not a non-empty string"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"][0].erase("driver"); },
       "results[0].driver is missing"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"][1]["adminAccess"] = "true"; },
       "results[1].adminAccess is not a boolean"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"][1]["shareID"] = 5; },
       "results[1].shareID is not a string"},
      {[](auto& c) { c["status"]["allocation"]["devices"]["results"][1]["consumedCapacity"] = "1"; },
       "results[1].consumedCapacity is not an object"},
      {[](auto& c) {
         c["status"]["allocation"]["devices"]["results"][1]["consumedCapacity"] = {{"pods", 1}};
       },
       "results[1].consumedCapacity[\"pods\"] is not a quantity string"},
      {[](auto& c) {
         c["status"]["allocation"]["devices"]["results"][1]["consumedCapacity"] = {
             {"bandwidthGbps", ""}};
       },
       "results[1].consumedCapacity[\"bandwidthGbps\"] is not a quantity string"},
  };
  for (const Case& c : cases) {
    nlohmann::json claim = Claim({Result("gpu.example.com", "gpu-0"), Result(kDriver, "hca-0")});
    c.edit(claim);
    auto devices = Read(claim);
    EXPECT_TRUE(absl::IsInvalidArgument(devices.status())) << c.field << ": " << devices.status();
    EXPECT_THAT(devices.status().message(), HasSubstr(c.field));
  }
}

TEST_F(DRAClaimReaderTest, OtherDriversResultsAreNotValidated) {
  nlohmann::json claim = Claim({Result("gpu.example.com", "gpu-0"), Result(kDriver, "hca-0")});
  claim["status"]["allocation"]["devices"]["results"][0].erase("pool");
  auto devices = Read(claim);
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_THAT(*devices, ElementsAre(AllocatedDevice{"hca", "node-a", "hca-0", ""}));
}

TEST_F(DRAClaimReaderTest, NameThatIsNotADnsNameIsRefusedUnsent) {
  auto devices = Read(nullptr, {"team", "uid-1", "../../nodes/x"});
  EXPECT_TRUE(absl::IsInvalidArgument(devices.status())) << devices.status();
  EXPECT_EQ(server_.counters().gets, 0);
}


TEST_F(DRAClaimReaderTest, UidShareIdAndReservedPods) {
  nlohmann::json claim = Claim(nlohmann::json::array({Result(kDriver, "hca-0")}));
  claim["status"]["allocation"]["devices"]["results"][0]["shareID"] = "5f0c";
  claim["status"]["reservedFor"] = {
      {{"resource", "pods"}, {"name", "trainer"}, {"uid", "p-1"}},
      {{"apiGroup", "example.com"}, {"resource", "pods"}, {"name", "not-a-pod"}, {"uid", "x"}},
      {{"resource", "pods"}, {"name", "second"}, {"uid", "p-2"}}};
  auto got = ReadClaim(claim);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->uid, "uid-1");
  EXPECT_THAT(got->devices, ElementsAre(AllocatedDevice{"hca", "node-a", "hca-0", "5f0c"}));
  ASSERT_EQ(got->reserved_for.size(), 2u);
  EXPECT_EQ(got->reserved_for[0].ns, "team");
  EXPECT_EQ(got->reserved_for[0].name, "trainer");
  EXPECT_EQ(got->reserved_for[1].uid, "p-2");
  EXPECT_EQ(got->pod_claim_name, std::nullopt);  // not made from a template
  // By name alone (no uid to check): a claim a container names.
  auto by_name = ReadClaim(nullptr, {"team", "", "claim-1"});
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(by_name->uid, "uid-1");
}

// KEP-5075: a shared device's result carries its shareID and what it consumes of each capacity,
// kept as the API server wrote the quantities; a result without them (an exclusive device, a
// control plane without DRAConsumableCapacity) has none.
TEST_F(DRAClaimReaderTest, ShareIdAndConsumedCapacityArePerResult) {
  nlohmann::json claim = Claim({Result(kDriver, "hca-0"), Result(kDriver, "hca-1")});
  auto& results = claim["status"]["allocation"]["devices"]["results"];
  results[0]["shareID"] = "0a1b2c3d-0000-4000-8000-000000000001";
  results[0]["consumedCapacity"] = {{"bandwidthGbps", "100"}, {"pods", "1"}};
  results[1]["shareID"] = nullptr;
  results[1]["consumedCapacity"] = nullptr;
  auto got = ReadClaim(claim);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->devices.size(), 2u);
  EXPECT_EQ(got->devices[0].share_id, "0a1b2c3d-0000-4000-8000-000000000001");
  EXPECT_THAT(got->devices[0].consumed_capacity,
              ElementsAre(Pair("bandwidthGbps", "100"), Pair("pods", "1")));
  EXPECT_EQ(got->devices[1].share_id, "");
  EXPECT_TRUE(got->devices[1].consumed_capacity.empty());
}

// KEP-5018: a result with adminAccess true is an admin device; false, null or no field (a control
// plane that drops it) is an ordinary one.
TEST_F(DRAClaimReaderTest, AdminAccessIsReadPerResult) {
  nlohmann::json claim = Claim({Result(kDriver, "hca-0"), Result(kDriver, "hca-1"),
                                Result(kDriver, "hca-2"), Result(kDriver, "hca-3")});
  auto& results = claim["status"]["allocation"]["devices"]["results"];
  results[0]["adminAccess"] = true;
  results[1]["adminAccess"] = false;
  results[2]["adminAccess"] = nullptr;
  auto devices = Read(claim);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 4u);
  EXPECT_TRUE((*devices)[0].admin_access);
  EXPECT_FALSE((*devices)[1].admin_access);
  EXPECT_FALSE((*devices)[2].admin_access);
  EXPECT_FALSE((*devices)[3].admin_access);
}

// KEP-5304's metadata path of a template's claim names it as the pod does: the annotation the
// resource-claim controller sets.
TEST_F(DRAClaimReaderTest, ATemplatesClaimSaysThePodsNameForIt) {
  nlohmann::json claim = Claim(nlohmann::json::array({Result(kDriver, "hca-0")}));
  claim["metadata"]["annotations"] = {{"resource.kubernetes.io/pod-claim-name", "hcas"},
                                      {"other", "x"}};
  auto got = ReadClaim(claim);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->pod_claim_name, "hcas");
}

// The claims each container uses: named claims, a template's claim through the pod's status
// (one not made: left out), the extended resource's request mappings, init containers too.
TEST_F(DRAClaimReaderTest, PodClaimsResolveNamesTemplatesAndExtendedResources) {
  const nlohmann::json pod = nlohmann::json::parse(R"({
    "metadata": {"namespace": "team", "name": "trainer", "uid": "p-1"},
    "spec": {
      "resourceClaims": [
        {"name": "hcas", "resourceClaimName": "shared-hcas"},
        {"name": "gpu-hca", "resourceClaimTemplateName": "gpu-with-hca"},
        {"name": "unmade", "resourceClaimTemplateName": "t"}],
      "initContainers": [{"name": "init", "resources": {"claims": [{"name": "hcas", "request": "a"}]}}],
      "containers": [
        {"name": "main", "resources": {"claims": [{"name": "hcas"}, {"name": "gpu-hca"},
                                                  {"name": "unmade"}, {"name": "undeclared"}]},
         "env": [{"name": "NCCL_IB_HCA", "value": "=mlx5_0"},
                 {"name": "NCCL_SOCKET_IFNAME", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                 {"value": "no name"}, "not an object"],
         "envFrom": [{"configMapRef": {"name": "nccl"}}]},
        {"name": "ext", "resources": {"limits": {"rdma/hca": "1"}}},
        {"name": "plain"}]},
    "status": {
      "resourceClaimStatuses": [{"name": "gpu-hca", "resourceClaimName": "trainer-gpu-hca-x7k2"},
                                {"name": "unmade"}],
      "extendedResourceClaimStatus": {"resourceClaimName": "trainer-extended-resources-abc",
        "requestMappings": [{"containerName": "ext", "resourceName": "rdma/hca",
                             "requestName": "container-1-request-0"}]}}})");
  const PodClaims got = ParsePodClaims(pod);
  EXPECT_EQ(got.pod.uid, "p-1");
  ASSERT_EQ(got.containers.size(), 4u);
  EXPECT_EQ(got.containers[0].name, "init");
  EXPECT_THAT(got.containers[0].uses, ElementsAre(ClaimUse{"shared-hcas", "a"}));
  EXPECT_EQ(got.containers[1].name, "main");
  EXPECT_THAT(got.containers[1].uses,
              ElementsAre(ClaimUse{"shared-hcas", ""}, ClaimUse{"trainer-gpu-hca-x7k2", ""}));
  // The names its env sets (envFrom's are in a ConfigMap, not in the pod).
  EXPECT_THAT(got.containers[1].env, ElementsAre("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"));
  EXPECT_TRUE(got.containers[0].env.empty());
  EXPECT_THAT(got.containers[2].uses,
              ElementsAre(ClaimUse{"trainer-extended-resources-abc", "container-1-request-0"}));
  EXPECT_TRUE(got.containers[3].uses.empty());
}

TEST_F(DRAClaimReaderTest, ReadPodChecksTheUid) {
  server_.AddPod({{"metadata", {{"namespace", "team"}, {"name", "p"}, {"uid", "p-2"}}}});
  ApiClaimReader reader = Reader();
  const absl::Time deadline = clock_.Now() + absl::Seconds(5);
  EXPECT_TRUE(reader.ReadPod({"team", "p", "p-2"}, deadline).ok());
  auto other = reader.ReadPod({"team", "p", "p-1"}, deadline);
  EXPECT_TRUE(absl::IsNotFound(other.status())) << other.status();
  EXPECT_TRUE(absl::IsNotFound(reader.ReadPod({"team", "q", "p-1"}, deadline).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(reader.ReadPod({"team", "../x", ""}, deadline).status()));
}

}  // namespace
}  // namespace rdp::dra
