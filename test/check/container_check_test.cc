#include "check/container_check.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "check/gpudirect_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/sysfs_fixture.h"

namespace rdp::check {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using Names = std::vector<std::string>;

// ---- ParseAllocation ------------------------------------------------------------------------

// A container holding several resources (or DRA requests) has each one's HCAs under its own
// RDMA_HCA_NAMES_<suffix>: the allocation is all of them, whichever sets the plain name.
TEST(AllocatedHcaNamesTest, JoinsThePlainAndEveryOwnName) {
  EXPECT_EQ(AllocatedHcaNames({"PATH=/bin", "NCCL_IB_HCA==mlx5_0"}), std::nullopt);
  EXPECT_EQ(AllocatedHcaNames({"RDMA_HCA_NAMES=mlx5_0", "RDMA_HCA_NAMES_RDMA_HCA=mlx5_0",
                               "RDMA_HCA_NAMESAKE=mlx5_9", "RDMA_HCA_NAMES_RDMA_STORAGE=mlx5_4",
                               "RDMA_HCA_PCI_RDMA_STORAGE=0000:31:00.0"}),
            "mlx5_0,mlx5_0,mlx5_4");
  EXPECT_EQ(AllocatedHcaNames({"RDMA_HCA_NAMES_0f3b_hca=mlx5_2"}), "mlx5_2");
  const Allocation a = ParseAllocation(
      AllocatedHcaNames({"RDMA_HCA_NAMES=mlx5_0", "RDMA_HCA_NAMES_RDMA_STORAGE=mlx5_4"}),
      "=mlx5_0");
  EXPECT_EQ(a.names, (Names{"mlx5_0", "mlx5_4"}));
}

TEST(ParseAllocationTest, NeitherSetMeansNothingAllocated) {
  const Allocation a = ParseAllocation(std::nullopt, std::nullopt);
  EXPECT_EQ(a.source, Allocation::Source::kNone);
  EXPECT_TRUE(a.names.empty());
}

TEST(ParseAllocationTest, RdmaHcaNamesWinsOverNccl) {
  const Allocation a = ParseAllocation(" mlx5_3, mlx5_0,mlx5_3 ,", "=mlx5_7");
  EXPECT_EQ(a.source, Allocation::Source::kRdmaHcaNames);
  EXPECT_EQ(a.names, (Names{"mlx5_0", "mlx5_3"}));
}

TEST(ParseAllocationTest, EmptyRdmaHcaNamesIsAnEmptyAllocation) {
  const Allocation a = ParseAllocation("", "=mlx5_7");
  EXPECT_EQ(a.source, Allocation::Source::kRdmaHcaNames);
  EXPECT_TRUE(a.names.empty());
}

TEST(ParseAllocationTest, NcclExactFormWithPorts) {
  const Allocation a = ParseAllocation(std::nullopt, "=mlx5_bond_0:1,mlx5_10:1,mlx5_1");
  EXPECT_EQ(a.source, Allocation::Source::kNcclIbHca);
  EXPECT_EQ(a.names, (Names{"mlx5_1", "mlx5_10", "mlx5_bond_0"}));
  EXPECT_TRUE(a.notes.empty());
}

TEST(ParseAllocationTest, NcclPrefixFormIsComparedExactlyWithANote) {
  const Allocation a = ParseAllocation(std::nullopt, "mlx5_1");
  EXPECT_EQ(a.source, Allocation::Source::kNcclIbHca);
  EXPECT_EQ(a.names, (Names{"mlx5_1"}));
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_THAT(a.notes[0], HasSubstr("prefixes"));
}

TEST(ParseAllocationTest, NcclExcludeListIsNotAnAllocation) {
  const Allocation a = ParseAllocation(std::nullopt, "^mlx5_0,mlx5_1");
  EXPECT_EQ(a.source, Allocation::Source::kNone);
  EXPECT_TRUE(a.names.empty());
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_THAT(a.notes[0], HasSubstr("exclude"));
}

// ---- Compare --------------------------------------------------------------------------------

HcaAccess Open(const std::string& name) { return {name, "", "", true, ""}; }
HcaAccess Closed(const std::string& name) {
  return {name, "", "", false, "No such file or directory"};
}
Allocation Given(Names names) {
  Allocation a;
  a.source = Allocation::Source::kRdmaHcaNames;
  a.names = std::move(names);
  return a;
}

TEST(CompareTest, ExactlyTheAllocatedOnesIsAMatch) {
  const CheckReport r =
      Compare({Closed("mlx5_1"), Open("mlx5_2"), Open("mlx5_0")}, Given({"mlx5_0", "mlx5_2"}));
  EXPECT_EQ(r.verdict, Verdict::kMatch);
  EXPECT_EQ(r.ExitCode(), 0);
  EXPECT_EQ(r.openable, (Names{"mlx5_0", "mlx5_2"}));
  EXPECT_THAT(r.explanation, HasSubstr("exactly the 2 HCAs"));
  ASSERT_EQ(r.hcas.size(), 3u);
  EXPECT_EQ(r.hcas[0].name, "mlx5_0");  // sorted for display
}

TEST(CompareTest, MoreThanAllocatedNamesTheMofedCause) {
  const CheckReport r =
      Compare({Open("mlx5_0"), Open("mlx5_1"), Open("mlx5_2")}, Given({"mlx5_1"}));
  EXPECT_EQ(r.verdict, Verdict::kMore);
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_EQ(r.extra, (Names{"mlx5_0", "mlx5_2"}));
  EXPECT_TRUE(r.missing.empty());
  EXPECT_THAT(r.explanation, HasSubstr("MOFED_ENABLED"));
  EXPECT_THAT(r.explanation, HasSubstr("NVIDIA_MOFED=true"));
  EXPECT_THAT(r.explanation, HasSubstr("mlx5_0,mlx5_2"));
}

TEST(CompareTest, FewerThanAllocatedNamesTheMissingOnes) {
  const CheckReport r = Compare({Open("mlx5_0"), Closed("mlx5_1")}, Given({"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(r.verdict, Verdict::kFewer);
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_EQ(r.missing, (Names{"mlx5_1"}));
  EXPECT_THAT(r.explanation, HasSubstr("cannot open mlx5_1"));
  EXPECT_THAT(r.explanation, Not(HasSubstr("MOFED")));
}

TEST(CompareTest, AllocatedNameNotOnTheNodeIsMissing) {
  const CheckReport r = Compare({Open("mlx5_0")}, Given({"mlx5_0", "mlx5_9"}));
  EXPECT_EQ(r.verdict, Verdict::kFewer);
  EXPECT_EQ(r.missing, (Names{"mlx5_9"}));
}

TEST(CompareTest, BothExtraAndMissingIsDifferent) {
  const CheckReport r = Compare({Open("mlx5_0"), Closed("mlx5_1")}, Given({"mlx5_1"}));
  EXPECT_EQ(r.verdict, Verdict::kDifferent);
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_EQ(r.extra, (Names{"mlx5_0"}));
  EXPECT_EQ(r.missing, (Names{"mlx5_1"}));
}

TEST(CompareTest, NoAllocationAndNothingOpenableIsAMatch) {
  const CheckReport r = Compare({Closed("mlx5_0")}, Allocation{});
  EXPECT_EQ(r.verdict, Verdict::kMatch);
  EXPECT_THAT(r.explanation, HasSubstr("can open none"));
}

TEST(CompareTest, NoAllocationButOpenableDevicesIsMore) {
  const CheckReport r = Compare({Open("mlx5_0")}, Allocation{});
  EXPECT_EQ(r.verdict, Verdict::kMore);
  EXPECT_THAT(r.explanation, HasSubstr("neither RDMA_HCA_NAMES nor NCCL_IB_HCA"));
}

TEST(CompareTest, JsonCarriesTheVerdictAndSets) {
  const nlohmann::json j = ToJson(Compare({Open("mlx5_0"), Open("mlx5_1")}, Given({"mlx5_1"})));
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["verdict"], "more");
  EXPECT_EQ(j["allocation_source"], "RDMA_HCA_NAMES");
  EXPECT_EQ(j["extra"], nlohmann::json::array({"mlx5_0"}));
  EXPECT_EQ(j["hcas"].size(), 2u);
  EXPECT_EQ(j["hcas"][0]["openable"], true);
}

// ---- on fake sysfs and /dev trees -----------------------------------------------------------

class CheckOnFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "check_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    fixture_ = std::make_unique<sim::SysfsFixture>(root_);
    // A DGX-like node: 4 HCAs on two PCIe roots, two NUMA nodes.
    const char* pcis[] = {"0000:1a:00.0", "0000:3c:00.0", "0000:9a:00.0", "0000:bc:00.0"};
    const char* roots[] = {"pci0000:15", "pci0000:37", "pci0000:98", "pci0000:b9"};
    for (int i = 0; i < 4; ++i) {
      sim::FixtureHca hca;
      hca.name = "mlx5_" + std::to_string(i);
      hca.pci = pcis[i];
      hca.numa = i / 2;
      hca.pcie_root = roots[i];
      ASSERT_TRUE(fixture_->AddHca(hca).ok());
    }
    ASSERT_TRUE(fixture_->AddRdmaCm().ok());
    options_.sysfs_root = root_;
    options_.dev_root = root_;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  int Run(const std::optional<std::string>& names, const std::optional<std::string>& nccl) {
    out_.str("");
    err_.str("");
    return RunCheck(options_, names, nccl, out_, err_);
  }

  std::string root_;
  std::unique_ptr<sim::SysfsFixture> fixture_;
  CheckOptions options_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(CheckOnFixtureTest, EveryDeviceInjectedIsTheMofedHazard) {
  EXPECT_EQ(Run("mlx5_0,mlx5_2", std::nullopt), 1) << out_.str() << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("FAIL: "));
  EXPECT_THAT(out_.str(), HasSubstr("mlx5_1,mlx5_3"));
  EXPECT_THAT(out_.str(), HasSubstr("NVIDIA_MOFED=true"));
}

TEST_F(CheckOnFixtureTest, OnlyTheAllocatedDevicesIsOk) {
  ASSERT_TRUE(fixture_->RemoveUverbs("mlx5_1").ok());
  ASSERT_TRUE(fixture_->RemoveUverbs("mlx5_3").ok());
  EXPECT_EQ(Run("mlx5_0,mlx5_2", std::nullopt), 0) << out_.str() << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("OK: "));
  EXPECT_THAT(out_.str(), HasSubstr("uverbs1"));  // the table lists every HCA, openable or not
  // The same allocation in NCCL's exact form, with ports.
  EXPECT_EQ(Run(std::nullopt, "=mlx5_0:1,mlx5_2:1"), 0) << out_.str();
}

TEST_F(CheckOnFixtureTest, AnAllocatedDeviceNotInjectedIsFewer) {
  for (const char* name : {"mlx5_1", "mlx5_2", "mlx5_3"}) {
    ASSERT_TRUE(fixture_->RemoveUverbs(name).ok());
  }
  EXPECT_EQ(Run("mlx5_0,mlx5_2", std::nullopt), 1);
  EXPECT_THAT(out_.str(), HasSubstr("cannot open mlx5_2"));
  EXPECT_THAT(out_.str(), HasSubstr("No such file or directory"));
}

// A character device with no driver behind it (a node where the HCA's kernel module is not
// loaded, or a real node's test machine without RDMA hardware) fails open() with ENXIO after the
// device cgroup let it through: it counts as reachable, so a leak is reported there too.
TEST_F(CheckOnFixtureTest, ADeviceWithoutADriverCountsAsReachable) {
  const std::string node = root_ + "/dev/infiniband/uverbs1";
  ASSERT_EQ(::unlink(node.c_str()), 0);
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(231, 251)) != 0) {
    GTEST_SKIP() << "mknod needs CAP_MKNOD: " << std::strerror(errno);
  }
  const int fd = ::open(node.c_str(), O_RDWR | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
  if (fd >= 0 || (errno != ENXIO && errno != ENODEV)) {
    GTEST_SKIP() << "231:251 here is not a device without a driver (" << std::strerror(errno) << ")";
  }
  ASSERT_TRUE(fixture_->RemoveUverbs("mlx5_3").ok());
  options_.json = true;
  EXPECT_EQ(Run("mlx5_0,mlx5_2", std::nullopt), 1) << out_.str();
  const nlohmann::json j = nlohmann::json::parse(out_.str());
  EXPECT_EQ(j["verdict"], "more");
  EXPECT_EQ(j["extra"], nlohmann::json::array({"mlx5_1"}));
}

TEST_F(CheckOnFixtureTest, SharedModeSeesEveryHcaAndIsOk) {
  EXPECT_EQ(Run("mlx5_0,mlx5_1,mlx5_2,mlx5_3", std::nullopt), 0) << out_.str();
}

TEST_F(CheckOnFixtureTest, JsonOutputParses) {
  options_.json = true;
  EXPECT_EQ(Run("mlx5_3", std::nullopt), 1);
  const nlohmann::json j = nlohmann::json::parse(out_.str());
  EXPECT_EQ(j["verdict"], "more");
  EXPECT_EQ(j["openable"], nlohmann::json::array({"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}));
  EXPECT_EQ(j["hcas"][3]["uverbs"], "uverbs3");
  EXPECT_EQ(j["hcas"][3]["pci"], "0000:bc:00.0");
}

TEST_F(CheckOnFixtureTest, MissingSysfsRootIsExit2) {
  options_.sysfs_root = root_ + "/does-not-exist";
  EXPECT_EQ(Run("mlx5_0", std::nullopt), 2);
  EXPECT_THAT(err_.str(), HasSubstr("cannot list HCAs"));
  EXPECT_TRUE(out_.str().empty());
}

// --- GPUDirect RDMA in the container ---

topology::GpuDirectState PeermemNode() {
  topology::GpuDirectState node;
  node.peermem = {true, "nvidia_peermem loaded, seen in /sys/module"};
  node.dmabuf = {false, "no NVIDIA driver is loaded: no /proc/driver/nvidia/version"};
  return node;
}

TEST(GpuDirectCheckTest, PossibleWithAnHcaAGpuAndAMechanism) {
  const GpuDirectReport r = AssessGpuDirect(PeermemNode(), {"nvidia0"}, {"mlx5_0"}, std::nullopt);
  EXPECT_TRUE(r.possible);
  EXPECT_TRUE(r.reasons.empty());
  EXPECT_TRUE(r.memlock_note.empty());
}

TEST(GpuDirectCheckTest, EveryMissingPieceIsAReason) {
  const GpuDirectReport r =
      AssessGpuDirect(topology::GpuDirectState{}, {}, {}, std::uint64_t{8} << 20);
  EXPECT_FALSE(r.possible);
  ASSERT_EQ(r.reasons.size(), 3u);
  EXPECT_THAT(r.reasons[0], HasSubstr("can open no HCA"));
  EXPECT_THAT(r.reasons[1], HasSubstr("sees no NVIDIA GPU"));
  EXPECT_THAT(r.reasons[2], HasSubstr("no mechanism"));
  EXPECT_THAT(r.memlock_note, HasSubstr("RLIMIT_MEMLOCK is 8Mi"));
  EXPECT_TRUE(AssessGpuDirect(PeermemNode(), {"nvidia0"}, {"mlx5_0"}, ~std::uint64_t{0})
                  .memlock_note.empty());
}

TEST_F(CheckOnFixtureTest, SaysWhetherGpuDirectRdmaCanWorkHere) {
  options_.proc_root = root_;
  options_.memlock = std::uint64_t{64} << 10;  // the runtime's 64 KiB
  // No GPU, no mechanism.
  EXPECT_EQ(Run("mlx5_0,mlx5_1,mlx5_2,mlx5_3", std::nullopt), 0) << out_.str();
  EXPECT_THAT(out_.str(), HasSubstr("GPUDirect RDMA: not possible here: this container sees no "
                                    "NVIDIA GPU (/dev/nvidiaN); the node has no mechanism"));
  EXPECT_THAT(out_.str(), HasSubstr("locked memory: RLIMIT_MEMLOCK 64Ki"));
  EXPECT_THAT(out_.str(), HasSubstr("note: RLIMIT_MEMLOCK is 64Ki"));
  options_.require_gpudirect = true;
  EXPECT_EQ(Run("mlx5_0,mlx5_1,mlx5_2,mlx5_3", std::nullopt), 1);

  // nvidia-peermem loaded, a GPU injected, the limit raised.
  sim::FixtureGpuDirect g;
  g.peermem = "proc-modules";
  ASSERT_TRUE(fixture_->AddGpuDirect(g).ok());
  std::ofstream(fs::path(root_) / "dev" / "nvidia0") << "";
  std::ofstream(fs::path(root_) / "dev" / "nvidiactl") << "";  // not a GPU
  options_.memlock = ~std::uint64_t{0};
  EXPECT_EQ(Run("mlx5_0,mlx5_1,mlx5_2,mlx5_3", std::nullopt), 0) << out_.str();
  EXPECT_THAT(out_.str(), HasSubstr("GPUDirect RDMA: possible (1 GPU(s): nvidia0; GPUDirect RDMA "
                                    "available: nvidia-peermem yes (nvidia_peermem loaded, seen "
                                    "in /proc/modules)"));
  EXPECT_THAT(out_.str(), HasSubstr("locked memory: RLIMIT_MEMLOCK unlimited"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("note: RLIMIT_MEMLOCK")));

  options_.json = true;
  EXPECT_EQ(Run("mlx5_0,mlx5_1,mlx5_2,mlx5_3", std::nullopt), 0);
  const nlohmann::json j = nlohmann::json::parse(out_.str());
  EXPECT_EQ(j["gpudirect"]["possible"], true);
  EXPECT_EQ(j["gpudirect"]["gpus"], nlohmann::json::array({"nvidia0"}));
  EXPECT_EQ(j["gpudirect"]["mechanisms"]["nvidia-peermem"]["available"], true);
  EXPECT_EQ(j["gpudirect"]["mechanisms"]["dma-buf"]["available"], false);
  EXPECT_EQ(j["gpudirect"]["memlock"], "unlimited");
}

TEST(CheckEmptyNodeTest, NoHcasAndNoAllocationIsOk) {
  std::string tmpl = (fs::temp_directory_path() / "check_test.XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  fs::create_directories(fs::path(tmpl) / "sys" / "class");
  CheckOptions options;
  options.sysfs_root = options.dev_root = tmpl;
  std::ostringstream out, err;
  EXPECT_EQ(RunCheck(options, std::nullopt, std::nullopt, out, err), 0) << out.str() << err.str();
  EXPECT_THAT(out.str(), HasSubstr("no RDMA devices"));
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace rdp::check
