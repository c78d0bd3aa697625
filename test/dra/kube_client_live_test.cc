// The API client against a real kube-apiserver. These tests run only when
// test/kubelet/controlplane's TestDRAKubeClientLive starts one and sets RDP_DRA_KUBECONFIG
// (a JSON kubeconfig), RDP_DRA_NODE (a Node that exists), RDP_DRA_DRIVER, RDP_DRA_CLAIM and
// RDP_DRA_PENDING_CLAIM ("<ns>/<name>/<uid>") and RDP_DRA_CLAIM_EXPECT
// ("<request>/<pool>/<device>,..."); that test then checks the server's slices with client-go.

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dra/claim_reader.h"
#include "kube/client.h"
#include "dra/slice_publisher.h"
#include "dra/slices.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/kube/closed_port.h"

namespace rdp::dra {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

std::string EnvOr(const char* name, const std::string& fallback = "") {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

absl::Time Deadline() { return absl::Now() + absl::Seconds(20); }

class DRAKubeClientLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string kubeconfig = EnvOr("RDP_DRA_KUBECONFIG");
    if (kubeconfig.empty()) {
      GTEST_SKIP() << "RDP_DRA_KUBECONFIG is not set: these run under a real API server, from "
                      "test/kubelet/run.sh --control-plane -run TestDRAKubeClientLive";
    }
    node_ = EnvOr("RDP_DRA_NODE");
    ASSERT_FALSE(node_.empty()) << "RDP_DRA_NODE is not set";
    driver_ = EnvOr("RDP_DRA_DRIVER", kDefaultDriverName);
    auto config = kube::LoadKubeconfig(kubeconfig);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    client_ = std::make_shared<kube::Client>(config_, kube::NewCurlTransport(config_));
  }

  // This node's slices of the driver, by name, as the server holds them.
  std::map<std::string, nlohmann::json> ListSlices() {
    auto list = client_->Get(
        "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=" +
            kube::PercentEncode("spec.nodeName=" + node_ + ",spec.driver=" + driver_),
        Deadline());
    EXPECT_TRUE(list.ok()) << list.status();
    std::map<std::string, nlohmann::json> out;
    if (list.ok()) {
      for (const auto& item : list->body["items"]) out[item["metadata"]["name"]] = item;
    }
    return out;
  }

  std::vector<nlohmann::json> Slices(int n, bool taint) {
    std::vector<nlohmann::json> devices;
    for (int i = 0; i < n; ++i) {
      nlohmann::json d = {
          {"name", "hca-" + std::to_string(i)},
          {"attributes",
           {{"resource.kubernetes.io/pcieRoot", {{"string", "pci0000:" + std::to_string(i % 4)}}},
            {"numaNode", {{"int", i % 2}}},
            {"rdma", {{"bool", true}}}}},
          // The server stores "1Gi": publishing again must not count that as a change either.
          {"capacity", {{"ports", {{"value", "1"}}}, {"memory", {{"value", "1024Mi"}}}}},
          {"taints", nlohmann::json::array()},  // empty: the server leaves it out
      };
      if (taint && i == n - 1) {
        // No timeAdded: the server stamps it; publishing again must not count that as a change.
        d["taints"] = {{{"key", driver_ + "/unhealthy"}, {"effect", "NoSchedule"}}};
      }
      devices.push_back(std::move(d));
    }
    return BuildResourceSlices(devices, {driver_, node_, "", 1});
  }

  std::string node_, driver_;
  kube::Config config_;
  std::shared_ptr<kube::Client> client_;
};

void Print(const std::string& what, const std::map<std::string, nlohmann::json>& slices) {
  for (const auto& [name, s] : slices) {
    std::cout << what << ": " << name << " generation=" << s["spec"]["pool"]["generation"]
              << " devices=" << s["spec"]["devices"].size()
              << " resourceVersion=" << s["metadata"]["resourceVersion"] << "\n";
  }
}

TEST_F(DRAKubeClientLiveTest, PublishesThePoolAndKeepsIt) {
  auto node = client_->Get("/api/v1/nodes/" + node_, Deadline());
  ASSERT_TRUE(node.ok()) << node.status();
  const std::string node_uid = node->body["metadata"]["uid"];
  ApiSlicePublisher publisher(client_, driver_, node_);

  // 70 devices: two slices, generation 1 (any slice of another pool name is deleted).
  ASSERT_TRUE(publisher.Publish(Slices(70, false), Deadline()).ok());
  const auto first = ListSlices();
  Print("first", first);
  ASSERT_EQ(first.size(), 2u);
  for (const auto& [name, s] : first) {
    EXPECT_EQ(s["spec"]["pool"]["generation"], 1) << name;
    EXPECT_EQ(s["spec"]["pool"]["resourceSliceCount"], 2) << name;
    EXPECT_EQ(s["metadata"]["ownerReferences"][0]["uid"], node_uid) << name;
  }
  // The same again: nothing written.
  ASSERT_TRUE(publisher.Publish(Slices(70, false), Deadline()).ok());
  EXPECT_EQ(ListSlices(), first);

  // Three devices, one tainted: one slice, generation 2, the second slice deleted.
  auto status = publisher.Publish(Slices(3, true), Deadline());
  ASSERT_TRUE(status.ok()) << status;
  const auto changed = ListSlices();
  Print("changed", changed);
  ASSERT_EQ(changed.size(), 1u);
  const nlohmann::json& slice = changed.begin()->second;
  EXPECT_EQ(changed.begin()->first, node_ + "-" + driver_ + "-0");
  EXPECT_EQ(slice["spec"]["pool"]["generation"], 2);
  EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 1);
  EXPECT_TRUE(slice["spec"]["devices"][2]["taints"][0].contains("timeAdded")) << slice.dump();
  EXPECT_EQ(slice["spec"]["devices"][0]["capacity"]["memory"]["value"], "1Gi");
  // The same again: nothing written, though the server added timeAdded and dropped [].
  ASSERT_TRUE(publisher.Publish(Slices(3, true), Deadline()).ok());
  EXPECT_EQ(ListSlices(), changed);
}

// "<ns>/<name>/<uid>" from the environment.
ClaimRef RefFromEnv(const char* name) {
  const std::vector<std::string> parts = absl::StrSplit(EnvOr(name), '/');
  if (parts.size() != 3) {
    ADD_FAILURE() << name << "=\"" << EnvOr(name) << "\" is not <ns>/<name>/<uid>";
    return {};
  }
  return {parts[0], parts[2], parts[1]};
}

TEST_F(DRAKubeClientLiveTest, ReadsAllocatedAndPendingClaims) {
  ApiClaimReader reader(client_);
  const ClaimRef allocated = RefFromEnv("RDP_DRA_CLAIM");
  auto claim = reader.Read(allocated, driver_, Deadline());
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->uid, allocated.uid);
  std::vector<std::string> read;
  for (const auto& d : claim->devices) read.push_back(d.request + "/" + d.pool + "/" + d.device);
  std::cout << "claim " << allocated.ns << "/" << allocated.name << ": " << absl::StrJoin(read, ",")
            << "\n";
  EXPECT_EQ(absl::StrJoin(read, ","), EnvOr("RDP_DRA_CLAIM_EXPECT"));

  ClaimRef recreated = allocated;
  recreated.uid = "00000000-0000-0000-0000-000000000000";
  auto wrong_uid = reader.Read(recreated, driver_, Deadline());
  EXPECT_TRUE(absl::IsNotFound(wrong_uid.status())) << wrong_uid.status();

  auto pending = reader.Read(RefFromEnv("RDP_DRA_PENDING_CLAIM"), driver_, Deadline());
  EXPECT_TRUE(absl::IsFailedPrecondition(pending.status())) << pending.status();

  auto missing = reader.Read({allocated.ns, "x", "no-such-claim"}, driver_, Deadline());
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

TEST_F(DRAKubeClientLiveTest, WrongTokenIsPermissionDenied) {
  kube::Config config = config_;
  config.token = "not-a-valid-token";
  config.token_file.clear();  // it would win over the token
  kube::Client client(config, kube::NewCurlTransport(config));
  auto r = client.Get("/api/v1/nodes/" + node_, Deadline());
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("401"));
}

TEST_F(DRAKubeClientLiveTest, ServerRefusalsMapToStatusesWithTheServersMessage) {
  // Forbidden: the driver's identity may not list namespaces.
  auto forbidden = client_->Get("/api/v1/namespaces", Deadline());
  EXPECT_TRUE(absl::IsPermissionDenied(forbidden.status())) << forbidden.status();
  EXPECT_THAT(forbidden.status().message(), HasSubstr("cannot list resource \"namespaces\""));
  // Invalid: a device name that is not a DNS label.
  nlohmann::json slice = Slices(1, false)[0];
  slice["metadata"]["name"] = node_ + "-refusals";
  slice["spec"]["pool"]["name"] = "refusals";
  slice["spec"]["devices"][0]["name"] = "Not_A_Label";
  const std::string path = "/apis/resource.k8s.io/v1/resourceslices";
  auto invalid = client_->Post(path, slice, Deadline());
  EXPECT_TRUE(absl::IsInvalidArgument(invalid.status())) << invalid.status();
  EXPECT_THAT(invalid.status().message(), HasSubstr("422"));
  EXPECT_THAT(invalid.status().message(), HasSubstr("spec.devices[0].name"));
  // Created once, then AlreadyExists; updated with a stale resourceVersion: Aborted.
  slice["spec"]["devices"][0]["name"] = "hca-0";
  auto created = client_->Post(path, slice, Deadline());
  ASSERT_TRUE(created.ok()) << created.status();
  auto again = client_->Post(path, slice, Deadline());
  EXPECT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
  nlohmann::json stale = created->body;
  stale["metadata"]["resourceVersion"] = "1";
  auto conflict = client_->Put(path + "/" + node_ + "-refusals", stale, Deadline());
  EXPECT_TRUE(absl::IsAborted(conflict.status())) << conflict.status();
  auto deleted = client_->Delete(path + "/" + node_ + "-refusals", nullptr, Deadline());
  EXPECT_TRUE(deleted.ok()) << deleted.status();
  auto gone = client_->Delete(path + "/" + node_ + "-refusals", nullptr, Deadline());
  EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
}

TEST_F(DRAKubeClientLiveTest, WrongServerNameFailsCertificateVerification) {
  ASSERT_FALSE(config_.tls_server_name.empty())
      << "the harness's kubeconfig names the certificate's server name";
  kube::Config config = config_;
  config.tls_server_name = "not-the-apiserver.example";
  kube::Client client(config, kube::NewCurlTransport(config));
  auto r = client.Get("/api/v1/nodes/" + node_, absl::Now() + absl::Seconds(1));
  EXPECT_THAT(r.status().code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("SSL")) << "refused by the certificate check";
}

TEST_F(DRAKubeClientLiveTest, ClosedPortIsUnavailableWithinTheDeadline) {
  kube::Config config = config_;
  const int port = kube::testing::ClosedPort();
  ASSERT_NE(port, 0);
  config.server = "https://127.0.0.1:" + std::to_string(port);
  kube::Client client(config, kube::NewCurlTransport(config));
  const absl::Time start = absl::Now();
  auto r = client.Get("/api/v1/nodes/" + node_, start + absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(r.status().code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << r.status();
  EXPECT_LE(took, absl::Seconds(3)) << "the deadline bounds the retries";
}

}  // namespace
}  // namespace rdp::dra
