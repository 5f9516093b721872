"""Live dispatch comparison on this host: Kairos vs FCFS (Ribbon) through ``recserve route`` in front of
two node servers of different speed, predicted first by the simulator on the measured latencies.

The two backends are two instance types of the kind SDM and Kairos mix: a DRAM node (all tables in
memory, its worker pinned to core 0) and a cheaper SSD node (every table in files on disk behind a
small DRAM row cache, real block reads; worker pinned to core 1).  The SSD node is fine for small
queries and misses the QoS target on large ones, which is the heterogeneity Kairos exploits.

Steps, all in one run:
1. latency vs batch size of each backend (one query at a time, through HTTP);
2. QoS = ``--qos-x`` × max(the DRAM node's p99 at the largest batch, the SSD node's mean at batch
   500): every query can meet it on the DRAM node, the SSD node only queries up to about 500 items
   (roughly 85 % of the production mix);
3. the simulator (``recserve.sim``, the same policy objects) predicts each policy's allowable
   throughput on these two measured latency curves;  in both the simulator and the router the
   policies' latency predictors start from these curves (a pool file's ``prior``) and learn online:
   a cold predictor lets a greedy policy lock in whichever type its first completions made look fast;
4. each policy live at the same ladder of offered rates (open-loop Poisson, production-like size
   mix), p99 per rate, policies alternated ``--rounds`` times so host drift hits both; allowable
   throughput = the highest rung below which every rung's median p99 met QoS.  (A bisecting max-load
   search was tried first: at the low rates a failing policy is driven to, a probe holds a few dozen
   queries, its p99 is their maximum and the search ends wherever one slow query happens to fall.)

    .venv/bin/python -m benchmarks.bench_route [--model kairos-wnd] [--duration-s 8] [--rounds 2]

``--pool gpu`` (issue #16) routes over a GPU node and a CPU-only node on one host instead, the pair Kairos plans
(g4dn + CPU instances): the host's cores are split, the GPU node's CPU workers (decode and forward every query,
``min_items: 1``) and its accelerator worker on ``--gpu-cores``, the CPU node's workers (one query each) on the
rest; QoS is the model's SLA target unless ``--qos-ms``.  On a host without CUDA, ``--device cpu`` runs the same
layout with a many-threaded CPU worker in the GPU's place (a check of the harness, not a GPU number):

    python -m benchmarks.bench_route --pool gpu --model hera-din --scale 0.01 --device cuda --gpu-cores 0-3

Writes results/route_live.json.  Takes several minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from recserve.commands._plan_common import core_list
from recserve.measure.loadgen import LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.targets import make_target
from recserve.policies.predictor import prior_from_profiles
from recserve.policies.router import Backend, PoolConfig, Router, RouterThread
from recserve.profiles import ProfileSet, ProfileTable
from recserve.serving import NodeServer
from recserve.serving.node.config import quick_config
from recserve.sim.dispatch_eval import DispatchEvaluation
from recserve.specs import get_model

SIZES = (10, 100, 250, 500, 750, 1000)
LADDER = (0.25, 0.4, 0.55, 0.7, 0.85, 1.0)  # offered rates, as fractions of the simulated max
QOS_SWEEP = (1.0, 1.1, 1.25, 1.5)
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
            runs = [sess.run(rate=100.0, duration_s=None, max_requests=1, seed=i) for i in range(reps)]
        lat = np.concatenate([r.latencies_ms for r in runs])
        if not len(lat):
            raise SystemExit(f"{url}: no query of {s} items was answered: {runs[-1].to_dict()['errors']}")
        rows.append([float(s), float(lat.mean()), float(np.percentile(lat, 50)), float(np.percentile(lat, 99))])
    return rows


def curves_profile(model: str, curves: dict[str, list[list[float]]]) -> ProfileSet:
    profiles = ProfileSet()
    for name, rows in curves.items():
        profiles.add(ProfileTable(model, name, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows))
    return profiles


def simulate(model: str, profiles: ProfileSet, qos: float, slots: dict[str, int]) -> dict[str, float]:
    """Allowable throughput per policy on the measured curves (one simulated instance per router slot),
    predictors seeded like the live router's."""
    ev = DispatchEvaluation(profiles, model, qos, queries=4000, log=None, seed_predictor=True)
    pool = [name for name, n in slots.items() for _ in range(n)]
    return {k: v.max_qps for k, v in ev.evaluate(pool, [*POLICIES, "oracle"]).items()}


def live(model: str, scale: float, urls: dict[str, str], qos: float, policy: str, duration_s: float,
         rates: list[float], profiles: ProfileSet, seed: int, slots: dict[str, int], procs: int = 1) -> dict:
    """p99 at each offered rate (ascending, one router for the whole ladder: it keeps learning).
    The first backend of ``urls`` is the base type (the one that can serve every query)."""
    prior = prior_from_profiles(profiles, model, list(urls))
    pool = PoolConfig([Backend(url, name, slots[name], i == 0) for i, (name, url) in enumerate(urls.items())],
                      qos, prior=prior)
    router = Router(pool, pool.make_policy(policy))
    thread = RouterThread(router)
    port = thread.start()
    mix = RequestPool.from_mix(get_model(model), scale, "production", pool=32)
    p99 = []
    try:
        with LoadSession(make_target(f"http://127.0.0.1:{port}", model), mix, procs=procs) as sess:
            sess.run(rate=rates[0], duration_s=4.0, seed=seed)  # warm-up
            for i, rate in enumerate(rates):
                res = sess.run(rate=rate, duration_s=duration_s, min_requests=60, seed=seed + 1 + i)
                p99.append(res.percentile(99.0))
                log(f"  {policy:7s} {rate:6.1f} qps: p99 {p99[-1]:7.1f} ms "
                    f"{'ok' if p99[-1] <= qos else 'VIOLATES'} QoS {qos:.1f} ms")
        return {"rates": rates, "p99_ms": p99, "router_stats": router.stats()}
    finally:
        thread.stop()


def allowable(rates: list[float], p99: list[float], qos: float) -> float:
    """Highest rate of the ladder below which every rate met QoS (0 if the lowest did not)."""
    best = 0.0
    for rate, tail in zip(rates, p99, strict=True):
        if tail > qos:
            break
        best = rate
    return best


def ssd_pool(args: argparse.Namespace, ssd_dir: str) -> tuple[dict[str, NodeServer], dict[str, int]]:
    """A DRAM node (core 0) and an SSD node (core 1), one worker = one router slot each."""
    tier = {"dir": ssd_dir, "tables": "all", "cache_mb": args.cache_mb}
    return ({"dram": NodeServer(quick_config(args.model, scale=args.scale, cores=[0])),
             "ssd": NodeServer(quick_config(args.model, scale=args.scale, cores=[1], options={"tier": tier}))},
            {"dram": 1, "ssd": 1})


def gpu_pool(args: argparse.Namespace) -> tuple[dict[str, NodeServer], dict[str, int]]:
    """A GPU node on ``--gpu-cores`` (CPU workers that forward every query + one accelerator worker on the last of
    those cores) and a CPU-only node with one single-threaded worker per remaining core."""
    every = sorted(os.sched_getaffinity(0))
    mine = args.gpu_cores or every[:max(1, len(every) // 4)]
    rest = [c for c in every if c not in mine]
    if not rest:
        raise SystemExit(f"--gpu-cores {mine} must be some, not all, of this host's cores {every}")
    front = mine[:-1] or mine
    accel = {"device": args.device, "workers": 1, "threads": 1, "min_items": 1, "cores": [mine[-1]],
             "fuse_items": 4096}
    # no shedding by deadline: the latency curves must show what a large query costs on the CPU node
    node = {"queue_limit": 256, "deadline_ms": 30_000}
    gpu = quick_config(args.model, scale=args.scale, workers=len(front), cores=front, accelerator=accel, **node)
    cpu = quick_config(args.model, scale=args.scale, workers=len(rest), cores=rest, **node)
    return {"gpu": NodeServer(gpu), "cpu": NodeServer(cpu)}, {"gpu": args.gpu_slots, "cpu": len(rest)}


def qos_target(args: argparse.Namespace, curves: dict[str, list[list[float]]]) -> float:
    if args.qos_ms:
        return args.qos_ms
    if args.pool == "gpu":
        return float(get_model(args.model).sla.target_ms)
    ssd_500 = float(np.interp(500, [r[0] for r in curves["ssd"]], [r[1] for r in curves["ssd"]]))
    return args.qos_x * max(curves["dram"][-1][3], ssd_500)


def headline(out: dict) -> list[dict]:
    """Kairos' allowable QPS at the p99 QoS against FCFS (Ribbon)'s, live and simulated."""
    dig = harness.dig
    return [harness.row(f"live router: Kairos allowable QPS at p99 QoS, {out.get('model')} (target: FCFS / Ribbon)",
                        dig(out, "live_allowable_qps", "kairos"), "QPS", dig(out, "live_allowable_qps", "ribbon")),
            harness.row("same pool simulated: Kairos (target: FCFS)", dig(out, "simulated_qps", "kairos"), "QPS",
                        dig(out, "simulated_qps", "ribbon"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--pool", choices=("ssd", "gpu"), default="ssd",
                    help="ssd: a DRAM node + an SSD node; gpu: a GPU node + a CPU-only node (issue #16)")
    ap.add_argument("--model", default=None, help="default: kairos-wnd (ssd pool), hera-din (gpu pool)")
    ap.add_argument("--scale", type=float, default=None, help="default: 1e-3 (ssd pool), 0.01 (gpu pool)")
    ap.add_argument("--cache-mb", type=float, default=0.25, help="the SSD node's DRAM row cache")
    ap.add_argument("--device", default="cuda", help="gpu pool: the accelerator's device (cpu: a harness check)")
    ap.add_argument("--gpu-cores", type=core_list, default=None,
                    help="gpu pool: the GPU node's cores, e.g. 0-3 (default: a quarter)")
    ap.add_argument("--gpu-slots", type=int, default=2, help="gpu pool: queries the router keeps at the GPU node")
    ap.add_argument("--procs", type=int, default=1, help="load-generator processes")
    ap.add_argument("--qos-x", type=float, default=1.3,
                    help="ssd pool: QoS = this x max(the DRAM node's p99 at batch 1000, the SSD node's mean at 500)")
    ap.add_argument("--qos-ms", type=float, default=None,
                    help="a fixed QoS target (p99) instead (gpu pool default: the model's SLA target)")
    ap.add_argument("--duration-s", type=float, default=12.0, help="seconds per rate")
    ap.add_argument("--rounds", type=int, default=2, help="times each policy is measured (alternating)")
    ap.add_argument("--reps", type=int, default=20, help="queries per batch size for the latency curves")
    ap.add_argument("--out", default="results/route_live.json")
    ap.add_argument("--plot", default=None, metavar="PNG", help="also draw each policy's p99 vs offered load")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only draw --plot from an earlier run's JSON")
    args = ap.parse_args()
    if args.replot:
        return plot(json.loads(Path(args.replot).read_text()), args.plot or str(Path(args.replot).with_suffix(".png")))
    args.model = args.model or ("hera-din" if args.pool == "gpu" else "kairos-wnd")
    args.scale = args.scale or (0.01 if args.pool == "gpu" else 1e-3)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="recserve-ssd-node-") as ssd_dir:
        servers, slots = gpu_pool(args) if args.pool == "gpu" else ssd_pool(args, ssd_dir)
        try:
            urls = {name: f"http://127.0.0.1:{srv.start().http}" for name, srv in servers.items()}
            curves = {name: backend_latency(url, args.model, args.scale, args.reps) for name, url in urls.items()}
            for name, rows in curves.items():
                log(f"{name}: " + ", ".join(f"b{int(r[0])} {r[1]:.1f} ms" for r in rows))
            qos = qos_target(args, curves)
            log(f"QoS p99 target {qos:.1f} ms")
            profiles = curves_profile(args.model, curves)
            sim = simulate(args.model, profiles, qos, slots)
            log("simulated allowable throughput: " + ", ".join(f"{k} {v:.1f}" for k, v in sim.items()))
            rates = [round(f * max(sim["kairos"], sim["ribbon"], 2.0), 2) for f in LADDER]
            runs: dict[str, list[dict]] = {p: [] for p in POLICIES}
            for r in range(args.rounds):
                order = POLICIES if r % 2 == 0 else POLICIES[::-1]
                for policy in order:
                    runs[policy].append(live(args.model, args.scale, urls, qos, policy, args.duration_s, rates,
                                             profiles, 100 * r, slots, args.procs))
        finally:
            for srv in servers.values():
                srv.stop()
    p99_med = {p: np.median([x["p99_ms"] for x in v], axis=0).tolist() for p, v in runs.items()}
    med = {p: allowable(rates, p99_med[p], qos) for p in POLICIES}
    # the same measured curves read at looser targets: live tails sit above the one-at-a-time curves
    sweep = {f"{x:g}x": {p: allowable(rates, p99_med[p], x * qos) for p in POLICIES} for x in QOS_SWEEP}
    out = {"pool": args.pool, "model": args.model, "scale": args.scale, "slots": slots, "device": args.device,
           "cores": len(os.sched_getaffinity(0)), "ssd_cache_mb": args.cache_mb, "latency_vs_batch": curves,
           "qos_ms": qos, "simulated_qps": sim, "rates": rates, "live_p99_median_ms": p99_med,
           "live_allowable_qps": med, "live_allowable_qps_by_qos": sweep, "runs": runs,
           "simulated_kairos_over_ribbon": sim["kairos"] / max(sim["ribbon"], 1e-9),
           "live_kairos_over_ribbon": med["kairos"] / med["ribbon"] if med["ribbon"] > 0 else None}
    harness.write_result(args.out, args, headline(out), out)
    print(f"QoS p99 {qos:.1f} ms; simulated: kairos {sim['kairos']:.1f} ribbon {sim['ribbon']:.1f} "
          f"oracle {sim['oracle']:.1f} qps ({out['simulated_kairos_over_ribbon']:.2f}x)")
    for p in POLICIES:
        print(f"live {p:7s} p99 (median of {args.rounds}) at " + ", ".join(
            f"{r:g} qps {t:.0f} ms" for r, t in zip(rates, p99_med[p], strict=True)) + f" -> allowable {med[p]:g} qps")
    ratio = out["live_kairos_over_ribbon"]
    verdict = (f"{ratio:.2f}x" if ratio is not None
               else f"FCFS met {qos:.0f} ms at no rate, Kairos up to {med['kairos']:g} qps")
    print(f"live kairos / ribbon allowable throughput at the same QoS: {verdict}")
    for x, a in sweep.items():
        print(f"  at {x} QoS ({float(x[:-1]) * qos:.0f} ms): kairos {a['kairos']:g} qps, ribbon {a['ribbon']:g} qps")
    print(f"wrote {args.out}")
    return plot(out, args.plot) if args.plot else 0


def plot(result: dict, png: str) -> int:
    from recserve.measure.plot import plot_policies_vs_load

    pool = "GPU node + CPU node" if result.get("pool") == "gpu" else "DRAM node + SSD node"
    title = f"{result['model']} @ {result['scale']:g}: Kairos vs FCFS over a {pool}"
    label = {"kairos": "Kairos", "ribbon": "FCFS (Ribbon)"}
    plot_policies_vs_load(result["rates"], {label[p]: result["live_p99_median_ms"][p] for p in POLICIES},
                          result["qos_ms"], png, title, {label[p]: result["simulated_qps"][p] for p in POLICIES})
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
