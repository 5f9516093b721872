"""``recserve deploy ray``: run a model as ElasticRec shards on Ray Serve (local Ray, or a cluster
by ``--address``), optionally drive a rising Poisson load and log replica counts per shard."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.specs import get_model


def _parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise RecserveError(f"--ramp must be comma-separated rates, got {text!r}") from exc
    if not rates or any(r <= 0 for r in rates):
        raise RecserveError("--ramp rates must be positive")
    return rates


async def _drive(handle: Any, queries: list[dict[str, np.ndarray]], rate: float, seconds: float,
                 rng: np.random.Generator) -> dict[str, float]:
    """Open-loop Poisson arrivals through the dense shard's handle; latency from scheduled send time."""
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    tasks = []

    async def one(scheduled: float, query: dict[str, np.ndarray]) -> None:
        nonlocal errors
        try:
            await handle.infer.remote(query)
            latencies.append((time.perf_counter() - scheduled) * 1e3)
        except Exception:  # noqa: BLE001 - every failure counts as an error reply
            errors += 1

    t = 0.0
    i = 0
    while t < seconds:
        t += rng.exponential(1.0 / rate)
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(start + t, queries[i % len(queries)])))
        i += 1
    await asyncio.gather(*tasks)
    lat = np.array(latencies) if latencies else np.array([np.nan])
    return {"rate": rate, "sent": i, "errors": errors, "p50_ms": float(np.nanpercentile(lat, 50)),
            "p95_ms": float(np.nanpercentile(lat, 95))}


def _measure_qps_max(weights: dict[str, np.ndarray], probes: dict[str, tuple[np.ndarray, np.ndarray]],
                     seconds: float = 1.0) -> dict[str, float]:
    """ElasticRec's QPSmax per sparse shard: back-to-back gathers of a representative sub-query on the
    shard's own rows (the paper profiles gather operations, Fig. 9), one shard at a time."""
    import torch
    from torch.nn import functional as F

    out = {}
    for name, (indices, offsets) in probes.items():
        weight, idx, off = torch.from_numpy(weights[name]), torch.from_numpy(indices), torch.from_numpy(offsets)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            F.embedding_bag(idx, weight, off, mode="sum")
            done += 1
        out[name] = done / (time.perf_counter() - start)
    return out


def cmd_ray(args: argparse.Namespace) -> int:
    import torch

    from recserve.deploy import ray_serve
    from recserve.deploy.sharding import access_counts, even_layout, shard_weights
    from recserve.embedding.sharded import bucketize
    from recserve.workload.indices import index_sampler
    from recserve.zoo import build, sample_batch

    spec = get_model(args.model)
    if args.max_tables:
        from dataclasses import replace

        spec = replace(spec, tables=spec.tables[: args.max_tables])
    model = build(spec, scale=args.scale, seed=args.seed)
    sampler = index_sampler(f"locality:p={args.locality}")
    history = [sample_batch(model, args.batch, rng=i, sampler=sampler) for i in range(50)]
    layout = even_layout(model, access_counts(model, history), args.shards_per_table, seed=args.seed,
                         scale=args.scale)
    print(f"deploying {spec.name} ({len(spec.tables)} tables x {args.shards_per_table} shards) on Ray Serve ...",
          file=sys.stderr)
    log: dict[str, Any] = {"model": spec.name, "scale": args.scale, "shards": layout.shard_names(), "steps": []}
    try:
        weights = shard_weights(model, layout)
        probe_batch = history[-1]
        probes = {}
        for table in layout.tables:
            indices, offsets = probe_batch.table(table.table)
            parts = bucketize(torch.from_numpy(table.remap)[indices], offsets, torch.tensor(table.boundaries))
            for s, part in enumerate(parts):
                probes[f"{table.name}-s{s}"] = (part.indices.numpy(), part.offsets.numpy())
        measured = _measure_qps_max(weights, probes)  # before Ray starts: its start-up would skew the timing
        # a replica carries at most --headroom of its profiled gather rate (Ray calls cost more than the gather)
        qps_max = {k: v * args.headroom for k, v in measured.items()}
        log["qps_max"] = qps_max
        print("QPSmax per shard (x headroom): " + ", ".join(f"{k}={v:.1f}" for k, v in qps_max.items()),
              file=sys.stderr)
        ray_serve.start_ray(args.address)
        handle = ray_serve.deploy(layout, autoscale=not args.no_autoscale, qps_max=qps_max,
                                  max_replicas=args.max_replicas)
        if not args.ramp:
            print("serving; Ctrl-C to stop", file=sys.stderr)
            while True:
                time.sleep(5)
                print(json.dumps(ray_serve.replica_counts()), file=sys.stderr)
        queries = [sample_batch(model, args.batch, rng=1000 + i, sampler=sampler).as_arrays() for i in range(64)]
        rng = np.random.default_rng(args.seed)
        for rate in _parse_rates(args.ramp):
            result = asyncio.run(_drive(handle, queries, rate, args.step_s, rng))
            result["replicas"] = ray_serve.replica_counts()
            log["steps"].append(result)
            print(f"rate {rate:g}/s: p95 {result['p95_ms']:.1f} ms, errors {result['errors']}, "
                  f"replicas {result['replicas']}", file=sys.stderr)
    finally:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(log, indent=1))
        ray_serve.shutdown()
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("ray", help="serve a model as ElasticRec shards on Ray Serve with per-shard autoscaling")
    p.add_argument("--model", required=True)
    p.add_argument("--scale", type=float, default=1e-3, help="table-row scale for this host")
    p.add_argument("--max-tables", type=int, default=0, help="keep only the first N tables (small hosts)")
    p.add_argument("--shards-per-table", type=int, default=2)
    p.add_argument("--locality", type=float, default=0.9, help="share of lookups on the hottest 10%% of rows")
    p.add_argument("--batch", type=int, default=64, help="items per query")
    p.add_argument("--address", default=None, help="join an existing Ray cluster (default: start a local one)")
    p.add_argument("--ramp", default="", help="comma-separated arrival rates to step through, e.g. 5,20,60")
    p.add_argument("--step-s", type=float, default=20.0, help="seconds per ramp step")
    p.add_argument("--max-replicas", type=int, default=4)
    p.add_argument("--headroom", type=float, default=0.5,
                   help="share of a shard's profiled gather QPSmax one replica may carry before another is added "
                        "(a Ray call costs more than the gather itself)")
    p.add_argument("--no-autoscale", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the run log here")
    p.set_defaults(func=cmd_ray)
