"""Live dispatch comparison on this host: Kairos vs FCFS (Ribbon) through ``recserve route`` in front of
two node servers of different speed, predicted first by the simulator on the measured latencies.

The two backends are two instance types of the kind SDM and Kairos mix: a DRAM node (all tables in
memory, its worker pinned to core 0) and a cheaper SSD node (every table in files on disk behind a
small DRAM row cache, real block reads; worker pinned to core 1).  The SSD node is fine for small
queries and misses the QoS target on large ones, which is the heterogeneity Kairos exploits.

Steps, all in one run:
1. latency vs batch size of each backend (one query at a time, through HTTP);
2. QoS = ``--qos-x`` × the DRAM node's p99 latency at the largest batch, so every query can meet it
   on the DRAM node and only small ones on the SSD node;
3. the simulator (``recserve.sim``, the same policy objects) predicts each policy's allowable
   throughput on these two measured latency curves;  in both the simulator and the router the
   policies' latency predictors start from these curves (a pool file's ``prior``) and learn online:
   a cold predictor lets a greedy policy lock in whichever type its first completions made look fast;
4. each policy's allowable throughput live (open-loop Poisson, production-like size mix, p99 under
   QoS), policies alternated ``--rounds`` times so host drift hits both.

    .venv/bin/python benchmarks/bench_route.py [--model kairos-wnd] [--duration-s 8] [--rounds 2]

Writes results/route_live.json.  Takes several minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from recserve.measure.loadgen import LoadSession
from recserve.measure.maxload import find_max_load
from recserve.measure.requests import RequestPool
from recserve.measure.targets import make_target
from recserve.policies.predictor import prior_from_profiles
from recserve.policies.router import Backend, PoolConfig, Router, RouterThread
from recserve.profiles import ProfileSet, ProfileTable
from recserve.serving import NodeServer
from recserve.serving.config import quick_config
from recserve.sim.dispatch_eval import DispatchEvaluation
from recserve.specs import get_model

SIZES = (10, 100, 250, 500, 750, 1000)
POLICIES = ("kairos", "ribbon")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def backend_latency(url: str, model: str, scale: float, reps: int) -> list[list[float]]:
    """latency_vs_batch rows [batch, mean, p50, p99] of one query at a time."""
    rows = []
    for s in SIZES:
        pool = RequestPool(get_model(model), scale, (s,))
        with LoadSession(make_target(url, model), pool) as sess:
            sess.run(rate=5.0, duration_s=None, max_requests=2)  # warm the path (and the SSD node's cache)
            lat = np.concatenate([sess.run(rate=100.0, duration_s=None, max_requests=1, seed=i).latencies_ms
                                  for i in range(reps)])
        rows.append([float(s), float(lat.mean()), float(np.percentile(lat, 50)), float(np.percentile(lat, 99))])
    return rows


def curves_profile(model: str, curves: dict[str, list[list[float]]]) -> ProfileSet:
    profiles = ProfileSet()
    for name, rows in curves.items():
        profiles.add(ProfileTable(model, name, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows))
    return profiles


def simulate(model: str, profiles: ProfileSet, qos: float) -> dict[str, float]:
    """Allowable throughput per policy on the two measured curves, predictors seeded like the live router's."""
    ev = DispatchEvaluation(profiles, model, qos, queries=4000, log=None, seed_predictor=True)
    return {k: v.max_qps for k, v in ev.evaluate(["dram", "ssd"], [*POLICIES, "oracle"]).items()}


def live(model: str, scale: float, urls: dict[str, str], qos: float, policy: str, duration_s: float,
         start_qps: float, profiles: ProfileSet) -> dict:
    prior = prior_from_profiles(profiles, model, ["dram", "ssd"])
    pool = PoolConfig([Backend(urls["dram"], "dram", 1, True), Backend(urls["ssd"], "ssd", 1)], qos, prior=prior)
    router = Router(pool, pool.make_policy(policy))
    thread = RouterThread(router)
    port = thread.start()
    mix = RequestPool.from_mix(get_model(model), scale, "production", pool=32)
    try:
        with LoadSession(make_target(f"http://127.0.0.1:{port}", model), mix) as sess:
            sess.run(rate=start_qps / 2, duration_s=4.0)  # warm-up: the predictor learns both backends
            t0 = time.time()
            res = find_max_load(lambda r: sess.run(rate=r, duration_s=duration_s, min_requests=100), qos, 99.0,
                                start_qps=start_qps, rtol=0.08, max_probes=10, log=log)
        return {"max_qps": res.max_qps, "probes": len(res.probes), "search_s": time.time() - t0,
                "router_stats": router.stats()}
    finally:
        thread.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default="kairos-wnd")
    ap.add_argument("--scale", type=float, default=1e-3)
    ap.add_argument("--cache-mb", type=float, default=0.25, help="the SSD node's DRAM row cache")
    ap.add_argument("--qos-x", type=float, default=1.3,
                    help="QoS = this x the DRAM node's p99 latency at batch 1000 (one query at a time)")
    ap.add_argument("--duration-s", type=float, default=8.0, help="seconds per load probe")
    ap.add_argument("--rounds", type=int, default=2, help="times each policy is measured (alternating)")
    ap.add_argument("--reps", type=int, default=20, help="queries per batch size for the latency curves")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="recserve-ssd-node-") as ssd_dir:
        tier = {"dir": ssd_dir, "tables": "all", "cache_mb": args.cache_mb}
        servers = {"dram": NodeServer(quick_config(args.model, scale=args.scale, cores=[0])),
                   "ssd": NodeServer(quick_config(args.model, scale=args.scale, cores=[1], options={"tier": tier}))}
        try:
            urls = {name: f"http://127.0.0.1:{srv.start().http}" for name, srv in servers.items()}
            curves = {name: backend_latency(url, args.model, args.scale, args.reps) for name, url in urls.items()}
            for name, rows in curves.items():
                log(f"{name}: " + ", ".join(f"b{int(r[0])} {r[1]:.1f} ms" for r in rows))
            qos = args.qos_x * curves["dram"][-1][3]
            log(f"QoS p99 target {qos:.1f} ms")
            profiles = curves_profile(args.model, curves)
            sim = simulate(args.model, profiles, qos)
            log("simulated allowable throughput: " + ", ".join(f"{k} {v:.1f}" for k, v in sim.items()))
            start = max(1.0, 0.6 * sim["kairos"])
            runs: dict[str, list[dict]] = {p: [] for p in POLICIES}
            for r in range(args.rounds):
                order = POLICIES if r % 2 == 0 else POLICIES[::-1]
                for policy in order:
                    runs[policy].append(live(args.model, args.scale, urls, qos, policy, args.duration_s, start,
                                             profiles))
                    log(f"round {r + 1}: {policy} allowable {runs[policy][-1]['max_qps']:.1f} qps")
        finally:
            for srv in servers.values():
                srv.stop()
    med = {p: float(np.median([x["max_qps"] for x in v])) for p, v in runs.items()}
    out = {"model": args.model, "scale": args.scale, "ssd_cache_mb": args.cache_mb, "latency_vs_batch": curves,
           "qos_ms": qos, "simulated_qps": sim, "live_qps_median": med, "runs": runs,
           "simulated_kairos_over_ribbon": sim["kairos"] / max(sim["ribbon"], 1e-9),
           "live_kairos_over_ribbon": med["kairos"] / max(med["ribbon"], 1e-9)}
    Path("results").mkdir(exist_ok=True)
    Path("results/route_live.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"QoS p99 {qos:.1f} ms; simulated: kairos {sim['kairos']:.1f} ribbon {sim['ribbon']:.1f} "
          f"oracle {sim['oracle']:.1f} qps ({out['simulated_kairos_over_ribbon']:.2f}x); live median of "
          f"{args.rounds}: kairos {med['kairos']:.1f} ribbon {med['ribbon']:.1f} qps "
          f"({out['live_kairos_over_ribbon']:.2f}x)")
    print("wrote results/route_live.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
