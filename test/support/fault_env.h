#pragma once

// An Env that runs a hook with each path just before the path is read, so that a test makes a
// file vanish (or appear) at a chosen read of a scan, deterministically, on the reading thread.

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/env.h"

namespace rdp::testing {

class FaultEnv : public EnvWrapper {
 public:
  using Hook = std::function<void(const std::string& path)>;
  explicit FaultEnv(std::shared_ptr<Env> base) : EnvWrapper(std::move(base)) {}

  // `hook` (nullptr: none) is called with the node path of every read, before it. Calls are
  // serialised; once SetHook returns, the previous hook is neither running nor called again. A
  // hook must not read through this Env itself.
  void SetHook(Hook hook);

  std::optional<std::string> ReadFile(const std::string& path, std::size_t max_bytes) override;
  std::vector<std::string> ListDir(const std::string& dir, bool dirs_only) override;
  std::optional<std::string> Resolve(const std::string& path) override;
  bool Exists(const std::string& path) override;
  bool IsDirectory(const std::string& path) override;

 private:
  void Before(const std::string& path);

  absl::Mutex mu_;
  Hook hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdp::testing
