#pragma once

namespace rdp::serving {

// absl::Mutex as Debian builds it (without NDEBUG) checks every acquisition for lock-order
// cycles: an update of one process-wide graph under its own lock, with a stack trace for each
// new edge, on every lock of every call, gRPC's per-call mutexes included. The plugin turns the
// check off once, before it starts threads (main); tests and sanitizer runs keep it, so that a
// lock-order cycle still fails them. Benchmarks of the serving path turn it off too, to measure
// what the plugin runs.
void DisableMutexDeadlockDetection();

}  // namespace rdp::serving
