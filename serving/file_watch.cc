#include "serving/file_watch.h"

#include <poll.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace rdp::serving {

absl::Status WaitForStopOrFatal(int stop_fd, int fatal_fd,
                                const std::function<absl::Status()>& fatal) {
  for (;;) {
    struct pollfd fds[2] = {{stop_fd, POLLIN, 0}, {fatal_fd, POLLIN, 0}};
    const int ready = ::poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      return absl::InternalError(
          absl::StrCat("waiting for a stop signal: ", std::strerror(errno)));
    }
    if (fds[1].revents & POLLIN) return fatal();
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) return absl::OkStatus();
  }
}

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
