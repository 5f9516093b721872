"""Overload: what a node admits and how fast it sheds at several times its capacity (issue #17).

One model on a node server in its own process, driven by recserve's open-loop Poisson load generator:
first its max load at the SLA (p95), then ``--overload`` times that for ``--seconds``, twice in one run:

- ``deadline``: the node's default admission (a query is admitted only if the worker's online fit says it
  can finish before its deadline, here the SLA; a query that waited past it is answered 504);
- ``count``: admission by queue length alone (``deadline_ms`` so large it never binds), the v1 behaviour.

Prints admitted latency p50/p99, the share shed and how fast a shed query got its answer; writes JSON.

    .venv/bin/python -m benchmarks.bench_overload --model hercules-rmc1 --scale 1e-3 --workers 2 --overload 5

On a small host the generator must not share cores with the workers (at 5x every worker core is busy, and a
starved generator's lag shows up in every latency): ``--worker-cores 1 --generator-cores 0`` pins the node's
workers to core 1 and the generator to core 0 (the node's supervisor keeps both).
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks import harness
from benchmarks.peers.servers import recserve_server
from recserve.commands._plan_common import core_list
from recserve.measure.loadgen import LoadSession
from recserve.measure.maxload import find_max_load
from recserve.measure.requests import RequestPool
from recserve.measure.targets import HttpTarget
from recserve.specs import get_model

COUNT_ONLY_DEADLINE_MS = 1e6
PROBE_MAX_S = 20.0  # never binds: admission by queue length alone


def run_admission(args: argparse.Namespace, pool: RequestPool, sla_ms: float, rate: float | None,
                  deadline_ms: float) -> dict:
    """Max load (when ``rate`` is None) then the overload run, against a fresh node."""
    cores = {"cores": args.worker_cores} if args.worker_cores else {}
    every_core = os.sched_getaffinity(0)
    try:
        return _run_admission(args, pool, sla_ms, rate, deadline_ms, cores)
    finally:
        os.sched_setaffinity(0, every_core)  # the next node is started with every core again


def _run_admission(args: argparse.Namespace, pool: RequestPool, sla_ms: float, rate: float | None,
                   deadline_ms: float, cores: dict) -> dict:
    accel = {"accelerator": {"device": args.accelerator, "workers": 1, "min_items": 1},
             "queue_limit": 256} if args.accelerator else {}
    with recserve_server(args.model, args.scale, args.workers, sla_ms, deadline_ms=deadline_ms, **cores,
                         **accel) as url:
        if args.generator_cores:
            os.sched_setaffinity(0, args.generator_cores)  # after the node started: it keeps every core
        target = HttpTarget(url, args.model, timeout_s=60.0)
        with LoadSession(target, pool, warm=True) as session:
            out: dict = {}
            if rate is None and args.capacity_qps:
                out["capacity_qps"], rate = args.capacity_qps, args.overload * args.capacity_qps
            if rate is None:
                # a probe lasts long enough to hold ``--probe-queries`` queries (at most 20 s): at 20 qps a 3-s
                # probe's p95 was its 3rd-slowest of 60 queries, and one host hiccup failed a rate the node holds
                found = find_max_load(lambda r: session.run(r, min(PROBE_MAX_S, max(args.probe_s, args.probe_queries
                                                                                     / r)), warmup_s=1.0), sla_ms,
                                      start_qps=args.start_qps, rtol=0.1, max_probes=args.max_probes,
                                      log=lambda line: print(line, file=sys.stderr))
                out["capacity_qps"] = found.max_qps
                if found.max_qps <= 0:
                    raise SystemExit(f"{args.model} misses its {sla_ms:g} ms SLA even at the lowest rate on this "
                                     "host: pick a larger --sla-ms, a smaller --scale or another --mix")
                rate = args.overload * found.max_qps
            result = session.run(rate, args.seconds, warmup_s=1.0)
    d = result.to_dict()
    shed = sum(n for kind, n in result.errors.items() if kind != "timeout")
    return {**out, "offered_qps": rate, "ok": result.ok, "measured": result.measured, "errors": result.errors,
            "goodput_qps": result.ok / args.seconds,
            "within_sla_qps": int((result.latencies_ms <= sla_ms).sum()) / args.seconds,
            "shed_share": shed / max(1, result.measured),
            "admitted_ms": {"p50": float(_pct(result.latencies_ms, 50)) if result.ok else None,
                            "p99": float(_pct(result.latencies_ms, 99)) if result.ok else None},
            "shed_answer_ms": d["refused_answer_ms"], "send_lag_ms": d["send_lag_ms"],
            "generator_cpu_per_s": d["generator"]["cpu_per_s"]}


def _pct(values, p: float) -> float:
    import numpy as np

    return float(np.percentile(values, p))


def headline(results: dict) -> list[dict]:
    """Per admission rule: queries answered within the SLA per second under overload, against the max load."""
    return [harness.row(f"answered within SLA at {results['overload']:g}x max load, admission by {name} "
                        "(target: max load at the SLA)", r["within_sla_qps"], "QPS", results["capacity_qps"])
            for name, r in results["admission"].items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--overload", type=float, default=5.0, help="offered load / max load at the SLA")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--probe-s", type=float, default=3.0)
    parser.add_argument("--start-qps", type=float, default=20.0)
    parser.add_argument("--max-probes", type=int, default=10)
    parser.add_argument("--probe-queries", type=int, default=300,
                        help="each probe of the max-load search lasts long enough for this many queries")
    parser.add_argument("--capacity-qps", type=float, default=None,
                        help="skip the max-load search: overload is this many qps times --overload (runs comparable "
                             "across code versions)")
    parser.add_argument("--mix", default="production")
    parser.add_argument("--sla-ms", type=float, default=None, help="default: the model's catalogue SLA")
    parser.add_argument("--deadline-ms", type=float, default=None,
                        help="the node's per-query deadline (default: the SLA; the SLA is end to end, so a node "
                             "whose clients must see p99 within it leaves the network and client their share)")
    parser.add_argument("--worker-cores", type=core_list, default=None,
                        help="cores the workers share, e.g. 1 (default: the node's own choice)")
    parser.add_argument("--generator-cores", type=core_list, default=None,
                        help="cores for the load generator, e.g. 0")
    parser.add_argument("--accelerator", default=None, metavar="DEVICE",
                        help="serve every query through one accelerator worker on DEVICE (cpu, cuda): the CPU "
                             "workers only decode and forward, so the accelerator's own admission is measured")
    parser.add_argument("--out", default="results/bench_overload.json")
    args = parser.parse_args()
    spec = get_model(args.model)
    sla_ms = args.sla_ms or spec.sla.target_ms
    pool = RequestPool.from_mix(spec, args.scale, args.mix, pool=64)
    print(f"== {args.model}: SLA p95 <= {sla_ms:g} ms, {args.workers} workers (load average "
          f"{os.getloadavg()[0]:.2f})", file=sys.stderr)
    deadline = run_admission(args, pool, sla_ms, None, args.deadline_ms or sla_ms)
    count = run_admission(args, pool, sla_ms, deadline["offered_qps"], COUNT_ONLY_DEADLINE_MS)
    results = {"model": args.model, "scale": args.scale, "workers": args.workers, "sla_ms": sla_ms,
               "deadline_ms": args.deadline_ms or sla_ms,
               "worker_cores": args.worker_cores, "generator_cores": args.generator_cores,
               "overload": args.overload, "capacity_qps": deadline["capacity_qps"],
               "load_avg": os.getloadavg()[0], "admission": {"deadline": deadline, "count": count}}
    print(f"{args.model}: max load at the SLA {deadline['capacity_qps']:.1f} qps; offered "
          f"{deadline['offered_qps']:.1f} qps ({args.overload:g}x) for {args.seconds:g} s")
    print(f"{'admission':>10} {'ok':>6} {'ok/s':>7} {'in SLA/s':>9} {'shed':>6} {'admitted p50':>13} "
          f"{'admitted p99':>13} {'shed answer p50':>16} "
          f"{'shed answer p99':>16} {'gen lag p99':>12}")
    for name, r in results["admission"].items():
        adm, shed = r["admitted_ms"], r["shed_answer_ms"]
        fmt = lambda v: f"{v:.1f} ms" if v is not None else "n/a"  # noqa: E731
        print(f"{name:>10} {r['ok']:>6} {r['goodput_qps']:>7.1f} {r['within_sla_qps']:>9.1f} {r['shed_share']:>6.0%} "
              f"{fmt(adm['p50']):>13} "
              f"{fmt(adm['p99']):>13} "
              f"{fmt(shed['p50']):>16} {fmt(shed['p99']):>16} {fmt(r['send_lag_ms']['p99']):>12}")
    print("(latencies from each query's scheduled send: a large generator lag means the host, not the node, "
          "set them)")
    harness.write_result(args.out, args, headline(results), results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
