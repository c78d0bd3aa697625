#include "nri/plugin.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "test/nri/runtime_side.h"
#include "test/support/temp_dir.h"

namespace rdp::nri {
namespace {

using testing::Call;
using testing::Decode;
using testing::RegisterAnswer;
namespace api = testing::api;

constexpr absl::Duration kDeadline = absl::Seconds(10);

// The runtime's listening socket, as much of it as these tests need: accept, read whole
// messages, write.
class FakeRuntime {
 public:
  // Listens on `path`. The runtime binds, then listens: a plugin woken by the socket's
  // appearance may connect in between and be refused. With `atomic`, the socket is bound and
  // listening under another name first and renamed into place, so that the first connection
  // after it appears succeeds (the test that proves the inotify wake-up needs that).
  explicit FakeRuntime(const std::string& path, bool atomic = false) : path_(path) {
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const std::string bound = atomic ? path + ".tmp" : path;
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, bound.c_str(), sizeof(addr.sun_path) - 1);
    ::unlink(bound.c_str());
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    if (atomic) {
      EXPECT_EQ(::rename(bound.c_str(), path.c_str()), 0);
    }
  }
  ~FakeRuntime() {
    Hangup();
    ::close(listener_);
  }

  // Waits for the plugin to connect; false after kDeadline.
  bool Accept() {
    struct pollfd p = {listener_, POLLIN, 0};
    if (::poll(&p, 1, absl::ToInt64Milliseconds(kDeadline)) != 1) return false;
    Hangup();
    conn_ = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    decoder_ = TrunkDecoder();
    return conn_ >= 0;
  }
  void Hangup() {
    if (conn_ >= 0) ::close(conn_);
    conn_ = -1;
  }
  void Send(const std::string& bytes) {
    ASSERT_EQ(::write(conn_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  // The next message the plugin sends; fails the test after kDeadline.
  testing::Sent Receive() {
    const absl::Time deadline = absl::Now() + kDeadline;
    for (;;) {
      if (auto m = decoder_.Next()) {
        std::string again;
        AppendFrames(m->conn, m->message, &again);
        return Decode(again).at(0);
      }
      struct pollfd p = {conn_, POLLIN, 0};
      const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (left <= 0 || ::poll(&p, 1, left) != 1) {
        ADD_FAILURE() << "the plugin sent nothing";
        return {};
      }
      char buf[65536];
      const ssize_t n = ::read(conn_, buf, sizeof(buf));
      if (n <= 0) {
        ADD_FAILURE() << "the plugin closed the connection";
        return {};
      }
      EXPECT_TRUE(decoder_.Feed(std::string_view(buf, n)).ok());
    }
  }
  // Whether the plugin closes the connection within kDeadline (with nothing more sent).
  bool SeesHangup() {
    struct pollfd p = {conn_, POLLIN, 0};
    char c;
    return ::poll(&p, 1, absl::ToInt64Milliseconds(kDeadline)) == 1 && ::read(conn_, &c, 1) == 0;
  }
  // Registration, Configure and Synchronize as the runtime does them.
  void SetUpPlugin() {
    const testing::Sent reg = Receive();
    EXPECT_EQ(reg.request.method(), "RegisterPlugin");
    Send(RegisterAnswer());
    Send(Call(1, "Configure", api::ConfigureRequest().SerializeAsString()));
    EXPECT_EQ(Receive().response.status().code(), 0);
    Send(Call(3, "Synchronize", api::SynchronizeRequest().SerializeAsString()));
    EXPECT_EQ(Receive().response.status().code(), 0);
  }

 private:
  std::string path_;
  int listener_ = -1;
  int conn_ = -1;
  TrunkDecoder decoder_;
};

PluginConfig Config(const rdp::testing::TempDir& dir) {
  PluginConfig c;
  c.socket_path = dir.Sub("nri.sock");
  c.max_backoff = absl::Seconds(30);  // long: only the socket's appearance can make it connect
  return c;
}

TEST(NriPluginTest, ConnectsWhenTheSocketAppearsAndAgainWhenItIsRecreated) {
  rdp::testing::TempDir dir;
  NriMetrics metrics;
  PluginConfig config = Config(dir);
  // Any backoff past the first attempt is beyond the deadline: connecting again within it takes
  // the inotify watch.
  config.min_backoff = absl::Seconds(30);
  NriPlugin plugin(config, &metrics);
  ASSERT_TRUE(plugin.Start().ok());

  auto runtime = std::make_unique<FakeRuntime>(config.socket_path, /*atomic=*/true);
  ASSERT_TRUE(runtime->Accept());
  runtime->SetUpPlugin();
  // The answer to Synchronize came: the metrics say so already.
  EXPECT_TRUE(metrics.connected.load());
  EXPECT_EQ(metrics.registrations.value(), 1u);

  // The runtime restarts: the connection ends, the socket is made anew.
  runtime.reset();  // the socket file stays, refusing connections, as a dead runtime's does
  runtime = std::make_unique<FakeRuntime>(config.socket_path, /*atomic=*/true);
  ASSERT_TRUE(runtime->Accept());
  runtime->SetUpPlugin();
  EXPECT_TRUE(metrics.connected.load());
  EXPECT_EQ(metrics.registrations.value(), 2u);

  runtime->Send(Call(5, "CreateContainer",
                     testing::Creating("w", {"/dev/infiniband/uverbs0"}).SerializeAsString()));
  api::CreateContainerResponse resp;
  ASSERT_TRUE(resp.ParseFromString(runtime->Receive().response.payload()));
  EXPECT_EQ(resp.adjust().rlimits_size(), 1);
  plugin.Stop();
  EXPECT_FALSE(metrics.connected.load());
}

TEST(NriPluginTest, ARuntimeThatNeverAnswersIsLeftAndTriedAgain) {
  rdp::testing::TempDir dir;
  NriMetrics metrics;
  PluginConfig config = Config(dir);
  config.setup_timeout = absl::Milliseconds(200);
  config.max_backoff = absl::Milliseconds(100);
  FakeRuntime runtime(config.socket_path);
  NriPlugin plugin(config, &metrics);
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(runtime.Accept());
  EXPECT_EQ(runtime.Receive().request.method(), "RegisterPlugin");
  // No answer: the plugin gives up on this connection and connects again.
  ASSERT_TRUE(runtime.Accept());
  EXPECT_EQ(runtime.Receive().request.method(), "RegisterPlugin");
  EXPECT_EQ(metrics.registrations.value(), 0u);
}

TEST(NriPluginTest, ARefusedRegistrationIsTriedAgain) {
  rdp::testing::TempDir dir;
  NriMetrics metrics;
  PluginConfig config = Config(dir);
  config.min_backoff = config.max_backoff = absl::Milliseconds(10);
  FakeRuntime runtime(config.socket_path);
  NriPlugin plugin(config, &metrics);
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(runtime.Accept());
  runtime.Receive();
  runtime.Send(RegisterAnswer(3, "plugin already registered"));
  ASSERT_TRUE(runtime.Accept());
  runtime.SetUpPlugin();
  EXPECT_TRUE(metrics.connected.load());
  EXPECT_EQ(metrics.registrations.value(), 1u) << "a refused registration counts for nothing";
}

TEST(NriPluginTest, StopsPromptlyWhileWaitingAndWhileConnected) {
  rdp::testing::TempDir dir;
  NriMetrics metrics;
  {
    NriPlugin waiting(Config(dir), &metrics);  // no socket: waiting for one
    ASSERT_TRUE(waiting.Start().ok());
    waiting.Stop();
    waiting.Stop();  // idempotent
  }
  FakeRuntime runtime(Config(dir).socket_path);
  NriPlugin plugin(Config(dir), &metrics);
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(runtime.Accept());
  runtime.SetUpPlugin();
  ASSERT_TRUE(metrics.connected.load());
  plugin.Stop();
  EXPECT_TRUE(runtime.SeesHangup());  // the runtime forgets the plugin
}

TEST(NriPluginTest, ValidatesTheSocketPath) {
  PluginConfig c;
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.socket_path = "/" + std::string(200, 'x');
  const absl::Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--nri-socket"), std::string::npos) << s;
  c.socket_path = "";
  EXPECT_FALSE(ValidateConfig(c).ok());
}

}  // namespace
}  // namespace rdp::nri
