#include "kube/config.h"

#include <fstream>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/kube/fakes.h"
#include "test/support/temp_dir.h"

namespace rdp::kube {
namespace {

using ::rdp::kube::testing::Env;
using ::rdp::kube::testing::ServiceAccount;
using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::trunc) << content;
}

TEST(KubeConfigTest, InClusterReadsTheServiceAccount) {
  rdp::testing::TempDir root;
  const std::string dir = ServiceAccount(root.path());
  auto config = InClusterConfig(root.path() + "/",
                                Env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                     {"KUBERNETES_SERVICE_PORT", "443"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->token_file, dir + "/token");
  EXPECT_EQ(config->ca_file, dir + "/ca.crt");
  EXPECT_TRUE(config->token.empty()) << "read at each request, not kept";
}

TEST(KubeConfigTest, InClusterBracketsAnIpv6Host) {
  rdp::testing::TempDir root;
  ServiceAccount(root.path());
  auto config = InClusterConfig(root.path(), Env({{"KUBERNETES_SERVICE_HOST", "fd00:10:96::1"},
                                                  {"KUBERNETES_SERVICE_PORT", "6443"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00:10:96::1]:6443");
}

TEST(KubeConfigTest, InClusterNamesWhatIsMissing) {
  rdp::testing::TempDir root;
  auto no_host = InClusterConfig(root.path(), Env({{"KUBERNETES_SERVICE_PORT", "443"}}));
  EXPECT_TRUE(absl::IsFailedPrecondition(no_host.status()));
  EXPECT_THAT(no_host.status().message(), HasSubstr("KUBERNETES_SERVICE_HOST"));
  auto no_port = InClusterConfig(root.path(), Env({{"KUBERNETES_SERVICE_HOST", "10.0.0.1"}}));
  EXPECT_THAT(no_port.status().message(), HasSubstr("KUBERNETES_SERVICE_PORT"));
  const auto env =
      Env({{"KUBERNETES_SERVICE_HOST", "10.0.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}});
  auto no_token = InClusterConfig(root.path(), env);
  EXPECT_TRUE(absl::IsFailedPrecondition(no_token.status()));
  EXPECT_THAT(no_token.status().message(), HasSubstr("serviceaccount/token"));
  const std::string dir = ServiceAccount(root.path());
  WriteFile(dir + "/token", " \n");
  auto empty_token = InClusterConfig(root.path(), env);
  EXPECT_THAT(empty_token.status().message(), HasSubstr("token is empty"));
  WriteFile(dir + "/token", "x");
  std::remove((dir + "/ca.crt").c_str());
  EXPECT_THAT(InClusterConfig(root.path(), env).status().message(), HasSubstr("ca.crt"));
}

nlohmann::json Kubeconfig() {
  return {
      {"apiVersion", "v1"},
      {"kind", "Config"},
      {"current-context", "ctx"},
      {"contexts", {{{"name", "other"}, {"context", {{"cluster", "nope"}, {"user", "nope"}}}},
                    {{"name", "ctx"}, {"context", {{"cluster", "c1"}, {"user", "u1"}}}}}},
      {"clusters",
       {{{"name", "c1"},
         {"cluster",
          {{"server", "https://127.0.0.1:6443"},
           {"certificate-authority-data", absl::Base64Escape("PEM CA")},
           {"tls-server-name", "kubernetes.default"}}}}}},
      {"users", {{{"name", "u1"}, {"user", {{"token", "admin-token"}}}}}},
  };
}

absl::StatusOr<Config> Load(const rdp::testing::TempDir& dir, const nlohmann::json& doc) {
  const std::string path = dir.Sub("kubeconfig");
  WriteFile(path, doc.dump(2));
  return LoadKubeconfig(path);
}

TEST(KubeConfigTest, KubeconfigCurrentContext) {
  rdp::testing::TempDir dir;
  auto config = Load(dir, Kubeconfig());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://127.0.0.1:6443");
  EXPECT_EQ(config->ca_data, "PEM CA");
  EXPECT_EQ(config->tls_server_name, "kubernetes.default");
  EXPECT_EQ(config->token, "admin-token");
  EXPECT_THAT(config->source, HasSubstr(dir.Sub("kubeconfig")));
}

TEST(KubeConfigTest, KubeconfigFilesAreRelativeToIt) {
  rdp::testing::TempDir dir;
  nlohmann::json doc = Kubeconfig();
  doc["clusters"][0]["cluster"].erase("certificate-authority-data");
  doc["clusters"][0]["cluster"]["certificate-authority"] = "ca.crt";
  doc["clusters"][0]["cluster"]["server"] = "https://lb.example:443/k8s/clusters/c1/";
  doc["users"][0]["user"] = {{"tokenFile", "/abs/token"},
                             {"client-certificate", "certs/client.crt"},
                             {"client-key-data", absl::Base64Escape("KEY")}};
  auto config = Load(dir, doc);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://lb.example:443/k8s/clusters/c1") << "paths are appended";
  EXPECT_EQ(config->ca_file, dir.Sub("ca.crt"));
  EXPECT_EQ(config->token_file, "/abs/token");
  EXPECT_EQ(config->client_cert_file, dir.Sub("certs/client.crt"));
  EXPECT_EQ(config->client_key_data, "KEY");
}

TEST(KubeConfigTest, KubeconfigErrorsNameTheFileAndTheField) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("kubeconfig");
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"no current context", [](auto& d) { d.erase("current-context"); },
       absl::StatusCode::kInvalidArgument, "no current-context"},
      {"unknown context", [](auto& d) { d["current-context"] = "gone"; },
       absl::StatusCode::kInvalidArgument, "no contexts entry named \"gone\""},
      {"unknown cluster", [](auto& d) { d["clusters"][0]["name"] = "c2"; },
       absl::StatusCode::kInvalidArgument, "no clusters entry named \"c1\""},
      {"unknown user", [](auto& d) { d["users"][0]["name"] = "u2"; },
       absl::StatusCode::kInvalidArgument, "no users entry named \"u1\""},
      {"no server", [](auto& d) { d["clusters"][0]["cluster"].erase("server"); },
       absl::StatusCode::kInvalidArgument, "cluster c1 has no server"},
      {"server not a string", [](auto& d) { d["clusters"][0]["cluster"]["server"] = 5; },
       absl::StatusCode::kInvalidArgument, "cluster c1.server is not a string"},
      {"bad base64",
       [](auto& d) { d["clusters"][0]["cluster"]["certificate-authority-data"] = "!!!"; },
       absl::StatusCode::kInvalidArgument, "certificate-authority-data is not base64"},
      {"exec user", [](auto& d) { d["users"][0]["user"] = {{"exec", {{"command", "aws"}}}}; },
       absl::StatusCode::kUnimplemented, "user u1 uses exec"},
      {"cert without key",
       [](auto& d) { d["users"][0]["user"] = {{"client-certificate", "c.crt"}}; },
       absl::StatusCode::kInvalidArgument, "without its key"},
  };
  for (const Case& c : cases) {
    nlohmann::json doc = Kubeconfig();
    c.edit(doc);
    auto config = Load(dir, doc);
    EXPECT_EQ(config.status().code(), c.code) << c.name << ": " << config.status();
    EXPECT_THAT(config.status().message(), HasSubstr(path)) << c.name;
    EXPECT_THAT(config.status().message(), HasSubstr(c.says)) << c.name;
  }
}

// kubectl writes kubeconfigs in YAML (~/.kube/config, kubeadm's admin.conf, every cloud's
// `get-credentials`); only JSON was read, so --kubeconfig with any of them failed at start.
TEST(KubeConfigTest, YamlKubeconfigIsRead) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("config");
  WriteFile(path, R"(apiVersion: v1
kind: Config
current-context: ctx
preferences: {}
clusters:
- cluster:
    certificate-authority-data: )" + absl::Base64Escape("PEM CA") + R"(
    server: https://10.0.0.1:6443
    tls-server-name: kubernetes.default
    insecure-skip-tls-verify: false
  name: c1
contexts:
- context:
    cluster: c1
    user: u1
  name: ctx
users:
- name: u1
  user:
    token: "0123456789"   # quoted: stays a string
    client-certificate: certs/client.crt
    client-key-data: )" + absl::Base64Escape("KEY") + "\n");
  auto config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.0.0.1:6443");
  EXPECT_EQ(config->ca_data, "PEM CA");
  EXPECT_EQ(config->tls_server_name, "kubernetes.default");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->token, "0123456789");
  EXPECT_EQ(config->client_cert_file, dir.Sub("certs/client.crt"));
  EXPECT_EQ(config->client_key_data, "KEY");

  // A plain `true` is a boolean, as kubectl reads it; an unquoted number a string.
  WriteFile(path, "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
                  "clusters: [{name: c, cluster: {server: 'https://h:1', "
                  "insecure-skip-tls-verify: yes}}]\nusers: [{name: u, user: {token: 42}}]\n");
  config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->token, "42");
}

TEST(KubeConfigTest, MalformedKubeconfigNamesThePathAndTheLine) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("config");
  WriteFile(path, "apiVersion: v1\nclusters:\n- name: c\n  cluster: [unclosed\n");
  auto config = LoadKubeconfig(path);
  EXPECT_TRUE(absl::IsInvalidArgument(config.status())) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr(path));
  EXPECT_THAT(config.status().message(), HasSubstr("neither JSON nor YAML: line "));
  WriteFile(path, "- just\n- a list\n");
  config = LoadKubeconfig(path);
  EXPECT_THAT(config.status().message(), HasSubstr("not a YAML mapping"));
}

TEST(KubeConfigTest, MissingKubeconfigIsNotFound) {
  auto config = LoadKubeconfig("/nonexistent/kubeconfig");
  EXPECT_TRUE(absl::IsNotFound(config.status()));
  EXPECT_THAT(config.status().message(), HasSubstr("/nonexistent/kubeconfig"));
}

}  // namespace
}  // namespace rdp::kube
