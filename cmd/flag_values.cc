#include "cmd/flag_values.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rdp::cmd {

absl::StatusOr<absl::Duration> DurationFlag(absl::string_view flag, const std::string& text,
                                            bool positive) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || (positive && d <= absl::ZeroDuration())) {
    const absl::string_view kind = positive ? "a positive duration" : "a duration";
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", text, "': not ", kind, " such as 5s, 500ms or 10m"));
  }
  return d;
}

}  // namespace rdp::cmd
