#include "test/support/temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>

namespace rdp::testing {

TempDir::TempDir() {
  std::string templ = "/tmp/rdpt-XXXXXX";
  if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp " + templ + " failed");
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace rdp::testing
