#include "resources/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace rdp::resources {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A file holding `text` in a directory of the test's own, removed with it.
class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& text, const std::string& name = "config.yaml") {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  absl::StatusOr<Config> Load(const std::string& text, const std::string& name = "config.yaml") {
    return LoadConfig(Write(text, name));
  }
  // The message of the error `text` is refused with ("" when it is accepted).
  std::string Refusal(const std::string& text) {
    auto c = Load(text);
    EXPECT_FALSE(c.ok()) << text;
    if (c.ok()) return "";
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_THAT(c.status().message(), HasSubstr((dir_ / "config.yaml").string()));
    return std::string(c.status().message());
  }

  std::filesystem::path dir_;
};

constexpr char kTwoResources[] = R"(resources:
  - name: rdma/hca            # compute rails
    selector:
      linkLayers: [infiniband]
      numaNodes: [0, 1]
  - name: rdma/storage
    sharedDevices: 64
    selector:
      vendors: ["15B3"]
      deviceIDs: [1021]
      drivers: [mlx5_core]
      linkLayers: [Ethernet]
      hcaNames: ["mlx5_*"]
      netdevs: ["ens*"]
      pciAddresses: ["0000:2B:00.0", "2c:00.0"]
      virtualFunctions: include
)";

TEST_F(ConfigFileTest, OurYamlParsesToItsResources) {
  auto c = Load(kTwoResources);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, ConfigFormat::kResources);
  EXPECT_FALSE(c->update_interval.has_value());
  EXPECT_THAT(c->warnings, IsEmpty());
  ASSERT_EQ(c->resources.size(), 2u);
  const Resource& hca = c->resources[0];
  EXPECT_EQ(hca.name, "rdma/hca");
  EXPECT_THAT(hca.selector.link_layers, ElementsAre("InfiniBand"));  // canonical spelling
  EXPECT_THAT(hca.selector.numa_nodes, ElementsAre(0, 1));
  EXPECT_EQ(hca.selector.virtual_functions, VirtualFunctions::kExclude);
  EXPECT_EQ(hca.shared_devices, 1000);
  EXPECT_FALSE(hca.always_shared);
  const Resource& storage = c->resources[1];
  EXPECT_EQ(storage.name, "rdma/storage");
  EXPECT_EQ(storage.shared_devices, 64);
  EXPECT_THAT(storage.selector.vendors, ElementsAre("15b3"));
  EXPECT_THAT(storage.selector.device_ids, ElementsAre("1021"));
  EXPECT_THAT(storage.selector.drivers, ElementsAre("mlx5_core"));
  EXPECT_THAT(storage.selector.link_layers, ElementsAre("Ethernet"));
  EXPECT_THAT(storage.selector.hca_names, ElementsAre("mlx5_*"));
  EXPECT_THAT(storage.selector.netdevs, ElementsAre("ens*"));
  EXPECT_THAT(storage.selector.pci_addresses, ElementsAre("0000:2b:00.0", "2c:00.0"));
  EXPECT_EQ(storage.selector.virtual_functions, VirtualFunctions::kInclude);
}

TEST_F(ConfigFileTest, OurJsonParsesLikeOurYaml) {
  auto c = Load(R"({"resources": [
      {"name": "rdma/hca", "selector": {"linkLayers": ["InfiniBand"], "numaNodes": [1]}},
      {"name": "rdma/vf", "sharedDevices": 8, "selector": {"virtualFunctions": "only"}}]})",
                "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, ConfigFormat::kResources);
  ASSERT_EQ(c->resources.size(), 2u);
  EXPECT_EQ(c->resources[0].name, "rdma/hca");
  EXPECT_THAT(c->resources[0].selector.link_layers, ElementsAre("InfiniBand"));
  EXPECT_THAT(c->resources[0].selector.numa_nodes, ElementsAre(1));
  EXPECT_EQ(c->resources[1].name, "rdma/vf");
  EXPECT_EQ(c->resources[1].shared_devices, 8);
  EXPECT_EQ(c->resources[1].selector.virtual_functions, VirtualFunctions::kOnly);
}

// kubectl and editors write JSON indented with tabs, and with CRLF line ends.
TEST_F(ConfigFileTest, JsonWithTabsAndCrlfParses) {
  auto c = Load("{\r\n\t\"resources\": [\r\n\t\t{\"name\": \"rdma/hca\"}\r\n\t]\r\n}\r\n",
                "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->resources.size(), 1u);
  EXPECT_EQ(c->resources[0].name, "rdma/hca");
}

TEST_F(ConfigFileTest, ANameAloneIsTheNodesPhysicalFunctions) {
  auto c = Load("resources:\n  - name: example.com/nic\n");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->resources.size(), 1u);
  EXPECT_EQ(c->resources[0].name, "example.com/nic");
  EXPECT_EQ(c->resources[0].selector.virtual_functions, VirtualFunctions::kExclude);
  EXPECT_TRUE(c->resources[0].selector.link_layers.empty());
}

// Each bad value of our format: the message names the key path, the line and what is wrong.
struct BadCase {
  const char* what;
  std::string yaml;
  const char* key;   // the key path the message names
  int line;          // the line it names
  const char* why;   // and why
};

// One resource, rdma/a, with one more key: `line` (line 3 of the file).
std::string WithKey(const std::string& line) {
  return "resources:\n  - name: rdma/a\n    " + line + "\n";
}

// One resource, rdma/a, whose selector's one key is `line` (line 4 of the file).
std::string WithSelector(const std::string& line) {
  return WithKey("selector:\n      " + line);
}

class OurFormatRefusesTest : public ConfigFileTest,
                             public ::testing::WithParamInterface<BadCase> {};

TEST_P(OurFormatRefusesTest, NamingTheKeyAndLine) {
  const BadCase& b = GetParam();
  const std::string msg = Refusal(b.yaml);
  EXPECT_THAT(msg, HasSubstr(absl::StrCat(b.key, " (line ", b.line, ")"))) << b.what;
  EXPECT_THAT(msg, HasSubstr(b.why)) << b.what;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OurFormatRefusesTest,
    ::testing::Values(
        BadCase{"UnknownTopKey", "resources:\n  - name: rdma/hca\nresource: []\n", "resource", 3,
                "unknown key 'resource'"},
        BadCase{"UnknownResourceKey", "resources:\n  - name: rdma/hca\n    shared: 4\n",
                "resources[0].shared", 3, "unknown key 'shared'"},
        BadCase{"UnknownSelectorKey",
                "resources:\n  - name: rdma/hca\n    selector:\n      linkLayer: [Ethernet]\n",
                "resources[0].selector.linkLayer", 4, "unknown key 'linkLayer'"},
        BadCase{"NameWithoutDomain", "resources:\n  - name: hca\n", "resources[0].name", 2,
                "must be <domain>/<name>"},
        BadCase{"NameMissing", "resources:\n  - sharedDevices: 4\n", "resources[0]", 2,
                "has no name"},
        BadCase{"DuplicateName",
                "resources:\n  - name: rdma/hca\n  - name: rdma/x\n  - name: rdma/hca\n",
                "resources[2].name", 4, "is also resources[0].name's"},
        BadCase{"LinkLayer",
                "resources:\n  - name: rdma/a\n  - name: rdma/b\n    selector:\n"
                "      linkLayers: [Ethernet, IB]\n",
                "resources[1].selector.linkLayers[1]", 5, "'IB' is not InfiniBand or Ethernet"},
        BadCase{"VirtualFunctions", WithSelector("virtualFunctions: yes"),
                "resources[0].selector.virtualFunctions", 4,
                "'yes' is not exclude, include or only"},
        BadCase{"VendorWith0x", WithSelector("vendors: [\"0x15b3\"]"),
                "resources[0].selector.vendors[0]", 4, "without 0x, e.g. '15b3'"},
        BadCase{"DeviceIdNotHex", WithSelector("deviceIDs: [10x1]"),
                "resources[0].selector.deviceIDs[0]", 4, "'10x1' is not 4 hex digits"},
        BadCase{"DeviceIdTooLong", WithSelector("deviceIDs: [\"10211\"]"),
                "resources[0].selector.deviceIDs[0]", 4, "'10211' is not 4 hex digits"},
        BadCase{"NegativeNuma", WithSelector("numaNodes: [0, -1]"),
                "resources[0].selector.numaNodes[1]", 4, "'-1' is not a NUMA node"},
        BadCase{"NumaNotANumber", WithSelector("numaNodes: [one]"),
                "resources[0].selector.numaNodes[0]", 4, "'one' is not a NUMA node"},
        BadCase{"PciAddress", WithSelector("pciAddresses: [1a:00]"),
                "resources[0].selector.pciAddresses[0]", 4, "'1a:00' is not a PCI address"},
        BadCase{"SharedDevicesZero", WithKey("sharedDevices: 0"), "resources[0].sharedDevices", 3,
                "'0' is not an integer in 1..100000"},
        BadCase{"SharedDevicesTooMany", WithKey("sharedDevices: 100001"),
                "resources[0].sharedDevices", 3, "'100001' is not an integer in 1..100000"},
        BadCase{"SharedDevicesNotANumber", WithKey("sharedDevices: many"),
                "resources[0].sharedDevices", 3, "'many' is not an integer"},
        BadCase{"ListWhereAnIntegerIsExpected", WithKey("sharedDevices: [4]"),
                "resources[0].sharedDevices", 3, "must be an integer in 1..100000"},
        BadCase{"ScalarWhereAListIsExpected", WithSelector("linkLayers: Ethernet"),
                "resources[0].selector.linkLayers", 4, "must be a list; write [Ethernet]"},
        BadCase{"MappingWhereAListIsExpected", WithSelector("drivers:\n        a: b"),
                "resources[0].selector.drivers", 4, "must be a list"},
        BadCase{"ResourcesNotAList", "resources:\n  name: rdma/a\n", "resources", 1,
                "must be a list"},
        BadCase{"NoResources", "resources: []\n", "resources", 1,
                "must list at least one resource"},
        BadCase{"EmptyString", WithSelector("drivers: [\"\"]"),
                "resources[0].selector.drivers[0]", 4, "must be a non-empty string"},
        BadCase{"KeyTwice", WithKey("name: rdma/b"), "resources[0].name", 3, "is given twice"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.what); });

TEST_F(ConfigFileTest, AMissingResourcesKeyIsRefused) {
  EXPECT_THAT(Refusal("{}\n"), HasSubstr("resources (line 1): must list at least one resource"));
  EXPECT_THAT(Refusal("- rdma/hca\n"), HasSubstr("must be a mapping with `resources:`"));
}

TEST_F(ConfigFileTest, JsonErrorsNameTheKeyPath) {
  auto c = Load(R"({"resources": [{"name": "rdma/a", "selector": {"vendors": "15b3"}}]})",
                "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("config.json"));
  EXPECT_THAT(c.status().message(),
              HasSubstr("resources[0].selector.vendors (line 1): must be a list; write [15b3]"));
}

TEST_F(ConfigFileTest, AFileThatDoesNotParseIsRefusedWithTheParsersMessage) {
  const std::string msg = Refusal("resources:\n  - name: rdma/a\n  selector: [\n");
  EXPECT_THAT(msg, HasSubstr("line "));
  EXPECT_THAT(msg, HasSubstr("not valid YAML or JSON"));
}

TEST_F(ConfigFileTest, AMissingFileIsNotFoundNamingThePath) {
  const std::string path = (dir_ / "absent.yaml").string();
  auto c = LoadConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr(path));
}

// The Mellanox shared plugin's config as network-operator's NicClusterPolicy example ships it.
constexpr char kNetworkOperatorExample[] = R"({
  "configList": [
    {
      "resourceName": "rdma_shared_device_a",
      "rdmaHcaMax": 63,
      "selectors": {
        "vendors": ["15b3"],
        "deviceIDs": ["101b"]
      }
    }
  ]
})";

TEST_F(ConfigFileTest, TheNetworkOperatorExampleParses) {
  auto c = Load(kNetworkOperatorExample, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, ConfigFormat::kMellanoxShared);
  EXPECT_FALSE(c->update_interval.has_value());
  EXPECT_THAT(c->warnings, IsEmpty());
  ASSERT_EQ(c->resources.size(), 1u);
  const Resource& r = c->resources[0];
  EXPECT_EQ(r.name, "rdma/rdma_shared_device_a");
  EXPECT_EQ(r.shared_devices, 63);
  EXPECT_TRUE(r.always_shared);
  EXPECT_EQ(r.selector.virtual_functions, VirtualFunctions::kInclude);
  EXPECT_THAT(r.selector.vendors, ElementsAre("15b3"));
  EXPECT_THAT(r.selector.device_ids, ElementsAre("101b"));
}

// The plugin's own README example: prefix, the `devices` alias, the update interval.
TEST_F(ConfigFileTest, MellanoxPrefixDevicesAndIntervalMap) {
  auto c = Load(R"({
    "periodicUpdateInterval": 300,
    "configList": [{
        "resourceName": "hca_shared_devices_a",
        "resourcePrefix": "example_prefix",
        "rdmaHcaMax": 1000,
        "devices": ["ib0", "ib1"]
      },
      {
        "resourceName": "hca_shared_devices_b",
        "rdmaHcaMax": 500,
        "selectors": {"drivers": ["mlx5_core"], "ifNames": ["ib3"], "linkTypes": ["infiniband"]}
      }]})",
                "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->update_interval, absl::Seconds(300));
  ASSERT_EQ(c->resources.size(), 2u);
  EXPECT_EQ(c->resources[0].name, "example_prefix/hca_shared_devices_a");
  EXPECT_EQ(c->resources[0].shared_devices, 1000);
  EXPECT_THAT(c->resources[0].selector.if_names, ElementsAre("ib0", "ib1"));
  EXPECT_EQ(c->resources[1].name, "rdma/hca_shared_devices_b");
  EXPECT_THAT(c->resources[1].selector.drivers, ElementsAre("mlx5_core"));
  EXPECT_THAT(c->resources[1].selector.if_names, ElementsAre("ib3"));
  EXPECT_THAT(c->resources[1].selector.link_types, ElementsAre("infiniband"));
}

TEST_F(ConfigFileTest, MellanoxUnknownKeysAreWarnedAboutNotRefused) {
  auto c = Load(R"({"configList": [{"resourceName": "a", "rdmaHcaMax": 2, "extra": 1,
                    "selectors": {"vendors": ["15b3"], "isRdma": true}}], "logLevel": "x"})",
                "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->warnings,
              ElementsAre(HasSubstr("logLevel (line 2): unknown key 'logLevel'"),
                          HasSubstr("configList[0].extra (line 1): unknown key 'extra'"),
                          HasSubstr("configList[0].selectors.isRdma (line 2): unknown key")));
  EXPECT_THAT(c->warnings[0], HasSubstr("config.json"));
}

TEST_F(ConfigFileTest, MellanoxKeysMatchInAnyCaseAsGoReadsThem) {
  auto c = Load(R"({"configList": [{"ResourceName": "a", "RdmaHcaMax": 2, "Devices": ["ib0"]}]})",
                "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->resources[0].name, "rdma/a");
  EXPECT_THAT(c->resources[0].selector.if_names, ElementsAre("ib0"));
  EXPECT_THAT(c->warnings, IsEmpty());
}

TEST_F(ConfigFileTest, MellanoxErrorsNameTheKey) {
  const auto refused = [&](const std::string& entry) {
    return Refusal(absl::StrCat("{\"configList\": [", entry, "]}"));
  };
  EXPECT_THAT(refused(R"({"resourceName": "rdma/a", "rdmaHcaMax": 1, "devices": ["ib0"]})"),
              HasSubstr("configList[0].resourceName (line 1): 'rdma/a' must match"));
  EXPECT_THAT(refused(R"({"resourceName": "a", "devices": ["ib0"]})"),
              HasSubstr("configList[0].rdmaHcaMax (line 1): is required"));
  EXPECT_THAT(refused(R"({"resourceName": "a", "rdmaHcaMax": -1, "devices": ["ib0"]})"),
              HasSubstr("configList[0].rdmaHcaMax (line 1): '-1' is not an integer in 1..100000"));
  EXPECT_THAT(refused(R"({"resourceName": "a", "rdmaHcaMax": 1})"),
              HasSubstr("configList[0] (line 1): has neither selectors nor devices"));
  EXPECT_THAT(refused(R"({"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib0"],
                          "selectors": {"vendors": ["15b3"]}})"),
              HasSubstr("configList[0].devices (line 1): cannot be given with selectors"));
  EXPECT_THAT(refused(R"({"resourceName": "a", "rdmaHcaMax": 1, "devices": "ib0"})"),
              HasSubstr("configList[0].devices (line 1): must be a list; write [ib0]"));
  EXPECT_THAT(refused(R"({"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib0"]},
                         {"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib1"]})"),
              HasSubstr("configList[1].resourceName (line 2): resource name 'rdma/a' is also "
                        "configList[0].resourceName's"));
  EXPECT_THAT(Refusal(R"({"periodicUpdateInterval": -5, "configList": [
                          {"resourceName": "a", "rdmaHcaMax": 1, "devices": ["ib0"]}]})"),
              HasSubstr("periodicUpdateInterval (line 1): '-5' is not an integer"));
  EXPECT_THAT(Refusal(R"({"configList": []})"),
              HasSubstr("configList (line 1): must be a list of at least one resource"));
}

TEST(ValidateResourceNameTest, OneSlashWithBothSidesNonEmpty) {
  EXPECT_TRUE(ValidateResourceName("rdma/hca").ok());
  EXPECT_TRUE(ValidateResourceName("example.com/nic").ok());
  for (const char* bad : {"", "hca", "/hca", "rdma/", "a/b/c"}) {
    EXPECT_THAT(ValidateResourceName(bad).message(), HasSubstr("<domain>/<name>")) << bad;
  }
}

TEST(DefaultConfigTest, OneResourceOfThePhysicalFunctions) {
  const Config c = DefaultConfig("rdma/hca");
  EXPECT_EQ(c.format, ConfigFormat::kDefault);
  ASSERT_EQ(c.resources.size(), 1u);
  EXPECT_EQ(c.resources[0].name, "rdma/hca");
  EXPECT_EQ(c.resources[0].selector.virtual_functions, VirtualFunctions::kExclude);
  EXPECT_FALSE(c.resources[0].always_shared);
}

topology::Hca MakeHca(std::string name, std::string pci, std::string link_layer) {
  topology::Hca h;
  h.name = std::move(name);
  h.place.pci = std::move(pci);
  topology::Port p;
  p.number = 1;
  p.link_layer = std::move(link_layer);
  h.ports = {p};
  return h;
}

TEST(CheckExclusiveOverlapTest, NamesTheHcaAndBothResources) {
  const std::vector<topology::Hca> hcas = {MakeHca("mlx5_0", "0000:1a:00.0", "InfiniBand"),
                                           MakeHca("mlx5_1", "0000:2b:00.0", "Ethernet")};
  Resource ib{"rdma/hca", {}};
  ib.selector.link_layers = {"InfiniBand"};
  Resource eth{"rdma/storage", {}};
  eth.selector.link_layers = {"Ethernet"};
  EXPECT_TRUE(CheckExclusiveOverlap({ib, eth}, hcas).ok());

  Resource all{"rdma/all", {}};
  const absl::Status st = CheckExclusiveOverlap({ib, eth, all}, hcas);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("HCA mlx5_0 (0000:1a:00.0)"));
  EXPECT_THAT(st.message(), HasSubstr("rdma/hca"));
  EXPECT_THAT(st.message(), HasSubstr("rdma/all"));

  all.always_shared = true;  // a Mellanox resource may share an HCA with any other
  EXPECT_TRUE(CheckExclusiveOverlap({ib, eth, all}, hcas).ok());
}

}  // namespace
}  // namespace rdp::resources
