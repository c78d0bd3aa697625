#include "serving/unix_server.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace rdp::serving {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartUnixServer(
    const std::string& path, const std::vector<grpc::Service*>& services) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path final_path(path);
  const std::string temp =
      (final_path.parent_path() / absl::StrCat(".", final_path.filename().string(), ".",
                                               ::getpid(), ".", counter++))
          .string();
  ::unlink(temp.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + temp, grpc::InsecureServerCredentials());
  for (grpc::Service* s : services) builder.RegisterService(s);
  // What one local client can take: concurrent calls per connection, and memory.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxCallsPerConnection);
  grpc::ResourceQuota quota("rdma-device-plugin");
  quota.Resize(kMaxServerMemory);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return absl::UnavailableError(absl::StrCat("cannot serve on ", temp));
  // Only the owner (root, like the kubelet) may connect, whatever the umask: set before the
  // socket appears under its name.
  if (::chmod(temp.c_str(), kSocketMode) != 0) {
    const std::string why = std::strerror(errno);
    server->Shutdown();
    ::unlink(temp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot chmod ", temp, ": ", why));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    server->Shutdown();
    ::unlink(temp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot move ", temp, " to ", path, ": ", why));
  }
  return server;
}

std::shared_ptr<grpc::Channel> UnixChannel(const std::string& path) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel("unix://" + path, grpc::InsecureChannelCredentials(), args);
}

}  // namespace rdp::serving
