#pragma once

// Writing a file so that a reader (the container runtime's CDI cache, the plugin after a crash)
// sees the old content or the new, never a part: a temporary file beside it, fsync, rename,
// fsync of the directory.

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rdp::serving {

// Replaces `path` with `content`, mode `mode`. The temporary file is hidden
// (".<name>.<pid>.<n>.tmp", no .json suffix: a CDI cache watching the directory ignores it) and
// removed on failure.
// Internal naming the path and errno on failure; the old file is then untouched.
absl::Status WriteFileAtomically(const std::string& path, const std::string& content,
                                 unsigned mode);

// WriteFileAtomically unless `path` exists already: for a file named for its content (an
// allocation file, hca::AllocationFileName), written once however many containers get it.
absl::Status WriteFileUnlessThere(const std::string& path, const std::string& content,
                                  unsigned mode);

// The whole content of the file at `path`, as such files are read back: NotFound when there is
// none, Internal naming the path and errno when it cannot be read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Removes `path` and syncs its directory; a missing file is OK.
absl::Status RemoveFile(const std::string& path);

// The final name a temporary file of WriteFileAtomically stands for (".x.json.12.0.tmp" ->
// "x.json"), or "" when `name` is not one.
std::string TemporaryFileTarget(std::string_view name);

// Removes the temporary files that writes interrupted before their rename (a crash, a kill) left
// in `dir`, those whose final name `ours` accepts; returns their paths. For a directory whose
// files of that kind no one else writes at the time (the caller holds the plugin directory's
// lock). A missing directory has none; Internal when it cannot be listed.
absl::StatusOr<std::vector<std::string>> RemoveTemporaryFiles(
    const std::string& dir, const std::function<bool(std::string_view)>& ours);

}  // namespace rdp::serving
