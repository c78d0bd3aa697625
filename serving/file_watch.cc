#include "serving/file_watch.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace rdp::serving {

std::uint64_t FileId(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  const std::uint64_t ctime_ns = static_cast<std::uint64_t>(st.st_ctim.tv_sec) * 1000000000u +
                                 static_cast<std::uint64_t>(st.st_ctim.tv_nsec);
  return ((static_cast<std::uint64_t>(st.st_ino) * 1000003u) ^ ctime_ns) | 1u;
}

std::uint64_t DirId(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
  return (static_cast<std::uint64_t>(st.st_dev) << 40) ^ static_cast<std::uint64_t>(st.st_ino);
}

}  // namespace rdp::serving
