// Which pods the DRA driver reads (dra::PodReads): none with --read-pods=false, what it says
// when it cannot read them (once), pods of other nodes not used, and claims prepared all the same.

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/log.h"
#include "dra/cdi.h"
#include "dra/claim_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/dra/dra_node.h"
#include "test/dra/fake_api.h"
#include "test/support/log_lines.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::FakeApiServer;
using testing::kDriver;
using testing::kHca0;
using testing::kHca1;
using testing::kNode;
using testing::kUid1;
using testing::kUid2;
using ::testing::HasSubstr;

constexpr char kOff[] = "pods are not read (--read-pods=false";
constexpr char kRefused[] = "the API server refuses this driver's ServiceAccount RBAC get on pods";
constexpr char kAgain[] = "pods can be read again";

// The lines the "dra" logger writes while this lives.
class DraLog : public rdp::testing::LogLines {
 public:
  DraLog() : LogLines("dra") {}
  std::string Text() const { return absl::StrJoin(lines(), "\n"); }
};

nlohmann::json Pod(const std::string& name, const std::string& uid, const std::string& node,
                   const std::string& claim) {
  nlohmann::json pod = {{"metadata", {{"namespace", "ns"}, {"name", name}, {"uid", uid}}},
                        {"spec",
                         {{"resourceClaims", {{{"name", claim}, {"resourceClaimName", claim}}}},
                          {"containers", {{{"name", "c"}, {"resources", {{"claims", {{{"name", claim}}}}}}}}}}}};
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  return pod;
}

// A claim of one HCA of ours on kNode, reserved for pod "pod-<name>" (uid "pod-uid-<name>").
nlohmann::json Claim(const std::string& name, const std::string& uid, const std::string& device) {
  return {{"metadata", {{"namespace", "ns"}, {"name", name}, {"uid", uid}}},
          {"status",
           {{"allocation",
             {{"devices",
               {{"results",
                 {{{"request", "hca"}, {"driver", kDriver}, {"pool", kNode}, {"device", device}}}}}}}},
            {"reservedFor",
             {{{"resource", "pods"}, {"name", "pod-" + name}, {"uid", "pod-uid-" + name}}}}}}};
}

class DRAPodReadsTest : public ::testing::Test {
 protected:
  std::unique_ptr<ApiClaimReader> Reader(PodReads pods) {
    return std::make_unique<ApiClaimReader>(
        std::make_shared<kube::Client>(kube::Config{"https://fake"}, server_.NewTransport(),
                                       kube::Client::Options{}),
        std::move(pods));
  }
  absl::Time Deadline() const { return absl::Now() + absl::Seconds(5); }

  FakeApiServer server_;
  DraLog log_;
};

TEST_F(DRAPodReadsTest, OffSendsNothingAndSaysSoOnce) {
  server_.AddPod(Pod("p", "p-1", kNode, "c"));
  auto reader = Reader({kNode, /*enabled=*/false});
  for (int i = 0; i < 3; ++i) {
    auto pod = reader->ReadPod({"ns", "p", "p-1"}, Deadline());
    EXPECT_TRUE(absl::IsPermissionDenied(pod.status())) << pod.status();
    EXPECT_THAT(pod.status().message(), HasSubstr("ns/p"));
  }
  EXPECT_EQ(server_.counters().gets, 0);
  EXPECT_EQ(log_.Count(kOff), 1) << log_.Text();
  // The line says what the driver does without them.
  EXPECT_THAT(log_.Text(), HasSubstr("not the common NCCL_IB_HCA"));
}

TEST_F(DRAPodReadsTest, ARefusalIsSaidOnceUntilAReadSucceeds) {
  server_.AddPod(Pod("p", "p-1", kNode, "c"));
  server_.RefusePods(true);
  auto reader = Reader({kNode, true});
  for (int i = 0; i < 3; ++i) {
    auto pod = reader->ReadPod({"ns", "p", "p-1"}, Deadline());
    EXPECT_TRUE(absl::IsPermissionDenied(pod.status())) << pod.status();
  }
  EXPECT_EQ(server_.counters().gets, 3);
  EXPECT_EQ(log_.Count(kRefused), 1) << log_.Text();
  // The server's own words name what is missing.
  EXPECT_THAT(log_.Text(), HasSubstr("cannot get resource \"pods\""));
  EXPECT_EQ(log_.Count(kAgain), 0);

  // Granted (the chart upgraded): said once; refused again: said again.
  server_.RefusePods(false);
  EXPECT_TRUE(reader->ReadPod({"ns", "p", "p-1"}, Deadline()).ok());
  EXPECT_TRUE(reader->ReadPod({"ns", "p", "p-1"}, Deadline()).ok());
  EXPECT_EQ(log_.Count(kAgain), 1) << log_.Text();
  server_.RefusePods(true);
  EXPECT_FALSE(reader->ReadPod({"ns", "p", "p-1"}, Deadline()).ok());
  EXPECT_EQ(log_.Count(kRefused), 2) << log_.Text();
}

TEST_F(DRAPodReadsTest, APodOfAnotherNodeIsNotUsed) {
  server_.AddPod(Pod("here", "p-1", kNode, "c"));
  server_.AddPod(Pod("unbound", "p-2", "", "c"));
  server_.AddPod(Pod("there", "p-3", "node-b", "c"));
  auto reader = Reader({kNode, true});
  EXPECT_TRUE(reader->ReadPod({"ns", "here", "p-1"}, Deadline()).ok());
  // Not bound yet: a pod a claim of this node is reserved for is bound to this node.
  EXPECT_TRUE(reader->ReadPod({"ns", "unbound", "p-2"}, Deadline()).ok());
  auto there = reader->ReadPod({"ns", "there", "p-3"}, Deadline());
  EXPECT_TRUE(absl::IsNotFound(there.status())) << there.status();
  EXPECT_THAT(there.status().message(), HasSubstr("ns/there is bound to node node-b"));
  EXPECT_THAT(there.status().message(), HasSubstr(kNode));
  // No node given: any node's pod is used.
  EXPECT_TRUE(Reader({})->ReadPod({"ns", "there", "p-3"}, Deadline()).ok());
}

// The common variables of a prepared claim's CDI device (NCCL_IB_HCA), or "" when it has none.
std::string CommonNcclIbHca(DraNode& n, const std::string& uid) {
  std::ifstream in(n.cdi().PathOf(uid));
  const nlohmann::json spec = nlohmann::json::parse(in, nullptr, false);
  for (const auto& d : spec["devices"]) {
    // A request's metadata device has mounts only.
    for (const auto& kv : d["containerEdits"].value("env", nlohmann::json::array())) {
      const std::string s = kv.get<std::string>();
      if (s.rfind("NCCL_IB_HCA=", 0) == 0) return s.substr(s.find('=') + 1);
    }
  }
  return "";
}

// Claims prepared through the API reader without the pods (off, or refused by RBAC): each is
// prepared, its CDI device without the common variables; the log says why once, not per claim.
TEST_F(DRAPodReadsTest, ClaimsArePreparedWithoutThePodsAndTheLogSaysWhyOnce) {
  struct Case {
    bool enabled;
    const char* line;
  };
  for (const Case& c : {Case{false, kOff}, Case{true, kRefused}}) {
    SCOPED_TRACE(c.line);
    FakeApiServer server;
    server.AddClaim(Claim("one", kUid1, kHca0));
    server.AddClaim(Claim("two", kUid2, kHca1));
    server.AddPod(Pod("pod-one", "pod-uid-one", kNode, "one"));
    server.AddPod(Pod("pod-two", "pod-uid-two", kNode, "two"));
    server.RefusePods(c.enabled);
    ApiClaimReader reader(std::make_shared<kube::Client>(kube::Config{"https://fake"},
                                                         server.NewTransport(),
                                                         kube::Client::Options{}),
                          PodReads{kNode, c.enabled});
    DraLog log;
    DraNode n;
    n.SetReader(&reader);
    n.NewDriver();
    auto one = n.driver().Prepare({{"ns", kUid1, "one"}}).at(kUid1);
    auto two = n.driver().Prepare({{"ns", kUid2, "two"}}).at(kUid2);
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ(CommonNcclIbHca(n, kUid1), "");
    EXPECT_EQ(CommonNcclIbHca(n, kUid2), "");
    EXPECT_EQ(log.Count(c.line), 1) << log.Text();
    EXPECT_EQ(log.Count("reading pod"), 0) << "a line per pod beside the one that says why: "
                                           << log.Text();
  }
  // The same claims with the pods read: the common variables are set (what the two cases lack).
  FakeApiServer server;
  server.AddClaim(Claim("one", kUid1, kHca0));
  server.AddPod(Pod("pod-one", "pod-uid-one", kNode, "one"));
  ApiClaimReader reader(std::make_shared<kube::Client>(kube::Config{"https://fake"},
                                                       server.NewTransport(),
                                                       kube::Client::Options{}),
                        PodReads{kNode, true});
  DraNode n;
  n.SetReader(&reader);
  n.NewDriver();
  ASSERT_TRUE(n.driver().Prepare({{"ns", kUid1, "one"}}).at(kUid1).ok());
  EXPECT_EQ(CommonNcclIbHca(n, kUid1), "=mlx5_0");
}

}  // namespace
}  // namespace rdp::dra
