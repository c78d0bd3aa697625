#!/usr/bin/env python3
"""House rule: no absl::Mutex condition waits (Await, LockWhen, absl::Condition) in our code.

abseil evaluates a waiter's Condition in whichever thread unlocks the mutex, inside abseil's own
Unlock. Debian's abseil is not built for ThreadSanitizer, and test/sanitizers/tsan_absl_sync.cc
can only tell TSan that the lock is released before abseil's Unlock runs: so the condition's read
of guarded state looks unguarded, and the TSan suite reports a race whenever another thread
happens to unlock at the right moment (not on every run). An absl::CondVar and a loop evaluate
the condition in the waiting thread, under the lock TSan sees. Exit 0 when no source uses one,
1 with one line per use.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
DIRS = ["base", "topology", "resources", "allocator", "hca", "serving", "metrics", "deviceplugin", "dra", "nri",
        "check", "cmd", "sim", "bench", "test"]
# The shim itself defines these functions.
EXEMPT = {"test/sanitizers/tsan_absl_sync.cc"}
USE = re.compile(r"\babsl::Condition\b|\.(Await|AwaitWithTimeout|AwaitWithDeadline|LockWhen|"
                 r"LockWhenWithTimeout|LockWhenWithDeadline|ReaderLockWhen\w*)\s*\(")


def main():
    bad = []
    for d in DIRS:
        for src in sorted((ROOT / d).rglob("*")):
            if src.suffix not in {".h", ".cc"}:
                continue
            rel = src.relative_to(ROOT).as_posix()
            if rel in EXEMPT:
                continue
            for number, line in enumerate(src.read_text(errors="replace").splitlines(), 1):
                code = line.split("//", 1)[0]
                if USE.search(code):
                    bad.append(f"{rel}:{number}: a Mutex condition wait; use an absl::CondVar "
                               f"loop (test/sanitizers/await_rule_test.py): {line.strip()}")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
