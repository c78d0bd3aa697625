#include "nri/session.h"

#include "gtest/gtest.h"
#include "nri/memlock.h"
#include "test/nri/runtime_side.h"

namespace rdp::nri {
namespace {

using testing::Call;
using testing::Creating;
using testing::Decode;
using testing::RegisterAnswer;
namespace api = testing::api;

class NriSessionTest : public ::testing::Test {
 protected:
  // One call through the session; its one answer.
  testing::Sent Roundtrip(const std::string& bytes) {
    std::string out;
    EXPECT_TRUE(session_.OnBytes(bytes, &out).ok());
    std::vector<testing::Sent> sent = Decode(out);
    EXPECT_EQ(sent.size(), 1u);
    return sent.empty() ? testing::Sent() : sent[0];
  }

  NriMetrics metrics_;
  PluginService service_{kUnlimited, metrics_};
  Session session_{Registration{"rdma-device-plugin", "50"}, service_};
};

TEST_F(NriSessionTest, RegistersFirstOnTheRuntimesConnection) {
  std::vector<testing::Sent> sent = Decode(session_.Open());
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].conn, kRuntimeServiceConn);
  EXPECT_EQ(sent[0].message.stream_id, 1u);
  EXPECT_EQ(sent[0].message.type, MessageType::kRequest);
  EXPECT_EQ(sent[0].request.service(), "nri.pkg.api.v1alpha1.Runtime");
  EXPECT_EQ(sent[0].request.method(), "RegisterPlugin");
  api::RegisterPluginRequest req;
  ASSERT_TRUE(req.ParseFromString(sent[0].request.payload()));
  EXPECT_EQ(req.plugin_name(), "rdma-device-plugin");
  EXPECT_EQ(req.plugin_idx(), "50");

  EXPECT_FALSE(session_.registered());
  std::string out;
  ASSERT_TRUE(session_.OnBytes(RegisterAnswer(), &out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(session_.registered());
}

TEST_F(NriSessionTest, ARefusedRegistrationEndsTheConnection) {
  session_.Open();
  std::string out;
  const absl::Status s = session_.OnBytes(RegisterAnswer(3, "invalid plugin index"), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("invalid plugin index"), std::string::npos) << s;
  EXPECT_FALSE(session_.registered());
}

TEST_F(NriSessionTest, ConfigureSubscribesToCreateContainerOnly) {
  api::ConfigureRequest req;
  req.set_runtime_name("containerd");
  req.set_runtime_version("v2.4.2");
  req.set_request_timeout(2000);
  const testing::Sent a = Roundtrip(Call(1, "Configure", req.SerializeAsString()));
  EXPECT_EQ(a.conn, kPluginServiceConn);
  EXPECT_EQ(a.message.stream_id, 1u);
  EXPECT_EQ(a.message.type, MessageType::kResponse);
  EXPECT_EQ(a.response.status().code(), 0);
  api::ConfigureResponse resp;
  ASSERT_TRUE(resp.ParseFromString(a.response.payload()));
  EXPECT_EQ(resp.events(), 1 << (api::CREATE_CONTAINER - 1));
}

TEST_F(NriSessionTest, SynchronizeEchoesMoreAndCompletesOnTheLastPart) {
  api::SynchronizeRequest part;
  part.set_more(true);
  *part.add_containers() = Creating("old", {"/dev/infiniband/uverbs0"}).container();
  api::SynchronizeResponse resp;
  ASSERT_TRUE(resp.ParseFromString(Roundtrip(Call(1, "Synchronize", part.SerializeAsString()))
                                       .response.payload()));
  EXPECT_TRUE(resp.more());
  EXPECT_FALSE(service_.synchronized());
  part.set_more(false);
  ASSERT_TRUE(resp.ParseFromString(Roundtrip(Call(3, "Synchronize", part.SerializeAsString()))
                                       .response.payload()));
  EXPECT_FALSE(resp.more());
  EXPECT_TRUE(service_.synchronized());
  EXPECT_EQ(metrics_.adjustments.value(), 0u);  // existing containers are not adjusted
}

TEST_F(NriSessionTest, CreateContainerRaisesMemlockOnlyWithAnHca) {
  api::CreateContainerResponse resp;
  const testing::Sent with = Roundtrip(Call(
      1, "CreateContainer",
      Creating("worker", {"/dev/infiniband/uverbs2", "/dev/infiniband/rdma_cm"}).SerializeAsString()));
  EXPECT_EQ(with.response.status().code(), 0);
  ASSERT_TRUE(resp.ParseFromString(with.response.payload()));
  ASSERT_EQ(resp.adjust().rlimits_size(), 1);
  EXPECT_EQ(resp.adjust().rlimits(0).type(), "RLIMIT_MEMLOCK");
  EXPECT_EQ(resp.adjust().rlimits(0).soft(), kUnlimited);
  EXPECT_EQ(resp.adjust().rlimits(0).hard(), kUnlimited);
  EXPECT_EQ(metrics_.adjustments.value(), 1u);

  const testing::Sent without =
      Roundtrip(Call(3, "CreateContainer", Creating("sidecar", {"/dev/fuse"}).SerializeAsString()));
  EXPECT_EQ(without.response.status().code(), 0);
  ASSERT_TRUE(resp.ParseFromString(without.response.payload()));
  EXPECT_FALSE(resp.has_adjust());
  EXPECT_EQ(metrics_.adjustments.value(), 1u);
}

TEST_F(NriSessionTest, AnUnreadableCreateContainerIsAnsweredOkUnadjusted) {
  // Field 1 (pod) as a length-delimited field claiming more bytes than follow.
  const testing::Sent a = Roundtrip(Call(1, "CreateContainer", std::string("\x0a\x7f\x01", 3)));
  EXPECT_EQ(a.response.status().code(), 0);  // an error would fail the container's creation
  api::CreateContainerResponse resp;
  ASSERT_TRUE(resp.ParseFromString(a.response.payload()));
  EXPECT_FALSE(resp.has_adjust());
  EXPECT_EQ(metrics_.errors.value(), 1u);
}

TEST_F(NriSessionTest, UnknownMethodsAndBadStreamsGetTtrpcsErrors) {
  EXPECT_EQ(Roundtrip(Call(1, "StartContainer", "")).response.status().code(), 12);  // Unimplemented
  EXPECT_EQ(Roundtrip(Call(2, "Configure", "")).response.status().code(), 3);  // even stream
  EXPECT_EQ(Roundtrip(Call(1, "Configure", "")).response.status().code(), 3);  // reused stream
  EXPECT_EQ(Roundtrip(Call(5, "Configure", "")).response.status().code(), 0);
}

TEST_F(NriSessionTest, ValidatesItsRegistration) {
  EXPECT_TRUE(ValidateRegistration({"rdma-device-plugin", "50"}).ok());
  EXPECT_TRUE(ValidateRegistration({"a_b.c+d-1", "00"}).ok());
  for (const Registration& bad : {Registration{"", "50"}, Registration{"rdma/plugin", "50"},
                                  Registration{"x", "5"}, Registration{"x", "100"},
                                  Registration{"x", "a1"}}) {
    const absl::Status s = ValidateRegistration(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.name << " " << bad.index;
    EXPECT_NE(s.message().find("--nri-plugin-"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace rdp::nri
