"""ElasticRec live on this host: model-wise replication vs sharded serving of a scaled ``elasticrec-rm1``.

Both deployments run for real on loopback, one after the other:

- **model-wise**: the node server serving the whole model with N workers, each with its own copy of
  the tables (``share_tables: false``: replicating a model copies it, as a replicated container does);
- **sharded**: ``recserve.deploy.local_shards.start_sharded``: embedding-shard replica processes (hot shard
  replicated, cold shards once, or as a ``recserve plan shard`` plan says) + the dense shard (node
  server, ``table_backend: elasticrec``) with N workers.

Measured: memory (RSS and PSS summed over each deployment's worker/replica processes, from /proc;
the front-end process is the same kind in both and is left out), p95/p50 latency at a fixed QPS,
p50 at low load (the added latency of the sharded path = sharded minus model-wise), and per-shard
memory utility (share of a shard's rows touched by the first 1000 queries, ElasticRec Fig. 14).

Defaults keep the first 2 of the 10 RM1 tables (2 cores) and finish in < 3 minutes::

    .venv/bin/python -m benchmarks.bench_elasticrec_live [--scale 0.05] [--tables 2] [--plan plan.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from benchmarks import harness
from recserve.deploy.local_shards import (
    ShardedDeployment,
    make_layout,
    plan_from_json,
    plan_replicas,
    process_memory_mb,
    service_rates,
    start_sharded,
)
from recserve.embedding.sharded import bucketize
from recserve.measure.loadgen import LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.targets import GrpcTarget
from recserve.serving import NodeServer, quick_config
from recserve.specs import first_tables, get_model
from recserve.workload.indices import index_sampler
from recserve.zoo import build, sample_batch


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def measure_latency(address: str, name: str, pool: RequestPool, rate: float, seconds: float,
                    low_rate: float, low_seconds: float) -> dict:
    with LoadSession(GrpcTarget(address, name, timeout_s=30.0), pool, warm=True) as session:
        low = session.run(low_rate, low_seconds, min_requests=20, seed=1)
        fixed = session.run(rate, seconds, min_requests=50, seed=2)
    return {"low_load": {"qps": low_rate, "p50_ms": low.p50, "p95_ms": low.p95, "errors": low.errors,
                         "sent": low.sent},
            "fixed_qps": {"qps": rate, "achieved_qps": fixed.achieved_qps, "p50_ms": fixed.p50, "p95_ms": fixed.p95,
                          "p99_ms": fixed.p99, "errors": fixed.errors, "sent": fixed.sent}}


def memory_utility(model, layout, queries: int, batch: int, locality: float) -> dict[str, list[float]]:
    """Share of each shard's rows read by the first ``queries`` queries (and of the whole table: model-wise)."""
    sampler = index_sampler(f"locality:p={locality}")
    touched = {t.name: [np.zeros(b - a, dtype=bool) for a, b in zip(t.boundaries[:-1], t.boundaries[1:],
                                                                     strict=True)] for t in layout.tables}
    for q in range(queries):
        query = sample_batch(model, batch, rng=50_000 + q, sampler=sampler)
        for t in layout.tables:
            indices, offsets = query.table(t.table)
            for s, part in enumerate(bucketize(torch.from_numpy(t.remap)[indices], offsets, t.boundaries)):
                touched[t.name][s][part.indices.numpy()] = True
    out = {}
    for name, masks in touched.items():
        out[name] = [float(m.mean()) for m in masks]
        out[f"{name} (model-wise, whole table)"] = [float(np.concatenate(masks).mean())]
    return out


def table_bytes(model, layout, modelwise_workers: int) -> dict:
    row = {t.name: model.tables[t.table].weight.shape[1] * 4 for t in layout.tables}
    sharded = sum((b - a) * r * row[t.name] for t in layout.tables
                  for a, b, r in zip(t.boundaries[:-1], t.boundaries[1:], t.replicas, strict=True))
    whole = sum(model.rows[t.table] * row[t.name] for t in layout.tables)
    return {"modelwise_mb": modelwise_workers * whole / 2**20, "sharded_mb": sharded / 2**20,
            "one_copy_mb": whole / 2**20}


def run_modelwise(spec, args, pool) -> dict:
    log(f"model-wise: node server, {args.workers} workers, tables copied per worker")
    config = quick_config(spec.name, scale=args.scale, workers=args.workers, share_tables=False, queue_limit=512)
    with NodeServer(config) as server:
        pids = [w.pid for rt in server.core.models.values() for p in rt.pools.values() for w in p.workers]
        time.sleep(1.0)
        memory = process_memory_mb(pids)
        log(f"model-wise memory: PSS {memory['pss_mb']:.0f} MB, RSS {memory['rss_mb']:.0f} MB "
            f"over {memory['processes']} processes")
        lat = measure_latency(f"127.0.0.1:{server.ports.grpc}", spec.name, pool, args.qps, args.seconds,
                              args.low_qps, args.low_seconds)
    return {"workers": args.workers, "memory": memory, **lat}


def run_sharded(layout, model, args, pool) -> dict:
    log(f"sharded: {sum(sum(t.replicas) for t in layout.tables)} embedding-shard replicas, "
        f"{layout.dense_replicas} dense workers")
    deployment: ShardedDeployment = start_sharded(layout, model=model, queue_limit=512, progress=False)
    try:
        time.sleep(1.0)
        per_shard = {name: process_memory_mb(pids) for name, pids in deployment.replica_pids().items()}
        dense = process_memory_mb(deployment.dense_worker_pids())
        memory = process_memory_mb(deployment.pids())
        log(f"sharded memory: PSS {memory['pss_mb']:.0f} MB, RSS {memory['rss_mb']:.0f} MB "
            f"over {memory['processes']} processes")
        lat = measure_latency(f"127.0.0.1:{deployment.ports.grpc}", deployment.model_name, pool, args.qps,
                              args.seconds, args.low_qps, args.low_seconds)
    finally:
        deployment.stop()
    shards = {t.name: [{"rows": [a, b], "replicas": r} for a, b, r in zip(t.boundaries[:-1], t.boundaries[1:],
                                                                          t.replicas, strict=True)]
              for t in layout.tables}
    return {"dense_replicas": layout.dense_replicas, "shards": shards, "memory": memory, "memory_dense": dense,
            "memory_per_shard": per_shard, **lat}


def headline(r: dict) -> list[dict]:
    """Memory saved by sharding, sharded p95 at a fixed load against model-wise, latency added at low load."""
    dig = harness.dig
    return [harness.row(f"ElasticRec memory saving (PSS, model-wise / sharded), {r.get('model')}",
                        r.get("memory_saving_pss"), "x"),
            harness.row("ElasticRec sharded p95 at fixed load (target: model-wise)",
                        dig(r, "sharded", "fixed_qps", "p95_ms"), "ms", dig(r, "modelwise", "fixed_qps", "p95_ms")),
            harness.row("ElasticRec added latency p50 (sharded - model-wise, low load)", r.get("added_latency_p50_ms"),
                        "ms")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="elasticrec-rm1")
    p.add_argument("--tables", type=int, default=2, help="keep the first N tables (this host has 2 cores)")
    p.add_argument("--scale", type=float, default=0.05, help="table-row scale (0.05: 1M rows per RM1 table)")
    p.add_argument("--plan", default=None, help="`recserve plan shard --json` output for the same model "
                                                "(boundaries, replicas and the model-wise replica count)")
    p.add_argument("--shards-per-table", type=int, default=3, help="without --plan: hot 10%% + even cold shards")
    p.add_argument("--replicas", default="planned",
                   help="without --plan: 'planned' = ceil(target / measured rate) per shard (ElasticRec Alg. 1), "
                        "or replicas per shard position, e.g. 2,1,1 (dense and model-wise: --workers)")
    p.add_argument("--workers", type=int, default=3, help="model-wise replicas; 'planned' sets the target QPS "
                                                          "so that model-wise replication needs this many")
    p.add_argument("--target-qps", type=float, default=0.0, help="planning target (default: see --workers)")
    p.add_argument("--batch", type=int, default=32, help="items per query (ElasticRec: 32)")
    p.add_argument("--locality", type=float, default=0.9)
    p.add_argument("--qps", type=float, default=20.0, help="fixed offered load for the p95 comparison")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--low-qps", type=float, default=4.0, help="low load for the added-latency comparison")
    p.add_argument("--low-seconds", type=float, default=8.0)
    p.add_argument("--utility-queries", type=int, default=1000)
    p.add_argument("--out", default="results/elasticrec_live.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    started = time.time()

    spec = get_model(args.model)
    if args.tables and args.tables < len(spec.tables):
        spec = first_tables(spec, args.tables)
    model = build(spec, scale=args.scale, seed=0)
    plan = plan_from_json(args.plan) if args.plan else None
    planned = args.replicas == "planned" and plan is None
    replicas = None if plan or planned else [int(x) for x in args.replicas.split(",")]
    layout = make_layout(spec, args.scale, plan=plan, shards_per_table=args.shards_per_table, replicas=replicas,
                         dense_replicas=None if plan else args.workers, batch=args.batch, locality=args.locality,
                         model=model)
    if plan is not None:
        args.workers = plan.modelwise_replicas  # the plan's own model-wise baseline
    rates = service_rates(model, layout, args.batch, args.locality)
    target = args.target_qps or 0.95 * args.workers * rates["model"]
    log("service rates (queries/s, one worker): " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items()))
    if planned:
        _dense, args.workers = plan_replicas(layout, rates, target)
        log(f"replicas planned for {target:.0f} QPS: model-wise {args.workers}, dense {layout.dense_replicas}, "
            "shards " + "; ".join(f"{t.name} x{t.replicas}" for t in layout.tables))
    log(f"{spec.name} at scale {args.scale:g}: rows {model.rows}; layout " + "; ".join(
        f"{t.name} {t.boundaries} x{t.replicas}" for t in layout.tables))
    pool = RequestPool(spec, args.scale, sizes=(args.batch,) * 16, seed=3, index=f"locality:p={args.locality}")

    modelwise = run_modelwise(spec, args, pool)
    sharded = run_sharded(layout, model, args, pool)
    log(f"memory utility over the first {args.utility_queries} queries ...")
    utility = memory_utility(model, layout, args.utility_queries, args.batch, args.locality)

    result = {
        "model": spec.name, "scale": args.scale, "rows": list(model.rows), "batch": args.batch,
        "locality": args.locality, "host_cores": len(os.sched_getaffinity(0)),
        "layout_source": args.plan or f"even layout, {args.shards_per_table} shards/table, replicas {args.replicas}",
        "service_rates_qps": rates, "planning_target_qps": target,
        "table_bytes": table_bytes(model, layout, args.workers),
        "modelwise": modelwise, "sharded": sharded, "memory_utility": utility,
        "memory_saving_pss": modelwise["memory"]["pss_mb"] / max(1e-9, sharded["memory"]["pss_mb"]),
        "added_latency_p50_ms": sharded["low_load"]["p50_ms"] - modelwise["low_load"]["p50_ms"],
        "notes": ["memory = worker + shard-replica processes (front end excluded, same kind in both)",
                  "PSS splits shared library pages (torch, forkserver) among processes; RSS counts them in each"],
        "elapsed_s": time.time() - started,
    }
    print_summary(result)
    harness.write_result(args.out, args, headline(result), result)
    log(f"wrote {args.out} ({result['elapsed_s']:.0f} s)")
    return 0


def print_summary(r: dict) -> None:
    mw, sh = r["modelwise"], r["sharded"]
    tb = r["table_bytes"]
    print(f"{r['model']} scale {r['scale']:g} rows {r['rows']} ({r['layout_source']})")
    print(f"{'':12s} {'PSS MB':>8s} {'RSS MB':>8s} {'procs':>5s} {'tables MB':>9s} "
          f"{'p50@low':>8s} {'p50@fix':>8s} {'p95@fix':>8s} {'errors':>6s}")
    for label, d, tables in (("model-wise", mw, tb["modelwise_mb"]), ("sharded", sh, tb["sharded_mb"])):
        m, lo, fx = d["memory"], d["low_load"], d["fixed_qps"]
        print(f"{label:12s} {m['pss_mb']:8.0f} {m['rss_mb']:8.0f} {m['processes']:5d} {tables:9.0f} "
              f"{lo['p50_ms']:8.2f} {fx['p50_ms']:8.2f} {fx['p95_ms']:8.2f} "
              f"{sum(lo['errors'].values()) + sum(fx['errors'].values()):6d}")
    print(f"fixed load {mw['fixed_qps']['qps']:g} QPS, low load {mw['low_load']['qps']:g} QPS; memory saving (PSS) "
          f"{r['memory_saving_pss']:.2f}x; added latency of the sharded path (p50, low load) "
          f"{r['added_latency_p50_ms']:+.2f} ms")
    for name, shares in r["memory_utility"].items():
        print(f"memory utility {name}: " + ", ".join(f"S{i + 1} {100 * u:.1f}%" for i, u in enumerate(shares)))
    for name, m in sh["memory_per_shard"].items():
        print(f"  shard {name}: {m['processes']} replicas, PSS {m['pss_mb']:.0f} MB, RSS {m['rss_mb']:.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
