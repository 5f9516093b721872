"""Accelerator workers (issue #16): max load at the SLA of a CPU-only, an accelerator-only and a mixed node.

One model, the production query mix, recserve's open-loop Poisson load generator against a node in its own
process; three node layouts, one after another in one run:

- ``cpu``: ``--cpu-only-workers`` CPU workers of ``--cpu-threads`` threads, no accelerator (default: as many
  processes as the mixed node has, CPU and accelerator workers together);
- ``accel``: ``--front-workers`` CPU workers that only decode and forward (``min_items: 1``) +
  ``--accel-workers`` accelerator workers on ``--device``;
- ``mixed``: ``--cpu-workers`` CPU workers + the accelerator workers, queries of >= ``--min-items`` items
  offloaded (DeepRecSys' threshold).  ``--min-items 16,64,256`` measures one mixed node per threshold
  (``mixed-16``, ...): DeepRecSys finds the threshold by such a sweep, on the host, under load.

Prints each node's max load (p95 <= SLA) and where its queries went; writes JSON.  On a CPU-only host the
accelerator is ``--device cpu`` (a many-threaded worker); on a GPU host pass ``--device cuda``.

    .venv/bin/python -m benchmarks.bench_accel --model hera-dlrm-a --scale 1e-3 --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from typing import Any

from benchmarks import harness
from benchmarks.peers.servers import recserve_server
from recserve.commands._plan_common import int_list
from recserve.measure.loadgen import LoadSession
from recserve.measure.maxload import find_max_load
from recserve.measure.requests import RequestPool
from recserve.measure.targets import HttpTarget, SharedMemoryHttpTarget
from recserve.specs import get_model


def split_cores(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """(the node's cores, the load generator's cores) under ``--loadgen-cores K``: the last K of this process's
    cores generate load, the others serve; ([], []) unpinned."""
    cores = sorted(os.sched_getaffinity(0))
    if not args.loadgen_cores:
        return [], []
    if args.loadgen_cores >= len(cores) - args.accel_workers:
        raise SystemExit(f"--loadgen-cores {args.loadgen_cores} leaves too few of {len(cores)} cores to serve")
    return cores[: -args.loadgen_cores], cores[-args.loadgen_cores :]


def layouts(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Node options per layout: (CPU workers, their threads, accelerator section or None).

    Pinned (``--loadgen-cores``): the CPU-only node's workers share every node core; the others' accelerator
    workers get the last ``--accel-workers`` node cores to themselves and their CPU workers share the rest, so a
    CPU worker computing a small query never slows the accelerator workers' host side."""
    node, _ = split_cores(args)
    accel = {"device": args.device, "workers": args.accel_workers, "threads": args.accel_threads,
             "fuse_items": args.fuse_items, "fuse_delay_us": args.fuse_delay_us}
    cpu_cores: dict[str, Any] = {}
    if node:
        accel["cores"] = node[-args.accel_workers :]
        cpu_cores = {"cores": node[: -args.accel_workers]}
    mixed = {"workers": args.cpu_workers, "threads": args.cpu_threads, **cpu_cores}
    found = {
        "cpu": {"workers": args.cpu_only_workers or args.cpu_workers + args.accel_workers,
                "threads": args.cpu_threads, **({"cores": node} if node else {})},
        "accel": {"workers": args.front_workers, "threads": 1, **cpu_cores, "accelerator": {**accel, "min_items": 1}},
        **{f"mixed-{k}" if len(args.min_items) > 1 else "mixed": {**mixed, "accelerator": {**accel, "min_items": k}}
           for k in args.min_items},
    }
    if args.pass_thread:  # each accelerator node again with its passes on a thread (the A/B of pass_thread)
        for name in [n for n, options in found.items() if "accelerator" in options]:
            found[f"{name}-thread"] = {**found[name], "accelerator": {**found[name]["accelerator"],
                                                                      "pass_thread": True}}
    return found


def measure(args: argparse.Namespace, pool: RequestPool, sla_ms: float, options: dict[str, Any]) -> dict[str, Any]:
    workers, node = options["workers"], {k: v for k, v in options.items() if k != "workers"}
    with recserve_server(args.model, args.scale, workers, sla_ms, max_batch_size=args.max_batch_size,
                         queue_limit=args.queue_limit, **node) as url:
        target = (SharedMemoryHttpTarget if args.shm else HttpTarget)(url, args.model, timeout_s=60.0)
        mine = os.sched_getaffinity(0)
        _, loadgen = split_cores(args)
        if loadgen:  # after the node started (it inherits this process's cores): the generator's processes only
            os.sched_setaffinity(0, loadgen)
        try:
            with LoadSession(target, pool, warm=True, procs=args.procs) as session:
                if args.warm_s > 0:  # unmeasured: a device's first passes of each size allocate and autotune
                    session.run(args.start_qps / 2, args.warm_s, warmup_s=0.0)
                found = find_max_load(lambda r: session.run(r, args.probe_s, warmup_s=0.5), sla_ms,
                                      start_qps=args.start_qps, rtol=0.1, max_probes=args.max_probes,
                                      log=lambda line: print(line, file=sys.stderr))
        finally:
            os.sched_setaffinity(0, mine)
        with urllib.request.urlopen(f"{url}/control/models/{args.model}", timeout=30) as r:
            state = json.loads(r.read())
    accel = state.get("accelerator") or {}
    return {"options": options, "max_qps": found.max_qps, "search": found.to_dict(),
            "queries": accel.get("queries", {"cpu": None}), "items": accel.get("items", {}),
            "accel_passes": accel.get("passes", 0), "accel_pass_s": accel.get("pass_seconds", 0.0),
            "accel_pass_items": accel.get("pass_items")}


def headline(results: dict) -> list[dict]:
    """Each node's max load at the SLA."""
    return [harness.row(f"{name} node max load at the SLA", r.get("max_qps"), "QPS")
            for name, r in (results.get("nodes") or {}).items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hera-dlrm-a")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--device", default="cpu", help="the accelerator workers' device: cpu, cuda or cuda:N")
    parser.add_argument("--cpu-workers", type=int, default=1)
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--cpu-only-workers", type=int, default=0,
                        help="workers of the CPU-only node (default: --cpu-workers + --accel-workers)")
    parser.add_argument("--front-workers", type=int, default=1,
                        help="accelerator-only node: CPU workers that decode and forward every query")
    parser.add_argument("--accel-workers", type=int, default=1)
    parser.add_argument("--accel-threads", type=int, default=1)
    parser.add_argument("--min-items", type=int_list, default=[256],
                        help="mixed node: queries of >= this go to the accelerator workers (a list: one node each)")
    parser.add_argument("--fuse-items", type=int, default=4096)
    parser.add_argument("--fuse-delay-us", type=int, default=0)
    parser.add_argument("--max-batch-size", type=int, default=1024)
    parser.add_argument("--mix", default="production")
    parser.add_argument("--sla-ms", type=float, default=None, help="default: the model's catalogue SLA")
    parser.add_argument("--probe-s", type=float, default=3.0)
    parser.add_argument("--start-qps", type=float, default=20.0)
    parser.add_argument("--max-probes", type=int, default=8)
    parser.add_argument("--queue-limit", type=int, default=256,
                        help="the model's queue_limit (split among its CPU workers; also bounds each worker's "
                             "queries outstanding at the accelerator)")
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes")
    parser.add_argument("--layouts", default="", help="which nodes to measure, in order (default: all)")
    parser.add_argument("--loadgen-cores", type=int, default=0,
                        help="pin the load generator to this host's last K cores and the nodes to the others "
                             "(accelerator workers on cores of their own); 0: nothing pinned")
    parser.add_argument("--warm-s", type=float, default=3.0,
                        help="seconds of unmeasured load at half --start-qps before each node's search (a cold "
                             "GPU node lost its first probe: 938 vs 2,500 QPS for the same layout measured later)")
    parser.add_argument("--pool", type=int, default=64, help="distinct queries the load generator cycles through")
    parser.add_argument("--shm", action="store_true",
                        help="offer the queries through Triton's system shared memory (the pool registered once as "
                             "regions; requests carry only their JSON header): queries too large for the wire")
    parser.add_argument("--pass-thread", action="store_true",
                        help="also measure each accelerator node with its passes on a thread (NAME-thread: "
                             "accelerator.pass_thread: true), the A/B of the pass thread")
    parser.add_argument("--out", default="results/bench_accel.json")
    args = parser.parse_args()
    spec = get_model(args.model)
    sla_ms = args.sla_ms or spec.sla.target_ms
    pool = RequestPool.from_mix(spec, args.scale, args.mix, pool=args.pool)
    chosen = [name.strip() for name in args.layouts.split(",") if name.strip()] or list(layouts(args))
    unknown = sorted(set(chosen) - set(layouts(args)))
    if unknown:
        parser.error(f"--layouts: unknown {unknown}; choose from {sorted(layouts(args))}")
    print(f"== {args.model} scale {args.scale:g}, {args.mix} mix (sizes {min(pool.sizes)}..{max(pool.sizes)}), "
          f"SLA p95 <= {sla_ms:g} ms, accelerator device {args.device}, {len(os.sched_getaffinity(0))} cores "
          f"(load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
    results: dict[str, Any] = {"model": args.model, "scale": args.scale, "mix": args.mix, "sla_ms": sla_ms,
                               "device": args.device, "cores": len(os.sched_getaffinity(0)), "nodes": {}}
    for name in chosen:
        print(f"-- {name} node", file=sys.stderr)
        results["nodes"][name] = measure(args, pool, sla_ms, layouts(args)[name])
    results["load_avg_after"] = os.getloadavg()[0]
    print(f"{'node':>12} {'max qps':>9} {'cpu queries':>12} {'accel queries':>14} {'accel passes':>13} "
          f"{'ms/pass':>8}  layout")
    for name, r in results["nodes"].items():
        q = r["queries"]
        per_pass = 1e3 * r["accel_pass_s"] / r["accel_passes"] if r["accel_passes"] else 0.0
        print(f"{name:>12} {r['max_qps']:>9.1f} {q.get('cpu') if q.get('cpu') is not None else 'all':>12} "
              f"{q.get('accelerator', 0):>14} {r['accel_passes']:>13} {per_pass:>8.2f}  {json.dumps(r['options'])}")
    nodes = results["nodes"]
    mixed = {name: r["max_qps"] for name, r in nodes.items() if name.startswith("mixed")}
    if mixed:
        best = max(mixed, key=mixed.get)
        results["best_mixed"] = best
        ratios = {other: mixed[best] / nodes[other]["max_qps"] for other in ("accel", "cpu")
                  if other in nodes and nodes[other]["max_qps"] > 0}
        results["best_mixed_over"] = ratios
        print(f"best mixed node {best} ({mixed[best]:.1f} qps): " + (", ".join(
            f"{r:.2f}x the {other}-only node" for other, r in ratios.items()) or "no other node served at the SLA"))
    harness.write_result(args.out, args, headline(results), results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
