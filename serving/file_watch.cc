#include "serving/file_watch.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace rdp::serving {
namespace {

// Never 0 (that is "no file").
std::uint64_t DeviceAndInode(const struct stat& st) {
  return ((static_cast<std::uint64_t>(st.st_dev) << 40) ^ static_cast<std::uint64_t>(st.st_ino)) |
         (std::uint64_t{1} << 63);
}

}  // namespace

std::uint64_t FileId(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return DeviceAndInode(st);
}

std::uint64_t DirId(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
  return DeviceAndInode(st);
}

}  // namespace rdp::serving
