#include "dra/dra_server.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"

#include "dra/probe.h"
#include "proto/dra.grpc.pb.h"
#include "proto/dra_v1beta1.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/pluginregistration.grpc.pb.h"
#include "serving/unix_server.h"
#include "test/dra/dra_node.h"
#include "test/support/log_lines.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::Dev;
using testing::kDriver;
using testing::kHca0;
using testing::kUid1;
using testing::kUid2;
using rdp::testing::CountContaining;
using rdp::testing::LastContaining;

constexpr absl::Duration kWait = absl::Seconds(10);

class DRAServerTest : public ::testing::Test {
 protected:
  DRAServerTest() {
    config_.kubelet_dir = node_.root() + "/kubelet";
    config_.driver_name = kDriver;
    config_.recheck = absl::Seconds(30);  // events alone must do it
    server_ = std::make_unique<DraServer>(config_, &node_.driver());
  }

  std::unique_ptr<drapb::DRAPlugin::Stub> DraStub() {
    return drapb::DRAPlugin::NewStub(serving::UnixChannel(config_.DraSocket()));
  }
  std::unique_ptr<pluginregistration::Registration::Stub> RegStub() {
    return pluginregistration::Registration::NewStub(
        serving::UnixChannel(config_.RegistrationSocket()));
  }
  static void Deadline(grpc::ClientContext& c) {
    c.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  }
  // What the server logs each time it serves the DRA socket, the registration socket.
  std::string ServingDra() const { return "serving DRAPlugin on " + config_.DraSocket(); }
  std::string ServingReg() const {
    return "serving Registration on " + config_.RegistrationSocket();
  }
  // Waits until the DRA socket was served at least `dra` times and the registration socket
  // `registration` times, the registration socket last (the state the kubelet must find).
  bool WaitServes(int dra, int registration) const {
    const std::string d = ServingDra();
    const std::string r = ServingReg();
    return dra_log_.WaitUntil(
        [&](const std::vector<std::string>& lines) {
          return CountContaining(lines, d) >= dra && CountContaining(lines, r) >= registration &&
                 LastContaining(lines, r) > LastContaining(lines, d);
        },
        kWait);
  }
  // GetInfo as the plugin watcher calls it, then the kubelet's verdict.
  pluginregistration::PluginInfo Register() {
    auto stub = RegStub();
    pluginregistration::PluginInfo info;
    grpc::ClientContext c1;
    Deadline(c1);
    EXPECT_TRUE(stub->GetInfo(&c1, {}, &info).ok());
    pluginregistration::RegistrationStatus status;
    status.set_plugin_registered(true);
    pluginregistration::RegistrationStatusResponse r;
    grpc::ClientContext c2;
    Deadline(c2);
    EXPECT_TRUE(stub->NotifyRegistrationStatus(&c2, status, &r).ok());
    return info;
  }

  // Made before the server, whose thread logs on "dra", and destroyed after it.
  rdp::testing::LogLines dra_log_{"dra"};
  DraNode node_;
  DraServerConfig config_;
  std::unique_ptr<DraServer> server_;
};

TEST_F(DRAServerTest, GetInfoNamesTheDraSocketAndV1Service) {
  ASSERT_TRUE(server_->Start().ok());
  EXPECT_EQ(config_.RegistrationSocket(),
            config_.kubelet_dir + "/plugins_registry/rdma.example.com-reg.sock");
  EXPECT_EQ(config_.DraSocket(), config_.kubelet_dir + "/plugins/rdma.example.com/dra.sock");
  const pluginregistration::PluginInfo info = Register();
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), kDriver);
  EXPECT_EQ(info.endpoint(), config_.DraSocket());
  // v1 first (kubelets 1.34+ take it), v1beta1 for 1.32 and 1.33.
  ASSERT_EQ(info.supported_versions_size(), 2);
  EXPECT_EQ(info.supported_versions(0), "v1.DRAPlugin");
  EXPECT_EQ(info.supported_versions(1), "v1beta1.DRAPlugin");
  EXPECT_EQ(server_->registration().state().registrations, 1);
}

TEST_F(DRAServerTest, PrepareAndUnprepareOverTheSocket) {
  ASSERT_TRUE(server_->Start().ok());
  node_.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0, "hca/a")});
  auto stub = DraStub();
  drapb::NodePrepareResourcesRequest req;
  for (const char* uid : {kUid1, kUid2}) {
    drapb::Claim* c = req.add_claims();
    c->set_namespace_("ns");
    c->set_uid(uid);
    c->set_name(std::string("claim-") + std::string(uid).substr(0, 8));
  }
  drapb::NodePrepareResourcesResponse resp;
  grpc::ClientContext c1;
  Deadline(c1);
  ASSERT_TRUE(stub->NodePrepareResources(&c1, req, &resp).ok());
  ASSERT_EQ(resp.claims_size(), 2);
  const drapb::NodePrepareResourceResponse& ok = resp.claims().at(kUid1);
  EXPECT_EQ(ok.error(), "");
  ASSERT_EQ(ok.devices_size(), 1);
  EXPECT_EQ(ok.devices(0).pool_name(), testing::kNode);
  EXPECT_EQ(ok.devices(0).device_name(), kHca0);
  ASSERT_EQ(ok.devices(0).request_names_size(), 1);
  EXPECT_EQ(ok.devices(0).request_names(0), "hca");
  ASSERT_EQ(ok.devices(0).cdi_device_ids_size(), 2);
  EXPECT_EQ(ok.devices(0).cdi_device_ids(0), "rdma.example.com/hca=" + std::string(kUid1) + "-hca");
  EXPECT_EQ(ok.devices(0).cdi_device_ids(1), "rdma.example.com/hca=" + std::string(kUid1) + "_hca");
  EXPECT_FALSE(ok.devices(0).has_share_id());
  const drapb::NodePrepareResourceResponse& bad = resp.claims().at(kUid2);
  EXPECT_NE(bad.error().find("not found"), std::string::npos) << bad.error();
  EXPECT_EQ(bad.devices_size(), 0);

  drapb::NodeUnprepareResourcesRequest ureq;
  *ureq.mutable_claims() = req.claims();
  drapb::NodeUnprepareResourcesResponse uresp;
  grpc::ClientContext c2;
  Deadline(c2);
  ASSERT_TRUE(stub->NodeUnprepareResources(&c2, ureq, &uresp).ok());
  ASSERT_EQ(uresp.claims_size(), 2);
  EXPECT_EQ(uresp.claims().at(kUid1).error(), "");
  EXPECT_EQ(uresp.claims().at(kUid2).error(), "");  // unknown: nothing to undo
  EXPECT_TRUE(node_.CdiFiles().empty());
}

TEST_F(DRAServerTest, RemovedSocketsAreServedAgain) {
  ASSERT_TRUE(server_->Start().ok());
  ASSERT_EQ(dra_log_.Count(ServingDra()), 1);
  ASSERT_EQ(dra_log_.Count(ServingReg()), 1);
  Register();
  // A kubelet restart wiping both directories (each moved away at once, then removed: the
  // driver re-creates them meanwhile).
  for (const char* d : {"/plugins_registry", "/plugins"}) {
    const std::string gone = node_.root() + "/wiped" + std::string(d);
    std::filesystem::create_directories(node_.root() + "/wiped");
    std::filesystem::rename(config_.kubelet_dir + d, gone);
    std::filesystem::remove_all(gone);
  }
  ASSERT_TRUE(WaitServes(2, 2));  // the registration socket after the other
  ASSERT_TRUE(std::filesystem::is_socket(config_.RegistrationSocket()));
  ASSERT_TRUE(std::filesystem::is_socket(config_.DraSocket()));
  EXPECT_EQ(Register().endpoint(), config_.DraSocket());
  EXPECT_EQ(server_->registration().state().registrations, 2);
  // And again, the registration socket alone (the directories stay watched).
  const int before = dra_log_.Count(ServingReg());
  ASSERT_EQ(::unlink(config_.RegistrationSocket().c_str()), 0);
  ASSERT_TRUE(WaitServes(2, before + 1));
  EXPECT_EQ(dra_log_.Count(ServingDra()), 2);  // untouched, not re-created
  Register();
}

TEST_F(DRAServerTest, RefusedRegistrationIsCountedNotRegistered) {
  ASSERT_TRUE(server_->Start().ok());
  auto stub = RegStub();
  pluginregistration::RegistrationStatus status;
  status.set_plugin_registered(false);
  status.set_error("invalid supported gRPC versions");
  pluginregistration::RegistrationStatusResponse r;
  grpc::ClientContext c;
  Deadline(c);
  ASSERT_TRUE(stub->NotifyRegistrationStatus(&c, status, &r).ok());
  EXPECT_EQ(server_->registration().state().refusals, 1);
  EXPECT_EQ(server_->registration().state().registrations, 0);
}

TEST_F(DRAServerTest, ServingThatFailsIsRetried) {
  config_.retry_min = absl::Milliseconds(20);
  server_ = std::make_unique<DraServer>(config_, &node_.driver());
  ASSERT_TRUE(server_->Start().ok());
  // <kubelet>/plugins made a file: the DRA socket's directory cannot be created.
  const std::string plugins = config_.kubelet_dir + "/plugins";
  std::filesystem::rename(plugins, node_.root() + "/gone");
  std::ofstream(node_.root() + "/blocker") << "x";
  std::filesystem::rename(node_.root() + "/blocker", plugins);
  std::filesystem::remove_all(node_.root() + "/gone");  // the driver sees dra.sock go
  // The failed serve is logged with its error (the directory it cannot create) and "; retrying".
  ASSERT_TRUE(dra_log_.WaitUntil(
      [&](const std::vector<std::string>& lines) {
        return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
          return absl::StrContains(l, config_.PluginDir()) && absl::EndsWith(l, "; retrying");
        });
      },
      kWait));
  // Nothing in the watched directories changes from here on, and the periodic re-check (30 s)
  // is beyond the wait: only the retries can serve it again.
  std::filesystem::remove(plugins);
  ASSERT_TRUE(WaitServes(2, 2));
  EXPECT_TRUE(std::filesystem::is_socket(config_.DraSocket()));
  EXPECT_EQ(Register().endpoint(), config_.DraSocket());
}

TEST_F(DRAServerTest, StopRemovesBothSockets) {
  ASSERT_TRUE(server_->Start().ok());
  server_->Stop();
  EXPECT_FALSE(std::filesystem::exists(config_.RegistrationSocket()));
  EXPECT_FALSE(std::filesystem::exists(config_.DraSocket()));
  server_->Stop();  // idempotent
}


// A kubelet that speaks v1beta1 only (1.32, 1.33) prepares and unprepares through it: the same
// answer as v1, without share_id.
TEST_F(DRAServerTest, V1beta1ServesTheSameAnswers) {
  ASSERT_TRUE(server_->Start().ok());
  node_.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  auto stub = drapb_v1beta1::DRAPlugin::NewStub(serving::UnixChannel(config_.DraSocket()));
  drapb_v1beta1::NodePrepareResourcesRequest req;
  drapb_v1beta1::Claim* c = req.add_claims();
  c->set_namespace_("ns");
  c->set_uid(kUid1);
  c->set_name("claim");
  drapb_v1beta1::NodePrepareResourcesResponse resp;
  grpc::ClientContext c1;
  Deadline(c1);
  ASSERT_TRUE(stub->NodePrepareResources(&c1, req, &resp).ok());
  const auto& entry = resp.claims().at(kUid1);
  EXPECT_EQ(entry.error(), "");
  ASSERT_EQ(entry.devices_size(), 1);
  EXPECT_EQ(entry.devices(0).device_name(), kHca0);
  EXPECT_EQ(entry.devices(0).cdi_device_ids(0), CdiDeviceId(kDriver, kUid1, "hca"));
  drapb_v1beta1::NodeUnprepareResourcesRequest ureq;
  *ureq.mutable_claims() = req.claims();
  drapb_v1beta1::NodeUnprepareResourcesResponse uresp;
  grpc::ClientContext c2;
  Deadline(c2);
  ASSERT_TRUE(stub->NodeUnprepareResources(&c2, ureq, &uresp).ok());
  EXPECT_EQ(uresp.claims().at(kUid1).error(), "");
  EXPECT_TRUE(node_.CdiFiles().empty());
}

// Ready (grpc.health.v1 SERVING, probe --dra --ready) only while the kubelet has the driver
// registered: not before, not after a refusal; the plain probe (liveness) passes throughout.
TEST_F(DRAServerTest, ReadyOnlyWhileRegistered) {
  ASSERT_TRUE(server_->Start().ok());
  auto check = [this] {
    auto health = ::grpc::health::v1::Health::NewStub(serving::UnixChannel(config_.DraSocket()));
    ::grpc::health::v1::HealthCheckResponse r;
    grpc::ClientContext c;
    Deadline(c);
    EXPECT_TRUE(health->Check(&c, {}, &r).ok());
    return r.status();
  };
  using HC = ::grpc::health::v1::HealthCheckResponse;
  std::vector<RegistrationState> seen;
  server_->registration().SetOnStatus([&seen](const RegistrationState& s) { seen.push_back(s); });
  EXPECT_EQ(check(), HC::NOT_SERVING);
  const absl::Status unregistered = Probe(config_.kubelet_dir, kDriver, kWait, true);
  EXPECT_EQ(unregistered.code(), absl::StatusCode::kFailedPrecondition) << unregistered;
  EXPECT_TRUE(Probe(config_.kubelet_dir, kDriver, kWait, false).ok());
  Register();
  EXPECT_EQ(check(), HC::SERVING);
  EXPECT_TRUE(Probe(config_.kubelet_dir, kDriver, kWait, true).ok());

  auto stub = RegStub();
  pluginregistration::RegistrationStatus refused;
  refused.set_plugin_registered(false);
  refused.set_error("none of services supported by the plugin are supported by the kubelet");
  pluginregistration::RegistrationStatusResponse r;
  grpc::ClientContext c;
  Deadline(c);
  ASSERT_TRUE(stub->NotifyRegistrationStatus(&c, refused, &r).ok());
  EXPECT_EQ(check(), HC::NOT_SERVING);
  EXPECT_FALSE(Probe(config_.kubelet_dir, kDriver, kWait, true).ok());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[0].registered);
  EXPECT_FALSE(seen[1].registered);
  EXPECT_EQ(seen[1].error, refused.error());
  EXPECT_EQ(seen[1].registrations, 1);
  EXPECT_EQ(seen[1].refusals, 1);
}

}  // namespace
}  // namespace rdp::dra
