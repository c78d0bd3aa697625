#pragma once

// A fresh directory under /tmp that lives as long as the object; removed with its contents. Short
// on purpose: unix socket paths (a plugin's socket in it) are limited to 107 bytes.

#include <string>

namespace rdp::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The tree's paths, defined in build_paths.cc (the one file compiled with them).
// Absolute path of a file in test/data/.
std::string TestData(const std::string& name);

// The rdma-device-plugin binary of this build, for the tests that run it.
std::string PluginBinary();

}  // namespace rdp::testing
