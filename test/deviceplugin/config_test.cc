#include "deviceplugin/config.h"

#include "gtest/gtest.h"

namespace rdp::deviceplugin {
namespace {

TEST(ConfigTest, DefaultsAreValid) {
  Config c;
  c.discovery.dev_root = "/";
  EXPECT_TRUE(Validate(c).ok());
  EXPECT_EQ(c.SocketPath(), "/var/lib/kubelet/device-plugins/rdma-hca.sock");
  EXPECT_EQ(c.KubeletSocketPath(), "/var/lib/kubelet/device-plugins/kubelet.sock");
}

TEST(ConfigTest, BadValuesNameTheFlag) {
  struct Case {
    std::function<void(Config&)> edit;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {[](Config& c) { c.resource_name = "hca"; }, "--resource-name"},
      {[](Config& c) { c.resource_name = "rdma/"; }, "--resource-name"},
      {[](Config& c) { c.shared_devices = 0; }, "--shared-devices"},
      {[](Config& c) { c.socket_name = "a/b.sock"; }, "--socket-name"},
      {[](Config& c) { c.socket_name = "kubelet.sock"; }, "--socket-name"},
      {[](Config& c) { c.health_interval = absl::Milliseconds(1); }, "--health-interval"},
      {[](Config& c) { c.discovery.sysfs_root = "/nonexistent-rdp"; }, "--sysfs-root"},
      {[](Config& c) { c.discovery.topology_xml = "/nonexistent.xml"; }, "--topology-xml"},
      {[](Config& c) { c.proc_root = "/nonexistent-rdp"; }, "--proc-root"},
      {[](Config& c) { c.gpu_resources = {"gpu"}; }, "--gpu-resources"},
  };
  for (const Case& k : cases) {
    Config c;
    k.edit(c);
    absl::Status s = Validate(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.flag;
    EXPECT_NE(s.message().find(k.flag), absl::string_view::npos) << s;
  }
}

TEST(ConfigTest, ParseMode) {
  EXPECT_EQ(*hca::ParseMode("shared"), hca::Mode::kShared);
  EXPECT_EQ(*hca::ParseMode("exclusive"), hca::Mode::kExclusive);
  EXPECT_FALSE(hca::ParseMode("Exclusive").ok());
}

}  // namespace
}  // namespace rdp::deviceplugin
