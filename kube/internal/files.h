#pragma once

// Reading the API client's small files (tokens, certificates, kubeconfigs). Internal to kube/.

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace rdp::kube::internal {

// The whole file, at most `max_bytes` (a larger one is refused: these files are kilobytes).
// NotFound when missing, PermissionDenied when unreadable, FailedPrecondition when too large;
// the message names the file.
inline absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                                 std::size_t max_bytes = 1 << 20) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat(path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::FailedPreconditionError(why);
  }
  std::string content;
  content.resize(max_bytes + 1);
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  if (in.bad()) return absl::FailedPreconditionError(absl::StrCat(path, ": read error"));
  content.resize(static_cast<std::size_t>(in.gcount()));
  if (content.size() > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": larger than ", max_bytes, " bytes"));
  }
  return content;
}

}  // namespace rdp::kube::internal
