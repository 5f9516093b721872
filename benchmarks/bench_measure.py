"""Benchmarks of the measurement side: how fast the load generator itself can go, the host
microbenchmarks, one model's latency vs batch, and (optionally) its max load through the server.

    .venv/bin/python -m benchmarks.bench_measure [--model hercules-rmc1] [--scale 1e-3] [--sla-ms 200]
                                                 [--server] [--array-mb 512]

Prints a table per part and writes results/bench_measure.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import torch

from benchmarks import harness
from recserve.measure.loadgen import LoadSession
from recserve.measure.profiler import Budget, latency_vs_batch, maxload_tables, measure_host
from recserve.measure.requests import RequestPool
from recserve.specs import SLA, get_model


class NullTarget:
    """Answers instantly: whatever latency and send lag remain are the generator's own."""

    name = "null"

    async def prepare(self, pool):
        pass

    async def infer(self, i):
        await asyncio.sleep(0)

    async def close(self):
        pass


def generator_capacity(spec, rates=(500, 1000, 2000, 4000, 8000), seconds: float = 2.0) -> list[dict]:
    pool = RequestPool.from_mix(spec, 1e-4, "fixed:1", pool=1)
    rows = []
    with LoadSession(NullTarget(), pool) as session:
        for rate in rates:
            r = session.run(rate, seconds, seed=rate)
            rows.append({"offered_qps": rate, "achieved_qps": round(r.achieved_qps, 1), "p50_ms": round(r.p50, 3),
                         "p99_ms": round(r.p99, 3), "send_lag_p99_ms": round(float(r.to_dict()["send_lag_ms_p99"]), 3)})
            print(f"  null target {rate:6d} qps offered: achieved {r.achieved_qps:8.1f}, p50 {r.p50:7.3f} ms, "
                  f"p99 {r.p99:7.3f} ms, send lag p99 {rows[-1]['send_lag_p99_ms']:.3f} ms")
    return rows


def headline(out: dict) -> list[dict]:
    """The highest rate the load generator keeps up with (>= 95 % achieved), the host's random read and GEMM."""
    num = harness.num
    ok = [g for g in out.get("generator") or [] if num(g.get("achieved_qps")) and num(g.get("offered_qps"))
          and g["achieved_qps"] >= 0.95 * g["offered_qps"]]
    best = max(ok, key=lambda g: g["achieved_qps"], default={})
    host = out.get("host") or {}
    return [harness.row("load generator: highest rate it keeps up with (>= 95%; target: offered)",
                        best.get("achieved_qps"), "QPS", best.get("offered_qps")),
            harness.row("host random-read bandwidth (1 thread, 64 B rows)", host.get("random_read_gbs_1t"), "GB/s"),
            harness.row("host FP32 GEMM (1 thread)", host.get("gemm_gflops_1t"), "GFLOP/s")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="hercules-rmc1")
    ap.add_argument("--scale", type=float, default=1e-3)
    ap.add_argument("--array-mb", type=int, default=512)
    ap.add_argument("--server", action="store_true", help="also the max load vs workers through the node server")
    ap.add_argument("--sla-ms", type=float, default=None, help="SLA for the max-load part (default: the model's)")
    ap.add_argument("--out", default="results/bench_measure.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = get_model(args.model)
    cores = len(os.sched_getaffinity(0))
    out = {"model": spec.name, "scale": args.scale, "load_avg_before": os.getloadavg()}

    print("load generator capacity (open loop against an instant target):")
    out["generator"] = generator_capacity(spec)

    budget = Budget(False, args.array_mb, 1.0, 10, 0, 0.2, 3.0, 60, 10, 0.1)
    print("host microbenchmarks:")
    out["host"] = measure_host(budget, cores)
    for k, v in out["host"].items():
        if k not in ("method",):
            print(f"  {k:24s} {v}")

    print(f"{spec.name} latency vs batch (in-process, 1 thread, ms):")
    lat = latency_vs_batch(spec, args.scale, budget)
    out["latency_vs_batch"] = {"columns": list(lat.columns), "rows": lat.rows}
    print("  batch      mean       p50       p99  cpu_mean")
    for r in lat.rows:
        print(f"  {int(r[0]):5d} {r[1]:9.3f} {r[2]:9.3f} {r[3]:9.3f} {r[5]:9.3f}")

    if args.server:
        sla = SLA(args.sla_ms or spec.sla.target_ms, spec.sla.percentile)
        tables = maxload_tables(spec, args.scale, budget, list(range(1, cores + 1)), lat, sla=sla, via="server")
        out["maxload_vs_workers"] = {t.kind: {"columns": list(t.columns), "rows": t.rows, "conditions": t.conditions}
                                     for t in tables}
        for row in tables[0].rows:
            print(f"  {int(row[0])} worker(s): max load {row[1]:.2f} qps "
                  f"at p{sla.percentile:g} <= {sla.target_ms:g} ms")
    out["load_avg_after"] = os.getloadavg()
    path = harness.write_result(args.out, args, headline(out), out)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
