// The temporary files of WriteFileAtomically: which names are one, and that the clean-up at start
// removes exactly those of the final names asked for.

#include "serving/atomic_file.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "test/support/temp_dir.h"

namespace rdp::serving {
namespace {

// The files both doors write atomically: the DRA driver's checkpoint and CDI specs, the device
// plugin's /etc/rdma/allocation.json files.

TEST(AtomicFileTest, TemporaryFileTargetNamesTheFinalFile) {
  EXPECT_EQ(TemporaryFileTarget(".checkpoint.json.123.0.tmp"), "checkpoint.json");
  EXPECT_EQ(TemporaryFileTarget(".d-hca_0c1a.json.7.42.tmp"), "d-hca_0c1a.json");
  for (const char* not_one : {"checkpoint.json", ".checkpoint.json.tmp", "checkpoint.json.1.2.tmp",
                              ".checkpoint.json.1.x.tmp", ".checkpoint.json.1..tmp",
                              ".checkpoint.json.1.2.tmp~", ".1.2.tmp", ""}) {
    EXPECT_EQ(TemporaryFileTarget(not_one), "") << not_one;
  }
}

TEST(AtomicFileTest, RemoveTemporaryFilesRemovesOnlyThoseAskedFor) {
  rdp::testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Sub("a.json"), "{}\n", 0644).ok());
  for (const char* name : {".a.json.1.0.tmp", ".b.json.2.0.tmp", "a.json.1.0.tmp"}) {
    std::ofstream(dir.Sub(name)) << "{";
  }
  auto removed = RemoveTemporaryFiles(dir.path(), [](std::string_view t) { return t == "a.json"; });
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, std::vector<std::string>{dir.Sub(".a.json.1.0.tmp")});
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("a.json")));
  EXPECT_TRUE(std::filesystem::exists(dir.Sub(".b.json.2.0.tmp")));
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("a.json.1.0.tmp")));
  auto none = RemoveTemporaryFiles(dir.Sub("missing"), [](std::string_view) { return true; });
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

// A file named for its content is written once: one that is there already is left as it is
// (both doors' allocation files); a missing one is written, and a failure names the path.
TEST(AtomicFileTest, WriteFileUnlessThereWritesOnlyAMissingFile) {
  rdp::testing::TempDir dir;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  ASSERT_TRUE(WriteFileUnlessThere(dir.Sub("a.json"), "first\n", 0644).ok());
  EXPECT_EQ(read(dir.Sub("a.json")), "first\n");
  ASSERT_TRUE(WriteFileUnlessThere(dir.Sub("a.json"), "second\n", 0644).ok());
  EXPECT_EQ(read(dir.Sub("a.json")), "first\n");
  const absl::Status missing_dir = WriteFileUnlessThere(dir.Sub("none/b.json"), "x", 0644);
  EXPECT_FALSE(missing_dir.ok());
  EXPECT_NE(missing_dir.message().find(dir.Sub("none")), std::string::npos) << missing_dir;
}

TEST(AtomicFileTest, ReadWholeFileReadsBackWhatWasWrittenAndSaysWhenThereIsNone) {
  rdp::testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Sub("a.json"), "{\"a\": 1}\n{\"b\": 2}\n", 0644).ok());
  absl::StatusOr<std::string> text = ReadWholeFile(dir.Sub("a.json"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"a\": 1}\n{\"b\": 2}\n");
  const absl::StatusOr<std::string> none = ReadWholeFile(dir.Sub("none.json"));
  EXPECT_TRUE(absl::IsNotFound(none.status())) << none.status();
  EXPECT_NE(none.status().message().find(dir.Sub("none.json")), std::string::npos);
}

}  // namespace
}  // namespace rdp::serving
