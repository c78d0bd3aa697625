#!/usr/bin/env python3
"""Checks the scheduler benchmark's output (scripts/bench.sh --scheduler) and prints its figures.

  bench/scheduler_summary.py FILE

FILE is what TestSchedulerBench (test/kubelet/controlplane) writes, scheduler.json. Its figures:
  pods_per_s   {gpu_only, gpu_and_hca}: pods from the first created to the last bound by the real
               kube-scheduler, per second: pods with a claim of one GPU, and pods with a claim of
               one GPU and one of our HCAs under matchAttribute resource.kubernetes.io/pcieRoot
  ratio        pods_per_s.gpu_and_hca / pods_per_s.gpu_only (budget: at least 0.5)
  misses       gpu_and_hca pods whose HCA is not on their GPU's PCIe root (there must be none)
  allocate_x_root_only
               what our attributes cost the scheduler: its allocator's time for a gpu_and_hca
               claim on one node with our slices as published over the same with our devices cut
               to pcieRoot alone, in process, interleaved, in thread CPU time (budget: at most 1.15)
and what was measured: nodes, pods (per class), seconds {gpu_only, gpu_and_hca},
harness_peak_rss_mib.
Prints a table of the figures against their budgets. Exit 0 when every key is there with a number
and the ratio is the quotient of the two rates; 2 naming the file or key otherwise; 1 when misses
is not 0 (a wrong placement, not a slow one). Whether the ratio's budget is met is printed, not an
exit code, as bench/summary.py does.
"""
import json
import math
import sys

MIN_RATIO = 0.5
MAX_ROOT_ONLY = 1.15
KEYS = ["pods_per_s.gpu_only", "pods_per_s.gpu_and_hca", "ratio", "misses", "nodes", "pods",
        "seconds.gpu_only", "seconds.gpu_and_hca", "allocate_x_root_only", "harness_peak_rss_mib"]


class Missing(Exception):
    pass


def number(doc, key):
    value = doc
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise Missing(f"no {key}")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Missing(f"{key} is {value!r}, not a number")
    return value


def main():
    if len(sys.argv) != 2:
        print("usage: bench/scheduler_summary.py FILE", file=sys.stderr)
        return 2
    path = sys.argv[1]
    try:
        with open(path) as f:
            doc = json.load(f)
        v = {key: number(doc, key) for key in KEYS}
        if not isinstance(v["misses"], int) or v["misses"] < 0:
            raise Missing(f"misses is {v['misses']!r}, not a count")
        if min(v["pods_per_s.gpu_only"], v["pods_per_s.gpu_and_hca"]) <= 0:
            raise Missing("a rate is not positive")
        quotient = v["pods_per_s.gpu_and_hca"] / v["pods_per_s.gpu_only"]
        if not math.isclose(v["ratio"], quotient, rel_tol=0.01):
            raise Missing(f"ratio {v['ratio']} is not pods_per_s.gpu_and_hca / gpu_only ({quotient:.3f})")
    except (OSError, ValueError, Missing) as e:
        print(f"scheduler summary: {path}: {e}", file=sys.stderr)
        return 2
    print(f"{v['nodes']:.0f} nodes, {v['pods']:.0f} pods per class; "
          f"the harness's peak RSS {v['harness_peak_rss_mib']:.0f} MiB")
    rows = [("pods_per_s.gpu_only", v["pods_per_s.gpu_only"], "none", f"{v['seconds.gpu_only']:.1f} s"),
            ("pods_per_s.gpu_and_hca", v["pods_per_s.gpu_and_hca"], "none", f"{v['seconds.gpu_and_hca']:.1f} s"),
            ("ratio", v["ratio"], f">= {MIN_RATIO}", "ok" if v["ratio"] >= MIN_RATIO else "UNDER"),
            ("misses", v["misses"], "0", "ok" if v["misses"] == 0 else "WRONG"),
            ("allocate_x_root_only", v["allocate_x_root_only"], f"<= {MAX_ROOT_ONLY}",
             "ok" if v["allocate_x_root_only"] <= MAX_ROOT_ONLY else "OVER")]
    print(f"{'figure':<24} {'value':>10}  {'budget':>8}")
    for name, value, budget, note in rows:
        print(f"{name:<24} {value:>10.4g}  {budget:>8}  {note}")
    return 1 if v["misses"] else 0


if __name__ == "__main__":
    sys.exit(main())
