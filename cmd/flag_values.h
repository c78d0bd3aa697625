#pragma once

// Flag values that need more than CLI11's own conversions; every error names the flag and the
// text it was given, so that the subcommand exits 2 with a message the operator can act on.

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rdp::cmd {

// `text`, the value of `flag`, as a duration ("5s", "500ms", "10m"). `positive`: zero and
// negative durations are refused too.
absl::StatusOr<absl::Duration> DurationFlag(absl::string_view flag, const std::string& text,
                                            bool positive = true);

}  // namespace rdp::cmd
