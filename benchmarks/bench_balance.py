"""How a node's workers share the load when clients reuse keep-alive connections unevenly (issue #14).

A data-plane-v2 worker keeps the connections it accepted.  A client that takes its most recently used idle
connection (aiohttp's pool; most routers) keeps most queries on few connections, so on few workers; one that takes
the connection idle longest spreads them, as many independent clients do.  For each reuse order this drives one
node (``--workers`` workers) at a fixed Poisson rate with the production mix and prints each worker's CPU seconds
and the latency tail: with the node moving idle connections from a worker with queries waiting to an idle sibling,
"newest" should stay close to "oldest".

Then the connections themselves (``--burst N``): N connections opened at once to an idle node, each carrying one
query at a time in turn for ``--burst-s`` seconds (no queue forms, so only the spread by count moves any): how many
each worker holds after the first round and at the end.  With ``RECSERVE_BASE_SRC=<another tree>/src`` the same is
measured on a node of that tree too, for a before/after in one run.

    .venv/bin/python -m benchmarks.bench_balance --model hercules-rmc1 --rate 150 --seconds 6
    RECSERVE_BASE_SRC=/path/to/main/src .venv/bin/python -m benchmarks.bench_balance --workers 4 --burst 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.parse
import urllib.request

from benchmarks import harness
from benchmarks.common.clients import MinimalHttp
from benchmarks.common.timing import connections_held
from benchmarks.peers.servers import BASE_SRC_ENV, recserve_base_server, recserve_server
from recserve.measure.loadgen import LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.sink import process_cpu_s
from recserve.measure.targets import HttpTarget
from recserve.specs import get_model


def worker_pids(url: str, model: str) -> list[int]:
    with urllib.request.urlopen(f"{url}/control/models/{model}") as r:
        return [w["pid"] for w in json.load(r)["stages"]["model"]["worker_detail"]]


def run(args: argparse.Namespace, pool: RequestPool, reuse: str) -> dict:
    with recserve_server(args.model, args.scale, args.workers, args.sla_ms) as url:
        pids = worker_pids(url, args.model)
        target = HttpTarget(url, args.model, timeout_s=10.0, reuse=reuse)
        with LoadSession(target, pool, warm=True) as session:
            before = [process_cpu_s([p]) for p in pids]
            result = session.run(args.rate, args.seconds, warmup_s=1.0)
            used = [process_cpu_s([p]) - b for p, b in zip(pids, before, strict=True)]
    d = result.to_dict()
    return {"worker_cpu_s": used, "busiest_share": max(used) / max(1e-9, sum(used)),
            "latency_ms": d["latency_ms"], "ok": result.ok, "measured": result.measured, "errors": result.errors}


def burst(url: str, model: str, pool: RequestPool, connections: int, seconds: float) -> dict:
    """``connections`` opened at once to the node at ``url``, one query each in turn for ``seconds``: the
    connections each worker holds after the first round and at the end."""
    port, pids = urllib.parse.urlsplit(url).port, worker_pids(url, model)
    clients = [MinimalHttp(port, model, pool.batch(0)) for _ in range(connections)]
    held: dict[str, list[int]] = {}
    try:
        end, rounds = None, 0
        while end is None or time.monotonic() < end:
            for client in clients:
                client.infer()
            rounds += 1
            if end is None:
                held["first_round"] = [connections_held(pid, port) for pid in pids]
                end = time.monotonic() + seconds
        held["end"] = [connections_held(pid, port) for pid in pids]
    finally:
        for client in clients:
            client.close()
    return {"connections": connections, "rounds": rounds, "held": held}


def bursts(args: argparse.Namespace, pool: RequestPool) -> dict:
    """``burst`` on a node of this tree and, with ``$RECSERVE_BASE_SRC``, of that one."""
    nodes = {"this tree": recserve_server}
    if os.environ.get(BASE_SRC_ENV):
        nodes["base"] = recserve_base_server
    out = {}
    for name, node in nodes.items():
        with node(args.model, args.scale, args.workers, args.sla_ms) as url:
            out[name] = burst(url, args.model, pool, args.burst, args.burst_s)
    return out


def headline(results: dict, burst_results: dict) -> list[dict]:
    """Per connection reuse order: the busiest worker's share of the workers' CPU, and p99; per node of a burst: the
    share of its connections the fullest worker holds."""
    out = []
    for reuse, r in results.items():
        out.append(harness.row(f"busiest worker's share of worker CPU, reuse {reuse}", r["busiest_share"], "fraction"))
        out.append(harness.row(f"p99, reuse {reuse}", harness.dig(r, "latency_ms", "p99"), "ms"))
    for node, r in burst_results.items():
        for when, held in r["held"].items():
            out.append(harness.row(f"connections of the burst on the fullest worker, {when} ({node})",
                                   max(held) / r["connections"], "fraction"))
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
    parser.add_argument("--burst", type=int, default=0, help="connections opened at once (0: none)")
    parser.add_argument("--burst-s", type=float, default=5.0, help="seconds their queries go on, one at a time")
    parser.add_argument("--no-load", action="store_true", help="only the burst")
    parser.add_argument("--out", default="results/bench_balance.json")
    args = parser.parse_args()
    pool = RequestPool.from_mix(get_model(args.model), args.scale, args.mix, pool=64)
    results = {} if args.no_load else {reuse: run(args, pool, reuse) for reuse in ("oldest", "newest")}
    if results:
        print(f"{args.model}: {args.workers} workers, {args.rate:g} qps for {args.seconds:g} s ({args.mix} mix)")
        print(f"{'reuse':>7} {'worker CPU s':>20} {'busiest':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'ok':>6}")
    for reuse, r in results.items():
        lat = r["latency_ms"]
        cpus = " / ".join(f"{c:.2f}" for c in r["worker_cpu_s"])
        print(f"{reuse:>7} {cpus:>20} {r['busiest_share']:>8.0%} {lat['p50']:>8.1f} {lat['p95']:>8.1f} "
              f"{lat['p99']:>8.1f} {r['ok']:>6}")
    burst_results = bursts(args, pool) if args.burst else {}
    if burst_results:
        print(f"{args.burst} connections opened at once, one query each in turn: connections per worker")
        for node, r in burst_results.items():
            print(f"  {node:>9}: after the first round {r['held']['first_round']}, after {r['rounds']} rounds "
                  f"{r['held']['end']}")
    harness.write_result(args.out, args, headline(results, burst_results),
                         {"args": vars(args), "results": results, "burst": burst_results})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
