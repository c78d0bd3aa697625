#include "serving/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace rdp::serving {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("fsync", dir);
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, const std::string& content,
                                 unsigned mode) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path final_path(path);
  const std::string dir = final_path.parent_path().string();
  const std::string temp =
      (final_path.parent_path() /
       absl::StrCat(".", final_path.filename().string(), ".", ::getpid(), ".", counter++, ".tmp"))
          .string();
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return Errno("create", temp);
  auto fail = [&](const char* what) {
    absl::Status s = Errno(what, temp);
    ::close(fd);
    ::unlink(temp.c_str());
    return s;
  };
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write");
    done += static_cast<std::size_t>(n);
  }
  // The umask may have narrowed the mode given to open.
  if (::fchmod(fd, mode) != 0) return fail("chmod");
  if (::fsync(fd) != 0) return fail("fsync");
  if (::close(fd) != 0) {
    absl::Status s = Errno("close", temp);
    ::unlink(temp.c_str());
    return s;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status s = Errno(absl::StrCat("rename ", temp, " to").c_str(), path);
    ::unlink(temp.c_str());
    return s;
  }
  return SyncDir(dir);
}

absl::Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("remove", path);
  }
  return SyncDir(std::filesystem::path(path).parent_path().string());
}

}  // namespace rdp::serving
