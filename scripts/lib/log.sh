# shellcheck shell=bash
# The reporting helpers of the scripts that speak as "NAME: ..." (scripts/build-image.sh,
# scripts/image-test.sh, scripts/test-arm64.sh). Sourced, from the repository's root:
#
#   source scripts/lib/log.sh NAME
#
#   say TEXT...    prints "NAME: TEXT"
#   skip TEXT...   prints "NAME: SKIP: TEXT" and exits 77 (ctest's SKIP_RETURN_CODE; test.sh's skip)
#   fail TEXT...   prints "NAME: FAIL: TEXT" and exits 1
#   phase WHAT     prints "NAME: -- WHAT: N s", N the seconds since the previous phase (or since
#                  this file was sourced)
#   elapsed        prints the seconds since this file was sourced
log_name=${1:?"usage: source scripts/lib/log.sh NAME"}
log_start=$(date +%s)
log_phase_start=$log_start
say() { echo "$log_name: $*"; }
skip() { say "SKIP: $*"; exit 77; }
fail() { say "FAIL: $*"; exit 1; }
phase() {
  local now
  now=$(date +%s)
  say "-- $1: $((now - log_phase_start)) s"
  log_phase_start=$now
}
elapsed() { echo $(($(date +%s) - log_start)); }
