#!/usr/bin/env python3
"""bench/summary.py on hand-written benchmark outputs: summary.json has exactly the keys that
scripts/bench.sh promises (numbers only), takes medians when there are repetitions and the worst
of several sizes where a key pools them; the table judges the figures that have a budget and shows
the payload-floor ratios without one; a missing input exits 2 naming the file."""
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SUMMARY = ROOT / "bench" / "summary.py"


def gb(rows):
    return {"context": {}, "benchmarks": rows}


def it(name, **kw):
    return dict({"name": name, "run_name": name, "run_type": "iteration"}, **kw)


def median(name, **kw):
    return dict({"name": name + "_median", "run_name": name, "run_type": "aggregate",
                 "aggregate_name": "median"}, **kw)


def write_inputs(d):
    alloc = [median("BM_Exclusive/hcas:8/size:2/gpus:1/shape:0", cpu_time=9000, time_unit="ns"),
             median("BM_Exclusive/hcas:32/size:4/gpus:1/shape:0", cpu_time=101, time_unit="us"),
             median("BM_Exclusive/hcas:32/size:8/gpus:1/shape:0", cpu_time=248, time_unit="us"),
             median("BM_Exclusive/hcas:64/size:8/gpus:0/shape:1", cpu_time=367, time_unit="us"),
             median("BM_Shared/ids:1000/size:8", cpu_time=5, time_unit="us"),
             dict(median("BM_Shared/ids:1000/size:8", cpu_time=99, time_unit="us"),
                  aggregate_name="mean")]
    rpc = [it("BM_GetPreferredAllocation/0/8/1/manual_time", x_floor=1.02, x_payload_floor=1.01),
           it("BM_GetPreferredAllocation/0/8/2/manual_time", x_floor=1.11, x_payload_floor=1.03),
           it("BM_GetPreferredAllocation/0/8/4/manual_time", x_floor=1.04, x_payload_floor=1.02),
           it("BM_GetPreferredAllocation/0/32/4/manual_time", x_floor=1.2, x_payload_floor=1.05),
           it("BM_GetPreferredAllocation/1/8/8/manual_time", x_floor=2.5, x_payload_floor=1.3),
           it("BM_Allocate/0/8/1/manual_time", x_floor=1.3, x_payload_floor=1.07),
           it("BM_Allocate/0/8/4/manual_time", x_floor=1.4, x_payload_floor=1.06),
           it("BM_AdmissionDense250/min_time:0.500/manual_time", p50_us=812.34, p99_us=2950.06)]
    disc = [it("BM_Discover/0/manual_time", label="dgx-h100-like.xml", ratio_to_hwloc=1.3),
            it("BM_Discover/1/manual_time", label="nvidiaDGX2.xml", ratio_to_hwloc=1.2)]
    phase = lambda anon: {"plugin_after": {"anon_mb": anon}}
    load = {"errors": 0, "alive": True, "stop": "exit 0", "warmup": phase(2.0),
            "floor_before": phase(2.1), "load": phase(2.5), "floor_after": phase(2.4)}
    for name, doc in (("allocator.json", gb(alloc)), ("rpc.json", gb(rpc)),
                      ("discovery.json", gb(disc)), ("load.json", load)):
        (d / name).write_text(json.dumps(doc))


def main():
    failures = []
    check = lambda ok, what: ok or failures.append(what)
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        write_inputs(d)
        r = subprocess.run([sys.executable, SUMMARY, d], capture_output=True, text=True)
        check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
        s = json.loads((d / "summary.json").read_text())
        check(sorted(s) == ["admission_us", "allocator_us", "anon_rss_mib", "discovery_x_hwloc",
                            "rpc_x_floor", "rpc_x_payload_floor"], f"top-level keys {sorted(s)}")
        check(s["admission_us"] == {"dense250_p50": 812.3, "dense250_p99": 2950.1},
              f"admission_us {s['admission_us']}")
        check(sorted(s["allocator_us"]) == sorted(["dgx8_size2_gpus", "scaled32_size4_gpus",
                                                   "scaled32_size8_gpus", "distinct64_size8",
                                                   "shared1000_size8"]),
              f"allocator_us keys {sorted(s['allocator_us'])}")
        check(sorted(s["rpc_x_floor"]) == sorted(["prefer_exclusive_8", "prefer_exclusive_32",
                                                  "prefer_shared_1000", "allocate_exclusive_8"]),
              f"rpc_x_floor keys {sorted(s['rpc_x_floor'])}")
        check(s["allocator_us"]["dgx8_size2_gpus"] == 9.0, "ns converted to us")
        check(s["allocator_us"]["shared1000_size8"] == 5, "the median, not the mean")
        check(s["rpc_x_floor"]["prefer_exclusive_8"] == 1.11, "the worst of the 8-HCA sizes")
        check(s["rpc_x_floor"]["allocate_exclusive_8"] == 1.4, "the worst Allocate")
        # The payload floor's ratios, from the same benchmarks' counter: figures without a budget
        # (1.3 would be over any), shown and not counted.
        check(s["rpc_x_payload_floor"] == {"prefer_exclusive_8": 1.03, "prefer_exclusive_32": 1.05,
                                           "prefer_shared_1000": 1.3, "allocate_exclusive_8": 1.07},
              f"rpc_x_payload_floor {s['rpc_x_payload_floor']}")
        rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.strip()}
        check(rows.get("rpc_x_payload_floor.prefer_shared_1000") == ["1.300", "-"],
              f"payload floor row {rows.get('rpc_x_payload_floor.prefer_shared_1000')}")
        check(rows.get("rpc_x_floor.prefer_shared_1000") == ["2.500", "1.25", "OVER"],
              f"budgeted row {rows.get('rpc_x_floor.prefer_shared_1000')}")
        budgeted = 5 + 4 + 2 + 2 + 1  # allocator, rpc_x_floor, discovery, admission, memory
        check(f"of {budgeted} figures within budget" in r.stdout, "only budgeted figures counted")
        check(s["discovery_x_hwloc"] == {"dgx-h100-like": 1.3, "nvidiaDGX2": 1.2},
              f"discovery keys {s['discovery_x_hwloc']}")
        check(s["anon_rss_mib"] == 2.5, "the largest anonymous-memory sample")
        numbers = [v for g in s.values() for v in (g.values() if isinstance(g, dict) else [g])]
        check(all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers),
              "numbers only")
        check("OVER" in r.stdout and "within budget" in r.stdout, "a budget table")

        # A bench_rpc without the payload floor (an old binary): exit 2 naming the counter.
        doc = json.loads((d / "rpc.json").read_text())
        del doc["benchmarks"][0]["x_payload_floor"]
        (d / "rpc.json").write_text(json.dumps(doc))
        r = subprocess.run([sys.executable, SUMMARY, d], capture_output=True, text=True)
        check(r.returncode == 2 and "x_payload_floor" in r.stderr,
              f"missing counter: {r.returncode} {r.stderr}")

        (d / "rpc.json").unlink()
        r = subprocess.run([sys.executable, SUMMARY, d], capture_output=True, text=True)
        check(r.returncode == 2 and "rpc.json" in r.stderr, f"missing input: {r.returncode} {r.stderr}")
    for f in failures:
        print("FAILED:", f)
    print(f"summary_test: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
