#include "dra/dra_server.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "proto/dra.grpc.pb.h"
#include "proto/pluginregistration.grpc.pb.h"
#include "serving/unix_server.h"
#include "test/dra/dra_node.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::Dev;
using testing::kDriver;
using testing::kHca0;
using testing::kUid1;
using testing::kUid2;

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
  ASSERT_EQ(info.supported_versions_size(), 1);
  EXPECT_EQ(info.supported_versions(0), "v1.DRAPlugin");
  EXPECT_EQ(server_->registration().registrations(), 1);
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
  ASSERT_EQ(ok.devices(0).cdi_device_ids_size(), 1);
  EXPECT_EQ(ok.devices(0).cdi_device_ids(0), "rdma.example.com/hca=" + std::string(kUid1) + "-hca");
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
  ASSERT_EQ(server_->dra_serves(), 1);
  ASSERT_EQ(server_->registration_serves(), 1);
  Register();
  // A kubelet restart wiping both directories (each moved away at once, then removed: the
  // driver re-creates them meanwhile).
  for (const char* d : {"/plugins_registry", "/plugins"}) {
    const std::string gone = node_.root() + "/wiped" + std::string(d);
    std::filesystem::create_directories(node_.root() + "/wiped");
    std::filesystem::rename(config_.kubelet_dir + d, gone);
    std::filesystem::remove_all(gone);
  }
  ASSERT_TRUE(server_->WaitServes(2, 2, kWait));  // the registration socket after the other
  ASSERT_TRUE(std::filesystem::is_socket(config_.RegistrationSocket()));
  ASSERT_TRUE(std::filesystem::is_socket(config_.DraSocket()));
  EXPECT_EQ(Register().endpoint(), config_.DraSocket());
  EXPECT_EQ(server_->registration().registrations(), 2);
  // And again, the registration socket alone (the directories stay watched).
  const int before = server_->registration_serves();
  ASSERT_EQ(::unlink(config_.RegistrationSocket().c_str()), 0);
  ASSERT_TRUE(server_->WaitServes(2, before + 1, kWait));
  EXPECT_EQ(server_->dra_serves(), 2);  // untouched, not re-created
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
  EXPECT_EQ(server_->registration().refusals(), 1);
  EXPECT_EQ(server_->registration().registrations(), 0);
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
  ASSERT_TRUE(server_->WaitServeFailures(1, kWait));
  // Nothing in the watched directories changes from here on, and the periodic re-check (30 s)
  // is beyond the wait: only the retries can serve it again.
  std::filesystem::remove(plugins);
  ASSERT_TRUE(server_->WaitServes(2, 2, kWait));
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

}  // namespace
}  // namespace rdp::dra
