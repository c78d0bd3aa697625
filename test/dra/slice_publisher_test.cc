#include "dra/slice_publisher.h"

#include "dra/slices.h"
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
using ::testing::_;

constexpr char kDriver[] = "rdma.example.com";
constexpr char kNode[] = "node-a";

std::vector<nlohmann::json> Devices(int n, const std::string& model = "cx7") {
  std::vector<nlohmann::json> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({{"name", "hca-" + std::to_string(i)},
                   {"attributes", {{"model", {{"string", model}}}}},
                   {"taints", nlohmann::json::array()}});  // empty: the server leaves it out
  }
  return out;
}

// Slices as the node side builds them: no owner, generation 1; the publisher sets both.
std::vector<nlohmann::json> Slices(const std::vector<nlohmann::json>& devices) {
  return BuildResourceSlices(devices, {kDriver, kNode, "", 1});
}

std::int64_t GenerationOf(const nlohmann::json& slice) {
  return slice["spec"]["pool"]["generation"].get<std::int64_t>();
}

class DRASlicePublisherTest : public ::testing::Test {
 protected:
  DRASlicePublisherTest() {
    server_.AddNode(kNode, "node-uid");
    kube::Client::Options options;
    options.clock = &clock_;
    // Watches get the events a test puts in `events_`, then the server ends them.
    auto stream = [this](const kube::HttpRequest& request, const std::function<void(int)>& on_open,
                         const std::function<bool(std::string_view)>& on_data)
        -> absl::StatusOr<kube::HttpResponse> {
      watches_.push_back(request.url);
      on_open(200);
      for (const auto& e : events_) {
        if (!on_data(e.dump() + "\n")) return absl::CancelledError("stopped");
      }
      kube::HttpResponse r;
      r.status = 200;
      return r;
    };
    publisher_ = std::make_unique<ApiSlicePublisher>(
        std::make_shared<kube::Client>(kube::Config{"https://fake"}, server_.NewTransport(stream),
                                     options),
        kDriver, kNode);
  }
  absl::Status Publish(const std::vector<nlohmann::json>& slices) {
    return publisher_->Publish(slices, clock_.Now() + absl::Seconds(10));
  }

  // Watch with the events in events_; the number of changes it reported.
  int WatchChanges() {
    int changes = 0;
    absl::Status s = publisher_->Watch([] { return false; }, [] {}, [&changes] { ++changes; });
    EXPECT_TRUE(s.ok()) << s;
    return changes;
  }

  FakeApiServer server_;
  FakeClock clock_;
  std::vector<nlohmann::json> events_;
  std::vector<std::string> watches_;
  std::unique_ptr<ApiSlicePublisher> publisher_;
};

TEST_F(DRASlicePublisherTest, FirstPublishCreatesGenerationOneOwnedByTheNode) {
  ASSERT_TRUE(Publish(Slices(Devices(70))).ok());
  const auto slices = server_.Slices(kNode);
  ASSERT_THAT(slices, ElementsAre(Pair("node-a-rdma.example.com-0", _),
                                  Pair("node-a-rdma.example.com-1", _)));
  for (const auto& [name, slice] : slices) {
    EXPECT_EQ(GenerationOf(slice), 1) << name;
    EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 2) << name;
    const auto& owner = slice["metadata"]["ownerReferences"][0];
    EXPECT_EQ(owner["kind"], "Node");
    EXPECT_EQ(owner["name"], kNode);
    EXPECT_EQ(owner["uid"], "node-uid");
    EXPECT_EQ(owner["controller"], true);
  }
  EXPECT_EQ(server_.counters().creates, 2);
}

TEST_F(DRASlicePublisherTest, PublishingTheSameDevicesAgainWritesNothing) {
  ASSERT_TRUE(Publish(Slices(Devices(70))).ok());
  const auto before = server_.Slices();
  const int writes = server_.counters().writes();
  ASSERT_TRUE(Publish(Slices(Devices(70))).ok());
  EXPECT_EQ(server_.counters().writes(), writes);
  EXPECT_EQ(server_.Slices(), before) << "no generation bump, no new resourceVersion";
}

TEST_F(DRASlicePublisherTest, ChangedDeviceBumpsTheGenerationOfEverySlice) {
  ASSERT_TRUE(Publish(Slices(Devices(70))).ok());
  auto changed = Devices(70);
  changed[69]["attributes"]["model"]["string"] = "cx8";  // only the second slice's devices
  ASSERT_TRUE(Publish(Slices(changed)).ok());
  for (const auto& [name, slice] : server_.Slices(kNode)) EXPECT_EQ(GenerationOf(slice), 2) << name;
  EXPECT_EQ(server_.Slices(kNode).at("node-a-rdma.example.com-1")["spec"]["devices"][5]
                ["attributes"]["model"]["string"],
            "cx8");
  ASSERT_TRUE(Publish(Slices(changed)).ok());
  for (const auto& [name, slice] : server_.Slices(kNode)) EXPECT_EQ(GenerationOf(slice), 2) << name;
}

TEST_F(DRASlicePublisherTest, GenerationContinuesFromWhatTheServerHolds) {
  auto old = Slices(Devices(2, "cx6"));
  old[0]["spec"]["pool"]["generation"] = 41;  // a previous run of the driver
  server_.AddSlice(old[0]);
  ASSERT_TRUE(Publish(Slices(Devices(2))).ok());
  EXPECT_EQ(GenerationOf(server_.Slices(kNode).at("node-a-rdma.example.com-0")), 42);
}

TEST_F(DRASlicePublisherTest, StaleSlicesAreDeletedOthersLeftAlone) {
  nlohmann::json stale = Slices(Devices(1))[0];
  stale["metadata"]["name"] = "node-a-old-name";
  stale["spec"]["pool"]["name"] = "old-pool";
  server_.AddSlice(stale);
  nlohmann::json other_driver = Slices(Devices(1))[0];
  other_driver["metadata"]["name"] = "node-a-gpu";
  other_driver["spec"]["driver"] = "gpu.example.com";
  server_.AddSlice(other_driver);
  nlohmann::json other_node = BuildResourceSlices(Devices(1), {kDriver, "node-b", "", 1})[0];
  server_.AddSlice(other_node);
  const auto untouched = server_.Slices();

  ASSERT_TRUE(Publish(Slices(Devices(70))).ok());
  ASSERT_TRUE(Publish(Slices(Devices(3))).ok());  // the pool shrinks to one slice
  const auto slices = server_.Slices();
  const std::string node_b = "node-b-rdma.example.com-0";
  EXPECT_THAT(slices, ElementsAre(Pair("node-a-gpu", untouched.at("node-a-gpu")),
                                  Pair("node-a-rdma.example.com-0", _),
                                  Pair(node_b, untouched.at(node_b))));
  EXPECT_EQ(GenerationOf(slices.at("node-a-rdma.example.com-0")), 2);
  EXPECT_EQ(slices.at("node-a-rdma.example.com-0")["spec"]["pool"]["resourceSliceCount"], 1);
}

TEST_F(DRASlicePublisherTest, NoDeviceDeletesThePool) {
  ASSERT_TRUE(Publish(Slices(Devices(70))).ok());
  ASSERT_TRUE(Publish({}).ok());
  EXPECT_TRUE(server_.Slices(kNode).empty());
}

TEST_F(DRASlicePublisherTest, TaintTimeTheServerStampedIsKept) {
  auto devices = Devices(2);
  devices[1]["taints"] = {{{"key", "rdma.example.com/unhealthy"}, {"effect", "NoSchedule"}}};
  ASSERT_TRUE(Publish(Slices(devices)).ok());
  const auto before = server_.Slices();
  EXPECT_EQ(before.begin()->second["spec"]["devices"][1]["taints"][0]["timeAdded"],
            "2026-12-04T10:00:00Z");
  const int writes = server_.counters().writes();
  ASSERT_TRUE(Publish(Slices(devices)).ok());
  EXPECT_EQ(server_.counters().writes(), writes) << "a stamped timeAdded is not a change";
  EXPECT_EQ(server_.Slices(), before);
}

// The API server stores quantities canonically: "1024Mi" comes back as "1Gi".
void CanonicalQuantities(nlohmann::json& slice) {
  for (auto& device : slice["spec"]["devices"]) {
    if (!device.contains("capacity")) continue;
    for (auto& [name, capacity] : device["capacity"].items()) {
      if (capacity["value"] == "1024Mi") capacity["value"] = "1Gi";
    }
  }
}

std::vector<nlohmann::json> WithMemory(std::vector<nlohmann::json> devices) {
  for (auto& d : devices) d["capacity"] = {{"memory", {{"value", "1024Mi"}}}};
  return devices;
}

TEST_F(DRASlicePublisherTest, ServerNormalisationIsNotAChange) {
  server_.SetNormalizer(CanonicalQuantities);
  ASSERT_TRUE(Publish(Slices(WithMemory(Devices(3)))).ok());
  EXPECT_EQ(server_.counters().writes(), 1) << "written once, then the list settles";
  const auto before = server_.Slices();
  ASSERT_TRUE(Publish(Slices(WithMemory(Devices(3)))).ok());
  EXPECT_EQ(server_.counters().writes(), 1);
  EXPECT_EQ(server_.Slices(), before);
}

TEST_F(DRASlicePublisherTest, RestartedPublisherRewritesANormalisedSliceOnce) {
  server_.SetNormalizer(CanonicalQuantities);
  ASSERT_TRUE(Publish(Slices(WithMemory(Devices(3)))).ok());
  kube::Client::Options options;
  options.clock = &clock_;
  ApiSlicePublisher restarted(
      std::make_shared<kube::Client>(kube::Config{"https://fake"}, server_.NewTransport(), options),
      kDriver, kNode);
  const absl::Time deadline = clock_.Now() + absl::Seconds(10);
  ASSERT_TRUE(restarted.Publish(Slices(WithMemory(Devices(3))), deadline).ok());
  EXPECT_EQ(server_.counters().writes(), 2) << "it cannot tell \"1Gi\" from \"1024Mi\" unaided";
  ASSERT_TRUE(restarted.Publish(Slices(WithMemory(Devices(3))), deadline).ok());
  EXPECT_EQ(server_.counters().writes(), 2);
  EXPECT_EQ(GenerationOf(server_.Slices(kNode).begin()->second), 2);
}

TEST_F(DRASlicePublisherTest, StampedTaintTimeAndNormalisationTogetherBumpOnce) {
  server_.SetNormalizer(CanonicalQuantities);
  auto devices = WithMemory(Devices(3));
  ASSERT_TRUE(Publish(Slices(devices)).ok());
  devices[2]["taints"] = {{{"key", "rdma.example.com/unhealthy"}, {"effect", "NoSchedule"}}};
  ASSERT_TRUE(Publish(Slices(devices)).ok());
  EXPECT_EQ(GenerationOf(server_.Slices(kNode).begin()->second), 2) << "one change, one bump";
  EXPECT_EQ(server_.counters().writes(), 2);
  ASSERT_TRUE(Publish(Slices(devices)).ok());
  EXPECT_EQ(server_.counters().writes(), 2);
}

TEST_F(DRASlicePublisherTest, ConflictStartsAnotherRound) {
  ASSERT_TRUE(Publish(Slices(Devices(3))).ok());
  server_.FailNextUpdates(1);  // someone else wrote the slice between our list and our update
  ASSERT_TRUE(Publish(Slices(Devices(3, "cx8"))).ok());
  const auto slice = server_.Slices(kNode).at("node-a-rdma.example.com-0");
  EXPECT_EQ(slice["spec"]["devices"][0]["attributes"]["model"]["string"], "cx8");
  EXPECT_EQ(GenerationOf(slice), 2);
  EXPECT_EQ(server_.counters().updates, 2) << "refused once, then written after a new list";
  EXPECT_EQ(server_.counters().lists, 5)
      << "first publish: 2 lists; second: conflict, write, equal";
}

TEST_F(DRASlicePublisherTest, EndlessConflictsAreAborted) {
  ASSERT_TRUE(Publish(Slices(Devices(3))).ok());
  server_.FailNextUpdates(100);
  const auto s = Publish(Slices(Devices(3, "cx8")));
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("still differ"));
}

TEST_F(DRASlicePublisherTest, ListsEveryPage) {
  server_.SetPageSize(1);
  ASSERT_TRUE(Publish(Slices(Devices(200))).ok());  // 4 slices
  const int writes = server_.counters().writes();
  ASSERT_TRUE(Publish(Slices(Devices(200))).ok());
  EXPECT_EQ(server_.counters().writes(), writes) << "every slice was seen, none re-created";
  EXPECT_EQ(server_.Slices(kNode).size(), 4u);
}

TEST_F(DRASlicePublisherTest, ForeignSliceIsRefused) {
  auto slices = BuildResourceSlices(Devices(1), {"gpu.example.com", kNode, "", 1});
  EXPECT_TRUE(absl::IsInvalidArgument(Publish(slices)));
  EXPECT_EQ(server_.counters().writes(), 0);
}

TEST_F(DRASlicePublisherTest, MissingNodeIsNotFound) {
  FakeApiServer empty;
  kube::Client::Options options;
  options.clock = &clock_;
  ApiSlicePublisher publisher(
      std::make_shared<kube::Client>(kube::Config{"https://fake"}, empty.NewTransport(), options),
      kDriver, kNode);
  const auto s = publisher.Publish(Slices(Devices(1)), clock_.Now() + absl::Seconds(1));
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("nodes"));
  EXPECT_EQ(empty.counters().writes(), 0);
}


TEST(DRADroppedFieldsTest, NamesWhatTheAnswerLacks) {
  const nlohmann::json sent = {
      {"spec",
       {{"driver", "d"},
        {"devices",
         {{{"name", "a"}, {"taints", {{{"key", "k"}}}}, {"allowMultipleAllocations", true}},
          {{"name", "b"}, {"attributes", {{"x", {{"int", 1}}}}}, {"taints", nlohmann::json::array()}}}}}}};
  nlohmann::json answer = sent;
  EXPECT_TRUE(DroppedFields(sent, answer).empty());
  answer["spec"]["devices"][0].erase("taints");
  answer["spec"]["devices"][0].erase("allowMultipleAllocations");
  answer["spec"]["devices"][1].erase("taints");  // sent empty: the server always leaves it out
  EXPECT_THAT(DroppedFields(sent, answer),
              ElementsAre("devices[].allowMultipleAllocations", "devices[].taints"));
  EXPECT_EQ(FeatureGateOf("devices[].taints"), "DRADeviceTaints");
  EXPECT_EQ(FeatureGateOf("devices[].allowMultipleAllocations"), "DRAConsumableCapacity");
  EXPECT_EQ(FeatureGateOf("devices[].something"), "");
}

// DRAConsumableCapacity off: the server keeps a capacity's value and drops its requestPolicy.
TEST(DRADroppedFieldsTest, NamesACapacitysDroppedRequestPolicy) {
  const nlohmann::json policy = {{"default", "0"}, {"validRange", {{"min", "0"}, {"step", "1"}}}};
  const nlohmann::json sent = {
      {"spec",
       {{"devices",
         {{{"name", "a"},
           {"capacity",
            {{"pods", {{"value", "1000"}, {"requestPolicy", policy}}},
             {"bandwidthGbps", {{"value", "400"}, {"requestPolicy", policy}}}}}}}}}}};
  nlohmann::json answer = sent;
  EXPECT_TRUE(DroppedFields(sent, answer).empty());
  answer["spec"]["devices"][0]["capacity"]["pods"].erase("requestPolicy");
  answer["spec"]["devices"][0]["capacity"]["bandwidthGbps"].erase("requestPolicy");
  EXPECT_THAT(DroppedFields(sent, answer), ElementsAre("devices[].capacity.requestPolicy"));
  EXPECT_EQ(FeatureGateOf("devices[].capacity.requestPolicy"), "DRAConsumableCapacity");
  answer["spec"]["devices"][0].erase("capacity");
  EXPECT_THAT(DroppedFields(sent, answer), ElementsAre("devices[].capacity"));
}

// A server with DRADeviceTaints and DRAConsumableCapacity off (1.34, 1.35 by default) stores the
// slices without those fields and answers with what it stored: each write's answer is compared
// with what was sent, each field counted and reported; the memo of what was written keeps the
// next publish from writing the same slice again and again.
TEST_F(DRASlicePublisherTest, FieldsTheServerDropsAreCountedAndReported) {
  server_.SetNormalizer([](nlohmann::json& slice) {
    for (auto& d : slice["spec"]["devices"]) {
      d.erase("taints");
      d.erase("allowMultipleAllocations");
      if (d.contains("capacity")) {
        for (auto& c : d["capacity"]) c.erase("requestPolicy");
      }
    }
  });
  std::vector<std::string> reported;
  publisher_->SetOnDropped([&reported](const std::string& field) { reported.push_back(field); });
  std::vector<nlohmann::json> devices = Devices(2);
  devices[0]["taints"] = {{{"key", "rdma.example.com/unhealthy"}, {"value", "PortNotActive"},
                           {"effect", "NoSchedule"}}};
  devices[1]["allowMultipleAllocations"] = true;
  devices[1]["capacity"] = {
      {"pods",
       {{"value", "1000"},
        {"requestPolicy", {{"default", "1"}, {"validRange", {{"min", "1"}, {"step", "1"}}}}}}}};
  ASSERT_TRUE(Publish(Slices(devices)).ok());
  EXPECT_THAT(reported,
              ElementsAre("allowMultipleAllocations", "capacity.requestPolicy", "taints"));
  EXPECT_THAT(publisher_->DroppedCounts(),
              ElementsAre(Pair("allowMultipleAllocations", 1), Pair("capacity.requestPolicy", 1),
                          Pair("taints", 1)));
  const int writes = server_.counters().writes();
  ASSERT_TRUE(Publish(Slices(devices)).ok());
  EXPECT_EQ(server_.counters().writes(), writes);
}

TEST(DRADroppedFieldsTest, RecognisesARefusedEffectNone) {
  EXPECT_TRUE(RefusesTaintEffectNone(absl::InvalidArgumentError(
      "PUT /apis/resource.k8s.io/v1/resourceslices/n-d-0: 422 Invalid: ResourceSlice."
      "resource.k8s.io \"n-d-0\" is invalid: spec.devices[3].taints[0].effect: Unsupported "
      "value: \"None\": supported values: \"NoExecute\", \"NoSchedule\"")));
  // Another field's unsupported value, another effect, another status: not this.
  EXPECT_FALSE(RefusesTaintEffectNone(absl::InvalidArgumentError(
      "spec.devices[3].taints[0].effect: Unsupported value: \"PreferNoSchedule\"")));
  EXPECT_FALSE(RefusesTaintEffectNone(absl::InvalidArgumentError(
      "spec.devices[0].attributes: Unsupported value: \"None\"")));
  EXPECT_FALSE(RefusesTaintEffectNone(absl::UnavailableError(
      "spec.devices[3].taints[0].effect: Unsupported value: \"None\"")));
  EXPECT_FALSE(RefusesTaintEffectNone(absl::OkStatus()));
}

// A server older than 1.35 refuses a slice with a taint of effect None, whole: the publish fails,
// the refusal is counted and reported once per write, and a publish without it goes through.
TEST_F(DRASlicePublisherTest, ARefusedEffectNoneIsCountedAndReported) {
  server_.RefuseTaintEffectNone(true);
  std::vector<std::string> reported;
  publisher_->SetOnDropped([&reported](const std::string& field) { reported.push_back(field); });
  std::vector<nlohmann::json> devices = Devices(2);
  devices[1]["taints"] = {{{"key", "rdma.example.com/degraded"}, {"value", "SymbolErrors"},
                           {"effect", "None"}}};
  const absl::Status s = Publish(Slices(devices));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(reported, ElementsAre(kTaintEffectNoneField));
  EXPECT_THAT(publisher_->DroppedCounts(), ElementsAre(Pair(kTaintEffectNoneField, 1)));
  EXPECT_TRUE(server_.Slices(kNode).empty());
  devices[1].erase("taints");
  ASSERT_TRUE(Publish(Slices(devices)).ok());
  EXPECT_EQ(server_.Slices(kNode).size(), 1u);
  EXPECT_THAT(reported, ElementsAre(kTaintEffectNoneField));
}

// The Node is read once, not at every publish (each was a GET per node and resync: API load
// that grew with the cluster).
TEST_F(DRASlicePublisherTest, NodeIsReadOnce) {
  ASSERT_TRUE(Publish(Slices(Devices(2))).ok());
  ASSERT_TRUE(Publish(Slices(Devices(3))).ok());
  ASSERT_TRUE(Publish(Slices(Devices(3))).ok());
  EXPECT_EQ(server_.counters().gets, 1);
}

TEST_F(DRASlicePublisherTest, WatchBeforeAnyPublishIsFailedPrecondition) {
  absl::Status s = publisher_->Watch([] { return false; }, [] {}, [] {});
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_TRUE(watches_.empty());
}

// The watch starts where the last publish's list left the pool, on our slices only; the events
// of our own writes are no change; a slice someone else edits or deletes is, and a deletion
// (the garbage collector's, when the Node was re-created) makes the next publish read the Node
// again.
TEST_F(DRASlicePublisherTest, WatchReportsOthersChangesNotOurs) {
  ASSERT_TRUE(Publish(Slices(Devices(2))).ok());
  ASSERT_EQ(WatchChanges(), 0);
  ASSERT_EQ(watches_.size(), 1u);
  EXPECT_THAT(watches_[0], HasSubstr("/apis/resource.k8s.io/v1/resourceslices?fieldSelector="
                                     "spec.nodeName%3Dnode-a%2Cspec.driver%3Drdma.example.com"));
  EXPECT_THAT(watches_[0], HasSubstr("&watch=true&allowWatchBookmarks=true&resourceVersion="));
  EXPECT_THAT(watches_[0], HasSubstr("&timeoutSeconds="));
  // A publish that changes a device: its writes come back as events, ours.
  ASSERT_TRUE(Publish(Slices(Devices(2, "cx8"))).ok());
  for (const auto& [name, slice] : server_.Slices(kNode)) {
    events_.push_back({{"type", "MODIFIED"}, {"object", slice}});
  }
  events_.push_back({{"type", "BOOKMARK"},
                     {"object", {{"metadata", {{"resourceVersion", "999"}}}}}});
  EXPECT_EQ(WatchChanges(), 0);
  // Someone else's edit.
  nlohmann::json edited = server_.Slices(kNode).begin()->second;
  edited["metadata"]["resourceVersion"] = "1000";
  events_ = {{{"type", "MODIFIED"}, {"object", edited}}};
  EXPECT_EQ(WatchChanges(), 1);
  EXPECT_THAT(watches_.back(), HasSubstr("resourceVersion=999&"))
      << "a watch goes on from the last bookmark";
  // Someone else's delete: the Node is read again by the next publish.
  events_ = {{{"type", "DELETED"}, {"object", edited}}};
  EXPECT_EQ(WatchChanges(), 1);
  const int gets = server_.counters().gets;
  ASSERT_TRUE(Publish(Slices(Devices(2, "cx8"))).ok());
  EXPECT_EQ(server_.counters().gets, gets + 1);
}

}  // namespace
}  // namespace rdp::dra
