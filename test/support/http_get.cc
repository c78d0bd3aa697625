#include "test/support/http_get.h"

#include "absl/strings/str_split.h"

namespace rdp::testing {

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

bool HasLine(const std::string& text, const std::string& line) {
  for (const std::string& l : Lines(text)) {
    if (l == line) return true;
  }
  return false;
}

}  // namespace rdp::testing
