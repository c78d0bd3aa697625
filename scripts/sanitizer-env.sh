# Sourced: sanitizer options for test and fuzz runs. $1, optional: a directory for the reports
# (each process writes <dir>/<sanitizer>.<pid> only when it has something to report); without
# it reports go to stderr.
supp=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/test/sanitizers
log_asan="" log_ubsan="" log_tsan=""
if [[ -n "${1:-}" ]]; then
  log_asan=":log_path=$1/asan" log_ubsan=":log_path=$1/ubsan" log_tsan=":log_path=$1/tsan"
fi
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1$log_asan"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1$log_ubsan"
# ignore_noninstrumented_modules: Debian's gRPC, protobuf and abseil are not built for TSan; their
# memory accesses (memcpy, free, sendmsg, ... called from inside them) are not checked, while
# our code and the gRPC/protobuf code inlined into it are. absl::Mutex is made visible by
# test/sanitizers/tsan_absl_sync.cc.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$supp/tsan.supp$log_tsan"
unset supp log_asan log_ubsan log_tsan
