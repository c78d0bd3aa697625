#pragma once

// Where the API server is and who we are to it: a kubeconfig file (YAML or JSON, as kubectl
// writes it) or a pod's service account.

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rdp::kube {

struct Config {
  std::string server;  // "https://10.96.0.1:443", "https://[fd00::1]:6443"
  // The CA that signs the server's certificate: a PEM file or PEM bytes; neither = the system's.
  std::string ca_file;
  std::string ca_data;
  // tls-server-name: the name the server's certificate must carry when it is not the host of
  // `server` (an IP address, a load balancer).
  std::string tls_server_name;
  bool insecure_skip_tls_verify = false;
  // A bearer token, or a file holding one (re-read when it changes: projected service-account
  // tokens rotate); token_file wins when both are set.
  std::string token;
  std::string token_file;
  // A client certificate and key (PEM), files or bytes.
  std::string client_cert_file;
  std::string client_cert_data;
  std::string client_key_file;
  std::string client_key_data;
  // Where this configuration came from, for messages ("kubeconfig /root/.kube/config").
  std::string source;
};

// FailedPrecondition when `config` would send a credential in clear: a bearer token (token or
// token_file) to an http:// server. A client certificate cannot go over plain HTTP at all.
absl::Status CheckCredentialsSafe(const Config& config);

// Looks an environment variable up; nullopt when unset.
using GetEnvFunc = std::function<std::optional<std::string>(const std::string&)>;

// The service-account identity of a pod: <root>/var/run/secrets/kubernetes.io/serviceaccount/
// {token,ca.crt} and KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT (an IPv6 host is
// bracketed). FailedPrecondition naming the variable or file that is missing or empty. The token
// is not kept: it is read from its file at each request.
absl::StatusOr<Config> InClusterConfig(const std::string& root);
absl::StatusOr<Config> InClusterConfig(const std::string& root, const GetEnvFunc& getenv);

// The current context of a kubeconfig file: its cluster's server, certificate-authority(-data),
// tls-server-name, insecure-skip-tls-verify and its user's token, tokenFile,
// client-certificate(-data), client-key(-data). Relative file names are relative to the
// kubeconfig's directory, as kubectl reads them. The file is YAML, as kubectl writes it, or JSON
// (yaml-cpp; plain true/false/yes/no/on/off are booleans, every other scalar a string; a build
// without yaml-cpp, the arm64 cross build, reads JSON only and says so).
// Errors name the file and the field: NotFound (no file), InvalidArgument (neither JSON nor YAML,
// with the line; not a mapping; a missing context, cluster or user, bad base64), Unimplemented
// (exec and auth-provider users).
absl::StatusOr<Config> LoadKubeconfig(const std::string& path);

}  // namespace rdp::kube
