#include "serving/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
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

absl::Status WriteFileUnlessThere(const std::string& path, const std::string& content,
                                  unsigned mode) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return absl::OkStatus();
  return WriteFileAtomically(path, content, mode);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no file ", path));
    return Errno("read", path);
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("remove", path);
  }
  return SyncDir(std::filesystem::path(path).parent_path().string());
}

std::string TemporaryFileTarget(std::string_view text) {
  // ".<name>.<pid>.<n>.tmp"
  absl::string_view name(text.data(), text.size());
  if (!absl::ConsumePrefix(&name, ".") || !absl::ConsumeSuffix(&name, ".tmp")) return "";
  for (int field = 0; field < 2; ++field) {  // <n>, then <pid>
    const std::size_t dot = name.rfind('.');
    if (dot == absl::string_view::npos || dot + 1 == name.size()) return "";
    for (const char c : name.substr(dot + 1)) {
      if (!absl::ascii_isdigit(c)) return "";
    }
    name = name.substr(0, dot);
  }
  return std::string(name);
}

absl::StatusOr<std::vector<std::string>> RemoveTemporaryFiles(
    const std::string& dir, const std::function<bool(std::string_view)>& ours) {
  std::vector<std::string> removed;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return removed;
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string target = TemporaryFileTarget(it->path().filename().string());
    if (target.empty() || !ours(target)) continue;
    if (::unlink(it->path().c_str()) != 0 && errno != ENOENT) {
      return Errno("remove", it->path().string());
    }
    removed.push_back(it->path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  if (!removed.empty()) {
    if (absl::Status s = SyncDir(dir); !s.ok()) return s;
  }
  return removed;
}

}  // namespace rdp::serving
