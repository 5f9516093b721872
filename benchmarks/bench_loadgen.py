"""Load-generator limit: open-loop batch-1 queries against a sink that answers at once.

Whatever latency, send lag and CPU show up are the generator's own (plus loopback), so this shows
at which rate the generator stops keeping its schedule, with 1 and more generator processes.  The
sink (``recserve.measure.sink``: raw asyncio, fixed response, SO_REUSEPORT) runs in its own
processes; its CPU is reported too, since on a small host the sink and the generator share cores.
Target (issue #14): send-lag p99 under 1 ms at 5,000 batch-1 queries/s.

    .venv/bin/python -m benchmarks.bench_loadgen --rates 1000,2000,5000 --procs 1,2 --seconds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks import harness
from recserve.measure.loadgen import LoadResult, LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.sink import SinkServer, process_cpu_s
from recserve.measure.targets import HttpTarget
from recserve.specs import get_model

TARGET_RATE, TARGET_LAG_P99_MS = 5000.0, 1.0


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def row(result: LoadResult, sink_cpu_s: float) -> dict:
    """The table's columns for one run (send lag in ms, CPU in core-seconds per second)."""
    return {"procs": result.procs, "offered_qps": result.offered_qps, "achieved_qps": round(result.achieved_qps, 1),
            "send_lag_ms": {p: round(result.send_lag(q), 3) for p, q in (("p50", 50), ("p99", 99), ("max", 100))},
            "latency_p99_ms": round(result.p99, 3), "generator_cpu_per_s": round(result.cpu_per_s, 3),
            "generator_loop_cpu_per_s": round(result.loop_cpu_s / result.run_s, 3) if result.run_s else None,
            "sink_cpu_per_s": round(sink_cpu_s / result.run_s, 3) if result.run_s else None,
            "errors": result.errors, "sent": result.sent, "ok": result.ok}


def measure(url: str, sink_pids: list[int], pool: RequestPool, procs: int, rates: list[int], seconds: float,
            spin_ms: float) -> list[dict]:
    """One generator session of ``procs`` processes, one run per rate."""
    rows = []
    with LoadSession(HttpTarget(url, pool.spec.name, timeout_s=5.0), pool, warm=True, procs=procs,
                     spin_ms=spin_ms) as session:
        for rate in rates:
            sink0 = process_cpu_s(sink_pids)
            result = session.run(float(rate), seconds, seed=rate, max_inflight=2048)
            rows.append(row(result, process_cpu_s(sink_pids) - sink0))
            print(f"  procs {procs} {rate:6d} qps: {result.summary()}", file=sys.stderr)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'procs':>5} {'offered':>8} {'achieved':>9} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} "
          f"{'gen CPU':>8} {'sink CPU':>8} {'lat p99':>8}  errors")
    for r in rows:
        lag = r["send_lag_ms"]
        print(f"{r['procs']:>5} {r['offered_qps']:>8.0f} {r['achieved_qps']:>9.1f} {lag['p50']:>8.3f} "
              f"{lag['p99']:>8.3f} {lag['max']:>8.3f} {r['generator_cpu_per_s']:>8.2f} {r['sink_cpu_per_s']:>8.2f} "
              f"{r['latency_p99_ms']:>8.2f}  {r['errors'] or '-'}")
    print("(lag, latency in ms; CPU in core-seconds per second of run, summed over processes)")


def verdict(rows: list[dict]) -> str:
    at = [r for r in rows if r["offered_qps"] == TARGET_RATE]
    if not at:
        return f"target not measured (no run at {TARGET_RATE:g} qps)"
    best = min(at, key=lambda r: r["send_lag_ms"]["p99"])
    holds = best["send_lag_ms"]["p99"] < TARGET_LAG_P99_MS
    return (f"target send-lag p99 < {TARGET_LAG_P99_MS:g} ms at {TARGET_RATE:g} qps: "
            f"{'holds' if holds else 'does NOT hold'} (best: {best['send_lag_ms']['p99']:.3f} ms with "
            f"{best['procs']} generator process(es))")


def headline(rows: list[dict]) -> list[dict]:
    """Send-lag p99 at 5,000 batch-1 queries/s per generator process count (target: 1 ms, issue #14)."""
    return [harness.row(f"load generator send-lag p99 at 5000 batch-1 qps, {r.get('procs')} process(es) "
                        f"(achieved {r.get('achieved_qps')} qps)", harness.dig(r, "send_lag_ms", "p99"), "ms", 1.0)
            for r in rows if r.get("offered_qps") == 5000]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=_ints, default=[1000, 2000, 5000], help="offered batch-1 queries/s")
    ap.add_argument("--procs", type=_ints, default=[1, 2], help="generator process counts")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per run")
    ap.add_argument("--sink-procs", type=int, default=2, help="sink processes sharing the port")
    ap.add_argument("--spin-ms", type=float, default=0.0, help="generator spin before each send (see LoadSession)")
    ap.add_argument("--model", default="hercules-rmc1", help="whose batch-1 queries are sent")
    ap.add_argument("--out", default="results/loadgen.json")
    args = ap.parse_args()
    pool = RequestPool.from_mix(get_model(args.model), 1e-4, "fixed:1", pool=8)
    load_before = os.getloadavg()
    print(f"[loadgen] load average {load_before[0]:.2f}, {os.cpu_count()} cores", file=sys.stderr)
    sink = SinkServer(procs=args.sink_procs)
    with sink as url:
        rows = [r for procs in args.procs
                for r in measure(url, sink.pids(), pool, procs, args.rates, args.seconds, args.spin_ms)]
    print_table(rows)
    print(verdict(rows))
    out = {"rates": args.rates, "procs": args.procs, "seconds": args.seconds, "sink_procs": args.sink_procs,
           "spin_ms": args.spin_ms, "model": args.model, "cores": os.cpu_count(), "load_avg_before": load_before[0],
           "load_avg_after": os.getloadavg()[0], "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows,
           "verdict": verdict(rows)}
    harness.write_result(args.out, args, headline(rows), out)
    print(f"[loadgen] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
