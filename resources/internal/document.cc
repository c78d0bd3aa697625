#include "resources/internal/document.h"

#include "absl/strings/str_cat.h"
#ifdef RDP_HAVE_YAML_CPP
#include "yaml-cpp/yaml.h"
#else
#include "nlohmann/json.hpp"
#endif

namespace rdp::resources::internal {
namespace {

#ifdef RDP_HAVE_YAML_CPP
DocNode FromYaml(const YAML::Node& node) {
  DocNode out;
  out.line = node.Mark().is_null() ? 0 : node.Mark().line + 1;
  switch (node.Type()) {
    case YAML::NodeType::Map:
      out.kind = DocNode::Kind::kMap;
      for (const auto& kv : node) {
        out.fields.emplace_back(kv.first.Scalar(), FromYaml(kv.second));
        // A key's line is where the key is written, also when its value is a block below it.
        if (out.fields.back().second.kind != DocNode::Kind::kScalar && !kv.first.Mark().is_null()) {
          out.fields.back().second.line = kv.first.Mark().line + 1;
        }
      }
      break;
    case YAML::NodeType::Sequence:
      out.kind = DocNode::Kind::kList;
      for (const auto& item : node) out.items.push_back(FromYaml(item));
      break;
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      // A plain (unquoted) null, ~ or nothing is YAML's null; a quoted one is a string.
      const bool plain = node.Tag() == "?";
      if (plain && (text.empty() || text == "~" || text == "null" || text == "Null" ||
                    text == "NULL")) {
        break;
      }
      out.kind = DocNode::Kind::kScalar;
      out.scalar = text;
      break;
    }
    default:  // Null, Undefined
      break;
  }
  return out;
}
#else
DocNode FromJson(const nlohmann::json& j) {
  DocNode out;
  if (j.is_object()) {
    out.kind = DocNode::Kind::kMap;
    for (const auto& [key, value] : j.items()) out.fields.emplace_back(key, FromJson(value));
  } else if (j.is_array()) {
    out.kind = DocNode::Kind::kList;
    for (const auto& item : j) out.items.push_back(FromJson(item));
  } else if (j.is_string()) {
    out.kind = DocNode::Kind::kScalar;
    out.scalar = j.get<std::string>();
  } else if (!j.is_null()) {
    out.kind = DocNode::Kind::kScalar;
    out.scalar = j.dump();
  }
  return out;
}
#endif

}  // namespace

absl::StatusOr<DocNode> ParseDocument(const std::string& text) {
#ifdef RDP_HAVE_YAML_CPP
  try {
    return FromYaml(YAML::Load(text));
  } catch (const YAML::Exception& e) {  // yaml-cpp reports malformed YAML by throwing
    return absl::InvalidArgumentError(
        absl::StrCat("line ", e.mark.line + 1, ": not valid YAML or JSON: ", e.msg));
  }
#else
  // nlohmann keeps an object's keys sorted, not in document order; no message depends on it.
  try {
    return FromJson(nlohmann::json::parse(text));
  } catch (const nlohmann::json::exception& e) {  // nlohmann reports malformed JSON by throwing
    return absl::InvalidArgumentError(absl::StrCat(
        "not valid JSON (this build, without yaml-cpp, reads no YAML): ", e.what()));
  }
#endif
}

}  // namespace rdp::resources::internal
