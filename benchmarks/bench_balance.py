"""How a node's workers share the load when clients reuse keep-alive connections unevenly (issue #14).

A data-plane-v2 worker keeps the connections it accepted.  A client that takes its most recently used idle
connection (aiohttp's pool; most routers) keeps most queries on few connections, so on few workers; one that takes
the connection idle longest spreads them, as many independent clients do.  For each reuse order this drives one
node (``--workers`` workers) at a fixed Poisson rate with the production mix and prints each worker's CPU seconds
and the latency tail: with the node moving idle connections from a worker with queries waiting to an idle sibling,
"newest" should stay close to "oldest".

    .venv/bin/python -m benchmarks.bench_balance --model hercules-rmc1 --rate 150 --seconds 6
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

from benchmarks import harness
from benchmarks.peers.servers import recserve_server
from recserve.measure.loadgen import LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.sink import process_cpu_s
from recserve.measure.targets import HttpTarget
from recserve.specs import get_model


def run(args: argparse.Namespace, pool: RequestPool, reuse: str) -> dict:
    with recserve_server(args.model, args.scale, args.workers, args.sla_ms) as url:
        with urllib.request.urlopen(f"{url}/control/models/{args.model}") as r:
            pids = [w["pid"] for w in json.load(r)["stages"]["model"]["worker_detail"]]
        target = HttpTarget(url, args.model, timeout_s=10.0, reuse=reuse)
        with LoadSession(target, pool, warm=True) as session:
            before = [process_cpu_s([p]) for p in pids]
            result = session.run(args.rate, args.seconds, warmup_s=1.0)
            used = [process_cpu_s([p]) - b for p, b in zip(pids, before, strict=True)]
    d = result.to_dict()
    return {"worker_cpu_s": used, "busiest_share": max(used) / max(1e-9, sum(used)),
            "latency_ms": d["latency_ms"], "ok": result.ok, "measured": result.measured, "errors": result.errors}


def headline(results: dict) -> list[dict]:
    """Per connection reuse order: the busiest worker's share of the workers' CPU, and p99."""
    out = []
    for reuse, r in results.items():
        out.append(harness.row(f"busiest worker's share of worker CPU, reuse {reuse}", r["busiest_share"], "fraction"))
        out.append(harness.row(f"p99, reuse {reuse}", harness.dig(r, "latency_ms", "p99"), "ms"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--sla-ms", type=float, default=100.0, help="the node's query deadline")
    parser.add_argument("--mix", default="production")
    parser.add_argument("--out", default="results/bench_balance.json")
    args = parser.parse_args()
    pool = RequestPool.from_mix(get_model(args.model), args.scale, args.mix, pool=64)
    results = {reuse: run(args, pool, reuse) for reuse in ("oldest", "newest")}
    print(f"{args.model}: {args.workers} workers, {args.rate:g} qps for {args.seconds:g} s ({args.mix} mix)")
    print(f"{'reuse':>7} {'worker CPU s':>20} {'busiest':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'ok':>6}")
    for reuse, r in results.items():
        lat = r["latency_ms"]
        cpus = " / ".join(f"{c:.2f}" for c in r["worker_cpu_s"])
        print(f"{reuse:>7} {cpus:>20} {r['busiest_share']:>8.0%} {lat['p50']:>8.1f} {lat['p95']:>8.1f} "
              f"{lat['p99']:>8.1f} {r['ok']:>6}")
    harness.write_result(args.out, args, headline(results), {"args": vars(args), "results": results})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
