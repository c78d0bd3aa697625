#include "dra/metadata.h"

#include <filesystem>
#include <map>

#include "dra/devices.h"
#include "serving/atomic_file.h"
#include "test/dra/dra_node.h"

namespace rdp::dra {
namespace {

using testing::DraNode;
using testing::Dev;
using testing::kDriver;
using testing::kHca0;
using testing::kHca1;
using testing::kNode;
using testing::kUid1;
using testing::kUid2;
using testing::kUid3;
using testing::ReadJson;

const ClaimRef kClaim{"ns", kUid1, "claim-1"};

// The file's text, "" when it cannot be read (the comparison then fails, naming it).
std::string ReadText(const std::string& path) {
  return serving::ReadWholeFile(path).value_or("");
}

// The request's metadata file as a stream of objects (a test failure when it is not one).
std::vector<nlohmann::json> Stream(DraNode& n, const ClaimRef& claim, const std::string& request) {
  absl::StatusOr<std::string> text = n.metadata().Read(claim.uid, request);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return {};
  absl::StatusOr<std::vector<nlohmann::json>> objects = ParseMetadataStream(*text);
  EXPECT_TRUE(objects.ok()) << objects.status() << "\n" << *text;
  return objects.ok() ? *objects : std::vector<nlohmann::json>{};
}

// The claim's spec device named `name` (null when there is none).
nlohmann::json SpecDeviceNamed(DraNode& n, const std::string& uid, const std::string& name) {
  const nlohmann::json spec = ReadJson(n.cdi().PathOf(uid));
  for (const auto& d : spec["devices"]) {
    if (d["name"] == name) return d;
  }
  return nullptr;
}

// The published attributes of the node's device `name`.
nlohmann::json PublishedAttributes(DraNode& n, const std::string& name) {
  for (const nlohmann::json& d : BuildDevices(*n.core().Now(), DeviceOptions{kDriver})) {
    if (d["name"] == name) return d["attributes"];
  }
  ADD_FAILURE() << "no device " << name;
  return nullptr;
}

TEST(DRAMetadataTest, ContainerPathOfADirectClaimAndOfATemplatesClaim) {
  EXPECT_EQ(MetadataContainerPath("rdma.example.com", "claim-1", std::nullopt, "hca"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/claim-1/hca/"
            "rdma.example.com-metadata.json");
  EXPECT_EQ(MetadataContainerPath("rdma.example.com", "pod-x-hcas-7k2lq", std::string("hcas"),
                                  "hca"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/hcas/hca/"
            "rdma.example.com-metadata.json");
}

TEST(DRAMetadataTest, StreamHoldsEachVersionNewestFirstAndParsesBack) {
  MetadataDevice device{kNode, kHca0, {{"a", {{"int", 1}}}}, {{"interfaceName", "eth0"}}};
  const std::vector<nlohmann::json> objects =
      BuildDeviceMetadata(kDriver, kClaim, std::string("hcas"), "hca/two", {device}, 3);
  ASSERT_EQ(objects.size(), 2u);
  EXPECT_EQ(objects[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
  EXPECT_EQ(objects[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
  for (const nlohmann::json& o : objects) {
    EXPECT_EQ(o["kind"], "DeviceMetadata");
    EXPECT_EQ(o["metadata"], (nlohmann::json{{"name", "claim-1"}, {"namespace", "ns"},
                                             {"uid", kUid1}, {"generation", 3}}));
    EXPECT_EQ(o["podClaimName"], "hcas");
    ASSERT_EQ(o["requests"].size(), 1u);
    EXPECT_EQ(o["requests"][0]["name"], "hca/two");
    EXPECT_EQ(o["requests"][0]["devices"],
              nlohmann::json::parse(R"([{"driver": "rdma.example.com", "pool": "node-a",
                                         "name": "hca-0000-1a-00-0",
                                         "attributes": {"a": {"int": 1}},
                                         "networkData": {"interfaceName": "eth0"}}])"));
  }
  const std::string text = MetadataStream(objects);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_NE(text.find("\n  \"kind\""), std::string::npos) << "pretty-printed: " << text;
  absl::StatusOr<std::vector<nlohmann::json>> back = ParseMetadataStream(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, objects);
  // A direct claim has no podClaimName; a device without attributes or network data has neither.
  const nlohmann::json plain =
      BuildDeviceMetadata(kDriver, kClaim, std::nullopt, "hca", {{kNode, kHca0, {}, {}}}, 1)[0];
  EXPECT_FALSE(plain.contains("podClaimName"));
  EXPECT_EQ(plain["requests"][0]["devices"][0].size(), 3u) << plain.dump();
  EXPECT_FALSE(ParseMetadataStream("{\"a\": 1}\n{\"b\":").ok());
  EXPECT_FALSE(ParseMetadataStream("[1]").ok());
}

TEST(DRAMetadataTest, AtMost32AttributesTheFirstByName) {
  nlohmann::json attributes = nlohmann::json::object();
  for (int i = 0; i < 40; ++i) attributes[absl::StrCat("a", 100 + i)] = {{"int", i}};
  const nlohmann::json o =
      BuildDeviceMetadata(kDriver, kClaim, std::nullopt, "hca", {{kNode, kHca0, attributes, {}}}, 1)[0];
  const nlohmann::json& kept = o["requests"][0]["devices"][0]["attributes"];
  ASSERT_EQ(kept.size(), kMaxMetadataAttributes);
  EXPECT_TRUE(kept.contains("a100"));
  EXPECT_TRUE(kept.contains("a131"));
  EXPECT_FALSE(kept.contains("a132"));
}

TEST(DRAMetadataTest, PrepareWritesEachRequestsFileAndADeviceThatMountsItReadOnly) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0), Dev(kHca1)});
  auto r = n.driver().Prepare({kClaim}).at(kClaim.uid);
  ASSERT_TRUE(r.ok()) << r.status();
  // The request's first device carries both CDI devices.
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].cdi_ids, (std::vector<std::string>{CdiDeviceId(kDriver, kUid1, "hca"),
                                                       MetadataCdiDeviceId(kDriver, kUid1, "hca")}));
  EXPECT_TRUE((*r)[1].cdi_ids.empty());
  EXPECT_EQ(MetadataCdiDeviceId(kDriver, kUid1, "hca"),
            std::string("rdma.example.com/hca=") + kUid1 + "_hca");

  const std::string host = n.metadata_dir() + "/" + kUid1 + "/hca/metadata.json";
  EXPECT_EQ(n.metadata().PathOf(kUid1, "hca"), host);
  EXPECT_EQ(std::filesystem::status(host).permissions() & std::filesystem::perms::all,
            std::filesystem::perms(0644));
  const nlohmann::json mount = SpecDeviceNamed(n, kUid1, MetadataCdiDeviceName(kUid1, "hca"));
  ASSERT_TRUE(mount.is_object()) << ReadJson(n.cdi().PathOf(kUid1)).dump();
  EXPECT_EQ(mount["containerEdits"],
            (nlohmann::json{{"mounts",
                             {{{"hostPath", host},
                               {"containerPath",
                                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/"
                                "claim-1/hca/rdma.example.com-metadata.json"},
                               {"options", {"ro", "bind"}}}}}}));

  const std::vector<nlohmann::json> stream = Stream(n, kClaim, "hca");
  ASSERT_EQ(stream.size(), 2u);
  EXPECT_EQ(stream[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
  EXPECT_EQ(stream[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
  const nlohmann::json& o = stream[0];
  EXPECT_EQ(o["metadata"]["generation"], 1);
  EXPECT_EQ(o["metadata"]["uid"], kUid1);
  EXPECT_FALSE(o.contains("podClaimName"));
  ASSERT_EQ(o["requests"].size(), 1u);
  EXPECT_EQ(o["requests"][0]["name"], "hca");
  const nlohmann::json& devices = o["requests"][0]["devices"];
  ASSERT_EQ(devices.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json& d = devices[i];
    const std::string name = i == 0 ? kHca0 : kHca1;
    EXPECT_EQ(d["driver"], kDriver);
    EXPECT_EQ(d["pool"], kNode);
    EXPECT_EQ(d["name"], name);
    // The attributes as the slices publish them (NetworkDataOfAnHcaWithANetdev: the rest).
    EXPECT_EQ(d["attributes"], PublishedAttributes(n, name));
    EXPECT_EQ(d["attributes"]["rdma.example.com/hcaName"]["string"], i == 0 ? "mlx5_0" : "mlx5_1");
    EXPECT_FALSE(d.contains("networkData")) << "FourCards' HCAs have no netdev";
  }
}

TEST(DRAMetadataTest, NetworkDataOfAnHcaWithANetdev) {
  sim::FixtureHca roce = rdp::testing::FixtureCard("mlx5_0", "0000:1a:00.0", 0, "pci0000:15");
  roce.netdevs = {"ens1f0np0", "ens1f0v0"};
  DraNode n({roce, rdp::testing::FixtureCard("mlx5_1", "0000:3a:00.0", 0, "pci0000:37")});
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0), Dev(kHca1)});
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kClaim.uid).ok());
  const nlohmann::json devices = Stream(n, kClaim, "hca").at(0)["requests"][0]["devices"];
  ASSERT_EQ(devices.size(), 2u);
  // As the claim's status.devices says it (the first netdev and its address).
  EXPECT_EQ(devices[0]["networkData"],
            nlohmann::json::parse(
                R"({"interfaceName": "ens1f0np0", "hardwareAddress": "02:00:1a:00:00:00"})"));
  EXPECT_FALSE(devices[1].contains("networkData")) << devices[1].dump();  // IB without IPoIB
}

TEST(DRAMetadataTest, ATemplatesClaimIsUnderItsPodClaimNameAndKeepsItAcrossARestart) {
  DraNode n;
  const ClaimRef made{"ns", kUid2, "trainer-hcas-x7k2q"};
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().SetPodClaimName(kUid2, "hcas");
  ASSERT_TRUE(n.driver().Prepare({made}).at(kUid2).ok());
  const std::string want =
      "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/hcas/hca/"
      "rdma.example.com-metadata.json";
  const nlohmann::json mount = SpecDeviceNamed(n, kUid2, MetadataCdiDeviceName(kUid2, "hca"));
  EXPECT_EQ(mount["containerEdits"]["mounts"][0]["containerPath"], want);
  EXPECT_EQ(mount["containerEdits"]["mounts"][0]["hostPath"],
            n.metadata_dir() + "/" + kUid2 + "/hca/metadata.json");
  EXPECT_EQ(Stream(n, made, "hca").at(0)["podClaimName"], "hcas");
  EXPECT_EQ(ReadJson(n.checkpoint_path())["claims"][kUid2]["podClaimName"], "hcas");
  // After a restart, with the API server gone, the spec rebuilt from the checkpoint says the same.
  const std::string spec = ReadJson(n.cdi().PathOf(kUid2)).dump();
  n.reader().SetDown(true);
  std::filesystem::remove(n.cdi().PathOf(kUid2));
  n.NewDriver();
  ASSERT_TRUE(n.driver().Prepare({made}).at(kUid2).ok());
  EXPECT_EQ(ReadJson(n.cdi().PathOf(kUid2)).dump(), spec);
}

// KEP-4816: a result of a firstAvailable subrequest is "<request>/<subrequest>". The kubelet and
// the pod spec know the request; the allocation, the checkpoint and the metadata content the
// subrequest it was met by.
TEST(DRAMetadataTest, ASubrequestsResultIsPreparedUnderItsRequestsName) {
  DraNode n;
  n.reader().Set(kClaim.uid,
                 std::vector<AllocatedDevice>{Dev(kHca0, "hcas/one"), Dev(kHca1, "gpu-near/any")});
  auto r = n.driver().Prepare({kClaim}).at(kClaim.uid);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<PreparedDevice>{
                    {{"hcas"}, kNode, kHca0,
                     {CdiDeviceId(kDriver, kUid1, "hcas"), MetadataCdiDeviceId(kDriver, kUid1, "hcas")},
                     ""},
                    {{"gpu-near"}, kNode, kHca1,
                     {CdiDeviceId(kDriver, kUid1, "gpu-near"),
                      MetadataCdiDeviceId(kDriver, kUid1, "gpu-near")},
                     ""}}));
  const nlohmann::json cp = ReadJson(n.checkpoint_path())["claims"][kUid1]["devices"];
  EXPECT_EQ(cp[0]["request"], "hcas/one");
  EXPECT_EQ(cp[1]["request"], "gpu-near/any");
  std::vector<std::string> names;
  const nlohmann::json spec = ReadJson(n.cdi().PathOf(kUid1));
  for (const auto& d : spec["devices"]) names.push_back(d["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{CdiDeviceName(kUid1, "hcas"),
                                             MetadataCdiDeviceName(kUid1, "hcas"),
                                             CdiDeviceName(kUid1, "gpu-near"),
                                             MetadataCdiDeviceName(kUid1, "gpu-near")}));
  EXPECT_EQ(Stream(n, kClaim, "hcas").at(0)["requests"][0]["name"], "hcas/one");
  EXPECT_EQ(Stream(n, kClaim, "gpu-near").at(0)["requests"][0]["name"], "gpu-near/any");
  EXPECT_EQ(SpecDeviceNamed(n, kUid1, MetadataCdiDeviceName(kUid1, "hcas"))["containerEdits"]
                           ["mounts"][0]["containerPath"],
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/claim-1/hcas/"
            "rdma.example.com-metadata.json");
  EXPECT_FALSE(std::filesystem::exists(n.metadata_dir() + "/" + kUid1 + "/hcas/one"));
}

TEST(DRAMetadataTest, UnprepareRemovesTheClaimsFiles) {
  DraNode n;
  n.reader().Set(kClaim.uid, std::vector<AllocatedDevice>{Dev(kHca0, "a"), Dev(kHca1, "b")});
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kClaim.uid).ok());
  ASSERT_TRUE(std::filesystem::exists(n.metadata().PathOf(kUid1, "a")));
  ASSERT_TRUE(std::filesystem::exists(n.metadata().PathOf(kUid1, "b")));
  ASSERT_TRUE(n.driver().Unprepare({kClaim}).at(kClaim.uid).ok());
  EXPECT_FALSE(std::filesystem::exists(n.metadata().ClaimDir(kUid1)));
  EXPECT_TRUE(std::filesystem::is_empty(n.metadata_dir()));
}

// Files are kept by claim uid: a claim deleted and re-created under its name (another uid) has
// files of its own, which the kubelet's unprepare of the old one leaves.
TEST(DRAMetadataTest, AClaimReCreatedUnderItsNameHasFilesOfItsOwn) {
  DraNode n;
  const ClaimRef old_claim{"ns", kUid2, "claim-1"};
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca1)});
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  ASSERT_TRUE(n.driver().Prepare({old_claim}).at(kUid2).ok());
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kUid1).ok());
  ASSERT_TRUE(n.driver().Unprepare({old_claim}).at(kUid2).ok());
  EXPECT_FALSE(std::filesystem::exists(n.metadata().ClaimDir(kUid2)));
  EXPECT_EQ(Stream(n, kClaim, "hca").at(0)["metadata"]["uid"], kUid1);
  ASSERT_TRUE(n.driver().Unprepare({kClaim}).at(kUid1).ok());
  EXPECT_FALSE(std::filesystem::exists(n.metadata().ClaimDir(kUid1)));
}

// A claim name may be 253 characters and its namespace 63: no host file name is made of them.
TEST(DRAMetadataTest, AClaimOfTheLongestNameInTheLongestNamespaceIsPrepared) {
  DraNode n;
  const ClaimRef longest{std::string(63, 'n'), kUid1, std::string(253, 'c')};
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  auto r = n.driver().Prepare({longest}).at(kUid1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Stream(n, longest, "hca").at(0)["metadata"]["name"], longest.name);
  EXPECT_EQ(SpecDeviceNamed(n, kUid1, MetadataCdiDeviceName(kUid1, "hca"))["containerEdits"]
                           ["mounts"][0]["containerPath"],
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/" + longest.name +
                "/hca/rdma.example.com-metadata.json");
}

TEST(DRAMetadataTest, StartReconcilesTheMetadataDirectoryWithTheCheckpoint) {
  DraNode n;
  const ClaimRef b{"ns", kUid2, "b"};
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  n.reader().Set(kUid2, std::vector<AllocatedDevice>{Dev(kHca1)});
  ASSERT_TRUE(n.driver().Prepare({kClaim, b}).at(kUid2).ok());
  const std::string fresh = ReadText(n.metadata().PathOf(kUid2, "hca"));
  // kClaim: its file was edited (or its HCA's attributes changed): written again as built now,
  // with the next generation.
  {
    std::vector<nlohmann::json> objects = Stream(n, kClaim, "hca");
    for (nlohmann::json& o : objects) o["requests"][0]["devices"][0]["attributes"] = {};
    std::ofstream(n.metadata().PathOf(kUid1, "hca"), std::ios::trunc) << MetadataStream(objects);
  }
  // b: its file is gone while its spec stays: written again (the spec's device mounts it).
  std::filesystem::remove(n.metadata().PathOf(kUid2, "hca"));
  // A claim the checkpoint does not hold, a write a crash interrupted, and a directory that is
  // not a claim's (left alone).
  const std::string orphan = n.metadata_dir() + "/" + kUid3 + "/hca";
  std::filesystem::create_directories(orphan);
  std::ofstream(orphan + "/metadata.json") << "{}";
  const std::string tmp = n.metadata_dir() + "/" + kUid1 + "/hca/.metadata.json.4242.0.tmp";
  std::ofstream(tmp) << "{";
  const std::string other = n.metadata_dir() + "/lost+found";
  std::filesystem::create_directories(other);

  n.reader().SetDown(true);
  n.NewDriver();

  EXPECT_FALSE(std::filesystem::exists(n.metadata_dir() + "/" + kUid3));
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_TRUE(std::filesystem::exists(other));
  EXPECT_EQ(ReadText(n.metadata().PathOf(kUid2, "hca")), fresh);
  const std::vector<nlohmann::json> rewritten = Stream(n, kClaim, "hca");
  ASSERT_EQ(rewritten.size(), 2u);
  EXPECT_EQ(rewritten[0]["metadata"]["generation"], 2);
  EXPECT_EQ(rewritten[0]["requests"][0]["devices"][0]["attributes"], PublishedAttributes(n, kHca0));
  // Unchanged: not written again (same generation, same text).
  n.NewDriver();
  EXPECT_EQ(Stream(n, kClaim, "hca").at(0)["metadata"]["generation"], 2);
  EXPECT_EQ(ReadText(n.metadata().PathOf(kUid2, "hca")), fresh);
}

TEST(DRAMetadataTest, AClaimTheKubeletForgotLosesItsFilesAtStart) {
  DraNode n;
  n.reader().Set(kUid1, std::vector<AllocatedDevice>{Dev(kHca0)});
  ASSERT_TRUE(n.driver().Prepare({kClaim}).at(kUid1).ok());
  ASSERT_TRUE(std::filesystem::exists(n.metadata().PathOf(kUid1, "hca")));
  // The claim leaves the checkpoint (as the kubelet-forgot rule or a crash between writes).
  nlohmann::json cp = ReadJson(n.checkpoint_path());
  cp["claims"].erase(kUid1);
  std::ofstream(n.checkpoint_path(), std::ios::trunc) << cp.dump();
  n.NewDriver();
  EXPECT_FALSE(std::filesystem::exists(n.metadata().ClaimDir(kUid1)));
}

}  // namespace
}  // namespace rdp::dra
