#!/usr/bin/env python3
"""bench/scheduler_summary.py on hand-written scheduler.json files: a complete one passes and
prints the figures against their budgets (an allocate_x_root_only over its budget is printed,
not an exit code); a missing or non-numeric key and a ratio that is not
the quotient of the two rates exit 2 naming it; misses exit 1."""
import copy
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
CHECK = ROOT / "bench" / "scheduler_summary.py"
GOOD = {"pods_per_s": {"gpu_only": 40.0, "gpu_and_hca": 18.0}, "ratio": 0.45, "misses": 0,
        "nodes": 1000, "pods": 500, "seconds": {"gpu_only": 12.5, "gpu_and_hca": 27.778},
        "allocate_x_root_only": 1.02, "harness_peak_rss_mib": 2048.5}


def run(d, doc):
    path = d / "scheduler.json"
    path.write_text(json.dumps(doc))
    return subprocess.run([sys.executable, CHECK, path], capture_output=True, text=True)


def without(doc, *key):
    doc = copy.deepcopy(doc)
    parent = doc
    for part in key[:-1]:
        parent = parent[part]
    del parent[key[-1]]
    return doc


def main():
    failures = []
    check = lambda ok, what: ok or failures.append(what)
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        r = run(d, GOOD)
        check(r.returncode == 0, f"a complete file: exit {r.returncode}: {r.stderr}")
        check("ratio" in r.stdout and "UNDER" in r.stdout, f"ratio 0.45 is under 0.5: {r.stdout}")
        check("pods_per_s.gpu_and_hca" in r.stdout and "misses" in r.stdout, f"the table: {r.stdout}")
        check("OVER" not in r.stdout, f"allocate_x_root_only 1.02 is within 1.15: {r.stdout}")

        over = copy.deepcopy(GOOD)
        over["allocate_x_root_only"] = 1.3
        r = run(d, over)
        check(r.returncode == 0 and "OVER" in r.stdout, f"allocate_x_root_only 1.3: {r.returncode} {r.stdout}")

        for key in (("pods_per_s", "gpu_and_hca"), ("ratio",), ("misses",), ("seconds", "gpu_only"),
                    ("allocate_x_root_only",)):
            r = run(d, without(GOOD, *key))
            name = ".".join(key)
            check(r.returncode == 2 and name in r.stderr, f"without {name}: {r.returncode} {r.stderr}")

        bad = copy.deepcopy(GOOD)
        bad["ratio"] = 1 / 0.45  # the quotient the wrong way round
        r = run(d, bad)
        check(r.returncode == 2 and "ratio" in r.stderr, f"inverted ratio: {r.returncode} {r.stderr}")

        bad = copy.deepcopy(GOOD)
        bad["pods_per_s"]["gpu_only"] = "40"
        r = run(d, bad)
        check(r.returncode == 2 and "pods_per_s.gpu_only" in r.stderr, f"a string: {r.returncode} {r.stderr}")

        bad = copy.deepcopy(GOOD)
        bad["misses"] = 3
        r = run(d, bad)
        check(r.returncode == 1 and "WRONG" in r.stdout, f"misses 3: {r.returncode} {r.stdout}")

        r = subprocess.run([sys.executable, CHECK, d / "none.json"], capture_output=True, text=True)
        check(r.returncode == 2 and "none.json" in r.stderr, f"no file: {r.returncode} {r.stderr}")
    for f in failures:
        print("FAILED:", f)
    print(f"scheduler_summary_test: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
