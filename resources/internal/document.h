#pragma once

// A parsed config document: YAML (yaml-cpp) or JSON, as one tree whose nodes remember their line,
// so that a config error can name the line as well as the key. Internal to resources/.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace rdp::resources::internal {

struct DocNode {
  enum class Kind { kNull, kScalar, kList, kMap };
  Kind kind = Kind::kNull;
  std::string scalar;                                 // kScalar: its text, as written
  std::vector<DocNode> items;                         // kList
  std::vector<std::pair<std::string, DocNode>> fields;  // kMap, in document order
  int line = 0;                                       // 1-based; 0 when the parser gives none
};

// The tree of `text`, read as YAML when this build has yaml-cpp (JSON is YAML: lines are known
// for both), else as JSON. Every scalar is its text: numbers and booleans are not typed here.
// InvalidArgument carrying the parser's message (and line) when the text parses as neither.
absl::StatusOr<DocNode> ParseDocument(const std::string& text);

}  // namespace rdp::resources::internal
