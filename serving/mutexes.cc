#include "serving/mutexes.h"

#include "absl/synchronization/mutex.h"

namespace rdp::serving {

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace rdp::serving
