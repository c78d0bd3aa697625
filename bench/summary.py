#!/usr/bin/env python3
"""Reads the benchmark outputs scripts/bench.sh wrote to one folder and writes summary.json there.

  bench/summary.py DIR

DIR holds allocator.json, rpc.json, discovery.json (Google Benchmark JSON) and load.json
(bench_load --json). summary.json has exactly these keys, numbers only:
  allocator_us      {dgx8_size2_gpus, scaled32_size4_gpus, scaled32_size8_gpus, distinct64_size8,
                     shared1000_size8}: CPU time per answer, microseconds
  rpc_x_floor       {prefer_exclusive_8, prefer_exclusive_32, prefer_shared_1000,
                     allocate_exclusive_8}: round trip / empty RPC on the same socket, interleaved
  rpc_x_payload_floor  the same keys: round trip / a no-op RPC carrying the same request and
                     response bytes on the same socket (bench/payload_floor.proto), interleaved
                     in the same run: what our handlers cost beyond the bytes. A figure without
                     a budget: the handlers do at each call what the kubelet calls once per
                     container (stat the device nodes, build the allocation), and a user feels
                     admission_us, not these microseconds
  discovery_x_hwloc {<fixture>: ...}: our discovery / hwloc's own load of the same XML
  admission_us      {dense250_p50, dense250_p99}: exclusive GetPreferredAllocation with the GPU
                    context known against a pod-resources server holding 250 pods x 4
                    containers, its List included (BM_AdmissionDense250), microseconds
  anon_rss_mib      the serving plugin process's anonymous memory (smaps_rollup), its largest
                    sample at a phase boundary of bench_load
Also prints a table with each figure's budget ("-" for a figure without one). Exit 0 when every
input was found and read; 2 naming the file or benchmark otherwise (whether budgets are met is
printed, not an exit code).
"""
import json
import pathlib
import sys

# Benchmark name -> key. With repetitions, the median aggregate is used.
ALLOCATOR = {
    "dgx8_size2_gpus": "BM_Exclusive/hcas:8/size:2/gpus:1/shape:0",
    "scaled32_size4_gpus": "BM_Exclusive/hcas:32/size:4/gpus:1/shape:0",
    "scaled32_size8_gpus": "BM_Exclusive/hcas:32/size:8/gpus:1/shape:0",
    "distinct64_size8": "BM_Exclusive/hcas:64/size:8/gpus:0/shape:1",
    "shared1000_size8": "BM_Shared/ids:1000/size:8",
}
# Several benchmarks for one key: the worst of them (8 HCAs: every size the bench runs).
RPC = {
    "prefer_exclusive_8": ["BM_GetPreferredAllocation/0/8/1/manual_time",
                           "BM_GetPreferredAllocation/0/8/2/manual_time",
                           "BM_GetPreferredAllocation/0/8/4/manual_time"],
    "prefer_exclusive_32": ["BM_GetPreferredAllocation/0/32/4/manual_time"],
    "prefer_shared_1000": ["BM_GetPreferredAllocation/1/8/8/manual_time"],
    "allocate_exclusive_8": ["BM_Allocate/0/8/1/manual_time", "BM_Allocate/0/8/4/manual_time"],
}
BUDGET = {
    "allocator_us": {"dgx8_size2_gpus": 2, "scaled32_size4_gpus": 15, "scaled32_size8_gpus": 50,
                     "distinct64_size8": 150, "shared1000_size8": 10},
    "rpc_x_floor": {"prefer_exclusive_8": 1.05, "prefer_exclusive_32": 1.10,
                    "prefer_shared_1000": 1.25, "allocate_exclusive_8": 1.10},
    "rpc_x_payload_floor": None,  # figures only
    "discovery_x_hwloc": 1.2,
    "admission_us": {"dense250_p50": 5000, "dense250_p99": 5000},
    "anon_rss_mib": 4,
}
TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


class Missing(Exception):
    pass


def load(folder, name):
    path = folder / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Missing(f"{path}: {e}")


def runs(doc, path):
    """Benchmark name -> its run (the median aggregate when there are repetitions)."""
    out = {}
    for b in doc.get("benchmarks", []):
        name = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                out[name] = b
        elif name not in out:
            out[name] = b
    if not out:
        raise Missing(f"{path}: no benchmark results")
    return out


def pick(found, name, path):
    if name not in found:
        raise Missing(f"{path}: no result for {name}")
    b = found[name]
    if b.get("error_occurred"):
        raise Missing(f"{path}: {name} failed: {b.get('error_message', '')}")
    return b


def ratio(b, counter, name):
    if counter not in b:
        raise Missing(f"rpc.json: {name} has no {counter}")
    return b[counter]


def summarize(folder):
    alloc = runs(load(folder, "allocator.json"), "allocator.json")
    rpc = runs(load(folder, "rpc.json"), "rpc.json")
    disc = runs(load(folder, "discovery.json"), "discovery.json")
    load_run = load(folder, "load.json")
    s = {"allocator_us": {}, "rpc_x_floor": {}, "rpc_x_payload_floor": {},
         "discovery_x_hwloc": {}, "admission_us": {}, "anon_rss_mib": 0.0}
    for key, name in ALLOCATOR.items():
        b = pick(alloc, name, "allocator.json")
        s["allocator_us"][key] = round(b["cpu_time"] * TO_US[b.get("time_unit", "ns")], 3)
    for group, counter in (("rpc_x_floor", "x_floor"), ("rpc_x_payload_floor", "x_payload_floor")):
        for key, names in RPC.items():
            worst = max(ratio(pick(rpc, n, "rpc.json"), counter, n) for n in names)
            s[group][key] = round(worst, 4)
    admission = [n for n in rpc if n.startswith("BM_AdmissionDense250")]
    if not admission:
        raise Missing("rpc.json: no result for BM_AdmissionDense250")
    b = pick(rpc, admission[0], "rpc.json")
    s["admission_us"]["dense250_p50"] = round(b["p50_us"], 1)
    s["admission_us"]["dense250_p99"] = round(b["p99_us"], 1)
    for name, b in sorted(disc.items()):
        if not name.startswith("BM_Discover/"):
            continue
        label = b.get("label", "")
        if not label.endswith(".xml"):
            raise Missing(f"discovery.json: {name} has no fixture label")
        s["discovery_x_hwloc"][label[: -len(".xml")]] = round(b["ratio_to_hwloc"], 4)
    if not s["discovery_x_hwloc"]:
        raise Missing("discovery.json: no BM_Discover result")
    samples = [load_run[p]["plugin_after"]["anon_mb"]
               for p in ("warmup", "floor_before", "load", "floor_after")]
    if load_run.get("errors", 1) != 0 or not load_run.get("alive") or max(samples) <= 0:
        raise Missing(f"load.json: bench_load did not run cleanly (errors {load_run.get('errors')}, "
                      f"alive {load_run.get('alive')}, stop {load_run.get('stop')})")
    s["anon_rss_mib"] = round(max(samples), 3)
    return s


def table(s):
    rows = []
    for group in ("allocator_us", "rpc_x_floor", "rpc_x_payload_floor", "discovery_x_hwloc",
                  "admission_us"):
        for key, value in s[group].items():
            budget = BUDGET[group][key] if isinstance(BUDGET[group], dict) else BUDGET[group]
            rows.append((f"{group}.{key}", value, budget))
    rows.append(("anon_rss_mib", s["anon_rss_mib"], BUDGET["anon_rss_mib"]))
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>10}  {'budget':>8}")
    over = budgeted = 0
    for name, value, budget in rows:
        if budget is None:
            print(f"{name:<{width}}  {value:>10.3f}  {'-':>8}")
            continue
        ok = value <= budget
        budgeted += 1
        over += not ok
        print(f"{name:<{width}}  {value:>10.3f}  {budget:>8.2f}  {'ok' if ok else 'OVER'}")
    print(f"{budgeted - over} of {budgeted} figures within budget")


def main():
    if len(sys.argv) != 2:
        print("usage: bench/summary.py DIR", file=sys.stderr)
        return 2
    folder = pathlib.Path(sys.argv[1])
    try:
        s = summarize(folder)
    except Missing as e:
        print(f"bench summary: {e}", file=sys.stderr)
        return 2
    (folder / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    table(s)
    print(f"wrote {folder / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
