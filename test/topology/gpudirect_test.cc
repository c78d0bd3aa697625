// GPUDirect RDMA detection (topology/gpudirect.h) on fixture trees laid out by
// sim::SysfsFixture::AddGpuDirect.

#include "topology/gpudirect.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/sysfs_fixture.h"
#include "test/support/temp_dir.h"

namespace rdp::topology {
namespace {
using ::testing::HasSubstr;

constexpr char kOpen[] =
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:15:33 UTC 2024";
constexpr char kProprietary[] =
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023";

GpuDirectState Read(const sim::FixtureGpuDirect& g) {
  rdp::testing::TempDir dir;
  sim::SysfsFixture fixture(dir.path());
  EXPECT_TRUE(fixture.AddGpuDirect(g).ok());
  NodeRoots roots;
  roots.sysfs = roots.proc = dir.path();
  return ReadGpuDirect(*NewNodeEnv(roots));
}

TEST(GpuDirectTest, NothingOnANodeWithoutNvidia) {
  const GpuDirectState s = Read({});
  EXPECT_FALSE(s.Available());
  EXPECT_EQ(s.nvidia_driver, "");
  EXPECT_EQ(s.kernel_release, "6.8.0-45-generic");
  EXPECT_EQ(s.Summary(),
            "GPUDirect RDMA unavailable: nvidia-peermem no (not loaded); dma-buf no (no NVIDIA "
            "driver is loaded: no /proc/driver/nvidia/version)");
}

TEST(GpuDirectTest, PeermemLoadedFromSysModuleOrProcModules) {
  for (const char* where : {"sysfs", "proc-modules"}) {
    sim::FixtureGpuDirect g;
    g.peermem = where;
    g.nvidia_version = kProprietary;
    const GpuDirectState s = Read(g);
    EXPECT_TRUE(s.peermem.available) << where;
    EXPECT_THAT(s.peermem.detail, HasSubstr("nvidia_peermem loaded")) << where;
    EXPECT_TRUE(s.Available());
    EXPECT_EQ(s.nvidia_driver, "535.104.05");
    EXPECT_FALSE(s.open_kernel_module);
    EXPECT_FALSE(s.dmabuf.available);
    EXPECT_THAT(s.dmabuf.detail, HasSubstr("proprietary kernel module"));
  }
}

TEST(GpuDirectTest, PeermemMustBeRegisteredWhereTheRdmaCoreHasMemoryPeers) {
  sim::FixtureGpuDirect g;
  g.peermem = "sysfs";
  g.memory_peers_dir = true;  // MLNX_OFED's ib_core, without nv_mem
  GpuDirectState s = Read(g);
  EXPECT_FALSE(s.peermem.available);
  EXPECT_THAT(s.peermem.detail, HasSubstr("not registered"));

  g.registered = true;
  s = Read(g);
  EXPECT_TRUE(s.peermem.available);
  EXPECT_THAT(s.peermem.detail, HasSubstr("registered as memory peer nv_mem"));
}

TEST(GpuDirectTest, DmaBufNeedsTheOpenModuleAndKernel512) {
  sim::FixtureGpuDirect g;
  g.nvidia_version = kOpen;
  GpuDirectState s = Read(g);
  EXPECT_TRUE(s.dmabuf.available) << s.dmabuf.detail;
  EXPECT_TRUE(s.open_kernel_module);
  EXPECT_EQ(s.nvidia_driver, "550.54.15");
  EXPECT_FALSE(s.peermem.available);
  EXPECT_TRUE(s.Available());
  EXPECT_THAT(s.Summary(), HasSubstr("GPUDirect RDMA available"));

  g.kernel_release = "5.10.0-28-amd64";
  s = Read(g);
  EXPECT_FALSE(s.dmabuf.available);
  EXPECT_THAT(s.dmabuf.detail, HasSubstr("older than 5.12"));

  g.kernel_release = "5.12.0";
  EXPECT_TRUE(Read(g).dmabuf.available);

  g.kernel_release = "garbage";
  EXPECT_THAT(Read(g).dmabuf.detail, HasSubstr("kernel version is unknown"));
}

}  // namespace
}  // namespace rdp::topology
