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

resources::Resource Named(const std::string& name, int shared_devices = 1000) {
  resources::Resource r;
  r.name = name;
  r.shared_devices = shared_devices;
  return r;
}

// Without resources the Config's one keeps --socket-name; given ones are served on their own,
// prefixed by a --socket-name other than the default (the chart's per-mode names).
TEST(ConfigTest, SocketNamesOfTheResources) {
  Config c;
  EXPECT_EQ(SocketNames(c, {Named("rdma/hca"), Named("rdma/storage")}),
            (std::vector<std::string>{"rdma-hca.sock", "rdma-storage.sock"}));
  c.socket_name = "custom.sock";
  EXPECT_EQ(SocketNames(c, {}), std::vector<std::string>{"custom.sock"});
  EXPECT_EQ(SocketNames(c, {Named("rdma/hca"), Named("rdma/storage")}),
            (std::vector<std::string>{"custom-rdma-hca.sock", "custom-rdma-storage.sock"}));
  EXPECT_TRUE(ValidateResources(c, {}).ok());
  EXPECT_TRUE(ValidateResources(c, {Named("rdma/hca"), Named("rdma/storage")}).ok());
}

// One resource sets the plain names alone; of several, the first sets them and each its own,
// named by its VariableSuffix.
TEST(ConfigTest, AllocationNamingsOfTheResources) {
  for (const auto& served : {std::vector<resources::Resource>{},
                             std::vector<resources::Resource>{Named("rdma/storage")}}) {
    const std::vector<AllocationNaming> one = AllocationNamings(served);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_TRUE(one[0].common);
    EXPECT_EQ(one[0].suffix, "");
    EXPECT_EQ(one[0].own_file, "");
  }
  const std::vector<AllocationNaming> two =
      AllocationNamings({Named("rdma/hca"), Named("example.com/Nic-1")});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_TRUE(two[0].common);
  EXPECT_EQ(two[0].suffix, "RDMA_HCA");
  EXPECT_EQ(two[0].own_file, "/etc/rdma/rdma_hca/allocation.json");
  EXPECT_FALSE(two[1].common);
  EXPECT_EQ(two[1].suffix, "EXAMPLE_COM_NIC_1");
  EXPECT_EQ(two[1].own_file, "/etc/rdma/example_com_nic_1/allocation.json");
}

TEST(ConfigTest, BadResourcesNameTheResource) {
  struct Case {
    std::vector<resources::Resource> served;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{Named("storage")}, "resource 'storage': must be <domain>/<name>"},
      {{Named("rdma/storage", 0)}, "resource rdma/storage: shared devices 0 must be 1..100000"},
      {{Named("rdma/hca"), Named("rdma/hca")}, "resource rdma/hca is given twice"},
      {{Named("rdma/hca"), Named("rdma.hca/x"), Named("rdma-hca/x")},
       "resources rdma.hca/x and rdma-hca/x would be served on one socket, rdma-hca-x.sock"},
      {{Named("example.com/nic-1"), Named("EXAMPLE.com/NIC_1")},
       "resources example.com/nic-1 and EXAMPLE.com/NIC_1 would set the same container "
       "variables, RDMA_HCA_NAMES_EXAMPLE_COM_NIC_1"},
      {{Named("kubelet/x")}, ""},
  };
  for (const Case& k : cases) {
    absl::Status s = ValidateResources(Config(), k.served);
    if (k.says.empty()) {
      EXPECT_TRUE(s.ok()) << s;  // kubelet-x.sock is not kubelet.sock
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.says;
    EXPECT_NE(s.message().find(k.says), absl::string_view::npos) << s;
  }
}

TEST(ConfigTest, ParseMode) {
  EXPECT_EQ(*hca::ParseMode("shared"), hca::Mode::kShared);
  EXPECT_EQ(*hca::ParseMode("exclusive"), hca::Mode::kExclusive);
  EXPECT_FALSE(hca::ParseMode("Exclusive").ok());
}

}  // namespace
}  // namespace rdp::deviceplugin
