#include "server/unix_server.h"

#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace rdp::server {

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
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return absl::UnavailableError(absl::StrCat("cannot serve on ", temp));
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    server->Shutdown();
    ::unlink(temp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot move ", temp, " to ", path, ": ", why));
  }
  return server;
}

}  // namespace rdp::server
