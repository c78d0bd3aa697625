#include "test/support/fault_env.h"

namespace rdp::testing {

void FaultEnv::SetHook(Hook hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

void FaultEnv::Before(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (hook_) hook_(path);
}

std::optional<std::string> FaultEnv::ReadFile(const std::string& path, std::size_t max_bytes) {
  Before(path);
  return EnvWrapper::ReadFile(path, max_bytes);
}

std::vector<std::string> FaultEnv::ListDir(const std::string& dir, bool dirs_only) {
  Before(dir);
  return EnvWrapper::ListDir(dir, dirs_only);
}

std::optional<std::string> FaultEnv::Resolve(const std::string& path) {
  Before(path);
  return EnvWrapper::Resolve(path);
}

bool FaultEnv::Exists(const std::string& path) {
  Before(path);
  return EnvWrapper::Exists(path);
}

bool FaultEnv::IsDirectory(const std::string& path) {
  Before(path);
  return EnvWrapper::IsDirectory(path);
}

}  // namespace rdp::testing
