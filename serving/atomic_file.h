#pragma once

// Writing a file so that a reader (the container runtime's CDI cache, the plugin after a crash)
// sees the old content or the new, never a part: a temporary file beside it, fsync, rename,
// fsync of the directory.

#include <string>

#include "absl/status/status.h"

namespace rdp::serving {

// Replaces `path` with `content`, mode `mode`. The temporary file is hidden
// (".<name>.<pid>.<n>.tmp", no .json suffix: a CDI cache watching the directory ignores it) and
// removed on failure.
// Internal naming the path and errno on failure; the old file is then untouched.
absl::Status WriteFileAtomically(const std::string& path, const std::string& content,
                                 unsigned mode);

// Removes `path` and syncs its directory; a missing file is OK.
absl::Status RemoveFile(const std::string& path);

}  // namespace rdp::serving
