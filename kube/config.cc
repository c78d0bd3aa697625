#include "kube/config.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kube/internal/files.h"
#include "nlohmann/json.hpp"
#ifdef RDP_HAVE_YAML_CPP
#include "yaml-cpp/yaml.h"
#endif

namespace rdp::kube {

namespace {

constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

#ifdef RDP_HAVE_YAML_CPP
// A YAML document as JSON: mappings as objects (keys as strings), sequences as arrays, null as
// null, a plain (unquoted) scalar that YAML 1.1 reads as a boolean (true/false, yes/no, on/off,
// as kubectl's sigs.k8s.io/yaml does) as a boolean, every other scalar as a string: a kubeconfig
// has no field that is a number.
nlohmann::json YamlToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& kv : node) out[kv.first.Scalar()] = YamlToJson(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& item : node) out.push_back(YamlToJson(item));
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "?") {  // plain, not quoted
        const std::string lower = absl::AsciiStrToLower(text);
        if (lower == "true" || lower == "yes" || lower == "on") return true;
        if (lower == "false" || lower == "no" || lower == "off") return false;
        if (lower == "null" || text == "~") return nullptr;
      }
      return text;
    }
    default:  // Null, Undefined
      return nullptr;
  }
}
#endif

// The kubeconfig as JSON: JSON as it is, else YAML (what kubectl writes).
absl::StatusOr<nlohmann::json> ParseKubeconfig(const std::string& text, const std::string& path) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_discarded()) {
    if (doc.is_object()) return doc;
    return absl::InvalidArgumentError(
        absl::StrCat("kubeconfig ", path, " is JSON but not an object"));
  }
#ifdef RDP_HAVE_YAML_CPP
  try {
    doc = YamlToJson(YAML::Load(text));
  } catch (const YAML::Exception& e) {  // yaml-cpp reports malformed YAML by throwing
    return absl::InvalidArgumentError(absl::StrCat(
        "kubeconfig ", path, " is neither JSON nor YAML: line ", e.mark.line + 1, ": ", e.msg));
  }
#else
  return absl::InvalidArgumentError(absl::StrCat(
      "kubeconfig ", path, " is not JSON, and this build (without yaml-cpp) reads no YAML: write "
      "one with `kubectl config view --raw --minify -o json`"));
#endif
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kubeconfig ", path, " is not a YAML mapping (a kubeconfig has kind Config)"));
  }
  return doc;
}

std::optional<std::string> RealGetEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// The named entry of a kubeconfig list ("clusters", "users", "contexts"): [{name, <field>}].
absl::StatusOr<const nlohmann::json*> Entry(const nlohmann::json& doc, const std::string& list,
                                            const std::string& field, const std::string& name,
                                            const std::string& path) {
  const auto it = doc.find(list);
  if (it != doc.end() && it->is_array()) {
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.value("name", nlohmann::json()) == name) {
        const auto inner = entry.find(field);
        if (inner == entry.end() || !inner->is_object()) {
          return absl::InvalidArgumentError(
              absl::StrCat("kubeconfig ", path, ": ", list, " entry \"", name, "\" has no ",
                           field, " object"));
        }
        return &*inner;
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("kubeconfig ", path, ": no ", list, " entry named \"", name, "\""));
}

// A string field of `obj`; "" when absent. InvalidArgument when present but not a string.
absl::StatusOr<std::string> StringField(const nlohmann::json& obj, const std::string& key,
                                        const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " is not a string"));
  }
  return it->get<std::string>();
}

// `file` made relative to the kubeconfig's directory, as kubectl resolves it.
std::string Resolve(const std::string& file, const std::string& kubeconfig) {
  if (file.empty() || file.front() == '/') return file;
  const auto slash = kubeconfig.rfind('/');
  if (slash == std::string::npos) return file;
  return kubeconfig.substr(0, slash + 1) + file;
}

absl::StatusOr<std::string> Base64Field(const nlohmann::json& obj, const std::string& key,
                                        const std::string& where) {
  auto text = StringField(obj, key, where);
  if (!text.ok() || text->empty()) return text;
  std::string decoded;
  if (!absl::Base64Unescape(*text, &decoded)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " is not base64"));
  }
  return decoded;
}

}  // namespace

absl::Status CheckCredentialsSafe(const Config& config) {
  if (absl::StartsWithIgnoreCase(config.server, "http://") &&
      (!config.token.empty() || !config.token_file.empty())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "server ", config.server, " (", config.source.empty() ? "the configuration" : config.source,
        ") is plain http: the bearer token would be sent in clear; use https"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> InClusterConfig(const std::string& root) {
  return InClusterConfig(root, RealGetEnv);
}

absl::StatusOr<Config> InClusterConfig(const std::string& root, const GetEnvFunc& getenv) {
  const auto host = getenv("KUBERNETES_SERVICE_HOST");
  const auto port = getenv("KUBERNETES_SERVICE_PORT");
  if (!host || host->empty()) {
    return absl::FailedPreconditionError(
        "in-cluster config: KUBERNETES_SERVICE_HOST is not set (not running in a pod?)");
  }
  if (!port || port->empty()) {
    return absl::FailedPreconditionError("in-cluster config: KUBERNETES_SERVICE_PORT is not set");
  }
  Config config;
  const bool ipv6 = host->find(':') != std::string::npos && host->front() != '[';
  config.server = absl::StrCat("https://", ipv6 ? "[" : "", *host, ipv6 ? "]" : "", ":", *port);
  const std::string dir = absl::StrCat(absl::StripSuffix(root, "/"), kServiceAccountDir);
  config.token_file = dir + "/token";
  config.ca_file = dir + "/ca.crt";
  // Both are checked now, so that a pod without its service account fails at start with the
  // file's name rather than at the first request.
  for (const std::string& file : {config.token_file, config.ca_file}) {
    auto content = internal::ReadSmallFile(file);
    if (!content.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("in-cluster config: ", content.status().message()));
    }
    if (absl::StripAsciiWhitespace(*content).empty()) {
      return absl::FailedPreconditionError(absl::StrCat("in-cluster config: ", file, " is empty"));
    }
  }
  config.source = absl::StrCat("in-cluster service account ", dir);
  return config;
}

absl::StatusOr<Config> LoadKubeconfig(const std::string& path) {
  auto text = internal::ReadSmallFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<nlohmann::json> parsed = ParseKubeconfig(*text, path);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& doc = *parsed;
  auto current = StringField(doc, "current-context", "kubeconfig " + path);
  if (!current.ok()) return current.status();
  if (current->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", path, ": no current-context"));
  }
  auto context = Entry(doc, "contexts", "context", *current, path);
  if (!context.ok()) return context.status();
  const std::string context_where = absl::StrCat("kubeconfig ", path, ": context ", *current);
  auto cluster_name = StringField(**context, "cluster", context_where);
  if (!cluster_name.ok()) return cluster_name.status();
  auto user_name = StringField(**context, "user", context_where);
  if (!user_name.ok()) return user_name.status();
  auto cluster = Entry(doc, "clusters", "cluster", *cluster_name, path);
  if (!cluster.ok()) return cluster.status();

  Config config;
  config.source = absl::StrCat("kubeconfig ", path);
  const std::string cw = absl::StrCat("kubeconfig ", path, ": cluster ", *cluster_name);
  const nlohmann::json& c = **cluster;
  for (auto [key, field] : {std::pair{"server", &config.server},
                            std::pair{"certificate-authority", &config.ca_file},
                            std::pair{"tls-server-name", &config.tls_server_name}}) {
    auto value = StringField(c, key, cw);
    if (!value.ok()) return value.status();
    *field = *value;
  }
  if (config.server.empty()) return absl::InvalidArgumentError(cw + " has no server");
  if (!absl::StartsWith(config.server, "https://") && !absl::StartsWith(config.server, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat(cw, ".server \"", config.server, "\" is not an http(s) URL"));
  }
  // Paths are appended to it: "https://host:6443/" would make "//api/v1/...".
  while (absl::EndsWith(config.server, "/")) config.server.pop_back();
  config.ca_file = Resolve(config.ca_file, path);
  auto ca_data = Base64Field(c, "certificate-authority-data", cw);
  if (!ca_data.ok()) return ca_data.status();
  config.ca_data = *ca_data;
  if (const auto it = c.find("insecure-skip-tls-verify"); it != c.end() && it->is_boolean()) {
    config.insecure_skip_tls_verify = it->get<bool>();
  }

  if (user_name->empty()) return config;  // anonymous
  auto user = Entry(doc, "users", "user", *user_name, path);
  if (!user.ok()) return user.status();
  const nlohmann::json& u = **user;
  const std::string uw = absl::StrCat("kubeconfig ", path, ": user ", *user_name);
  for (const char* unsupported : {"exec", "auth-provider", "username"}) {
    if (u.contains(unsupported) && !u[unsupported].is_null()) {
      return absl::UnimplementedError(absl::StrCat(
          uw, " uses ", unsupported, ", which this client does not support (use a token, a "
          "tokenFile or a client certificate)"));
    }
  }
  for (auto [key, field] : {std::pair{"token", &config.token},
                            std::pair{"tokenFile", &config.token_file},
                            std::pair{"client-certificate", &config.client_cert_file},
                            std::pair{"client-key", &config.client_key_file}}) {
    auto value = StringField(u, key, uw);
    if (!value.ok()) return value.status();
    *field = *value;
  }
  config.token_file = Resolve(config.token_file, path);
  config.client_cert_file = Resolve(config.client_cert_file, path);
  config.client_key_file = Resolve(config.client_key_file, path);
  for (auto [key, field] : {std::pair{"client-certificate-data", &config.client_cert_data},
                            std::pair{"client-key-data", &config.client_key_data}}) {
    auto value = Base64Field(u, key, uw);
    if (!value.ok()) return value.status();
    *field = *value;
  }
  const bool has_cert = !config.client_cert_file.empty() || !config.client_cert_data.empty();
  const bool has_key = !config.client_key_file.empty() || !config.client_key_data.empty();
  if (has_cert != has_key) {
    return absl::InvalidArgumentError(
        absl::StrCat(uw, " has a client certificate without its key, or a key without its "
                         "certificate"));
  }
  return config;
}

}  // namespace rdp::kube
