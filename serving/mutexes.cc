#include "server/mutexes.h"

#include "absl/synchronization/mutex.h"

namespace rdp::server {

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace rdp::server
