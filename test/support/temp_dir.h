#pragma once

// A directory under $TMPDIR (or /tmp) that lives as long as the object; removed with its contents.

#include <string>

namespace rdp::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Absolute path of a file in test/data/.
std::string TestData(const std::string& name);

}  // namespace rdp::testing
