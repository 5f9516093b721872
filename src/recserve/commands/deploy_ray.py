"""``recserve deploy ray``: run a plan on Ray Serve (local Ray, or a cluster by ``--address``).

``--plan POOL.json`` runs a Kairos pool routed by the Kairos request router, ``--plan COLOCATE.json`` a Hera
co-location plan; with ``--rate`` a Poisson load goes through Ray's HTTP proxy and the result is written beside
the simulator's prediction for the same pool and trace.  ``--model`` runs ElasticRec shards with per-shard
autoscaling and optionally a rising Poisson load, logging replica counts per shard (a shard plan's
``--plan SHARDS.json`` runs the plan's shards); the shards' scores are checked against the in-process model and
their replica counts against the plan.  With ``--json`` and no ``--rate``/``--ramp`` a plan comes up, is checked,
and stops."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from recserve.commands._plan_common import count, fraction, non_negative, non_negative_int, port, positive, seed
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
    if bool(args.plan) == bool(args.model):
        raise RecserveError("deploy ray: give either --plan PLAN.json (pool, colocate, provision, shard or fleet) or "
                            "--model NAME (shards)")
    if args.plan:
        import recserve.planners.fleet  # noqa: F401 - registers the fleet plan kind
        from recserve.planners.plan import Plan

        plan = Plan.load(args.plan)
        if plan.kind == "fleet":  # each planned server group a node server on the Ray nodes of its type
            from recserve.commands import _ray_fleet

            return _ray_fleet.run(args)
        args.seconds = 20.0 if args.seconds is None else args.seconds
        args.cpus = 1.0 if args.cpus is None else args.cpus
        if plan.kind == "shard":  # ElasticRec: the shards as planned, on the existing shard path
            args.model, args.shard_plan = plan.model, plan
            return cmd_ray_shards(args)
        return cmd_ray_plan(args)
    args.seconds = 20.0 if args.seconds is None else args.seconds
    return cmd_ray_shards(args)


def cmd_ray_plan(args: argparse.Namespace) -> int:
    from recserve.deploy import ray_plans, ray_serve
    from recserve.planners.plan import Plan

    plan = Plan.load(args.plan)
    models = [m for m in (args.models or "").split(",") if m]
    report: dict[str, Any] = {"plan": args.plan, "kind": plan.kind, "scale": args.scale}
    if plan.kind == "pool":
        for choice in plan.pools:
            if not models or choice.model in models:
                print(f"{choice.model}: start one Ray node per instance type with ray start --resources:",
                      file=sys.stderr)
                for t, flags in ray_plans.node_start_flags(choice).items():
                    print(f"  {t}: --resources '{flags}'", file=sys.stderr)
    if plan.kind == "provision":
        types = sorted({h for s in plan.steps for alloc in s.allocation.values() for h, n in alloc.items() if n})
        print("start each node with its type marker, ray start --resources '{\"" +
              "|".join(ray_plans.type_resource(t) for t in types) + "\": 1}'", file=sys.stderr)
    drive = _load_plan(args, plan, models) if args.rate and plan.kind != "provision" else None
    log_path = str(Path(args.decisions).resolve()) if args.decisions else None
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text("")
    prior = None
    if args.prior:
        if not drive:
            raise RecserveError("--prior needs --rate (the prior is this host's latency table measured for the run)")
        prior = drive["prior"] = ray_plans.latency_prior(drive["latency"], ray_plans.pool_list(drive["choice"].config))
    try:
        ray_serve.start_ray(args.address)
        routes = ray_plans.serve_plan(plan, args.scale, models or None, args.seed, args.policy, log_path,
                                      args.cpus, int(np.mean(drive["pool"].sizes)) if drive else 100,
                                      args.http_port, prior)
        report["routes"] = routes
        print("serving " + ", ".join(f"{a} at http://127.0.0.1:{args.http_port}{r}" for a, r in routes.items()),
              file=sys.stderr)
        if drive:
            report.update(_run_load(args, drive, routes, log_path))
        elif plan.kind == "colocate":
            report["scores_max_abs_diff"] = _check_colocation(args, plan, routes)
            report["replicas"] = {app: ray_serve.replica_counts(app) for app in routes}
        elif plan.kind == "provision" and args.json:
            report["provision"] = _check_provision(args, plan, routes)
        if not args.json and not drive:
            print("serving; Ctrl-C to stop", file=sys.stderr)
            wait_forever()
    finally:
        write_report_and_shut_down(args.json, report)
    return 0


def wait_forever() -> None:
    """Serve until Ctrl-C (or SIGTERM where the command turns it into one)."""
    while True:
        time.sleep(5)


def write_report_and_shut_down(path: str | None, report: dict[str, Any]) -> None:
    """``--json``: the run's report to ``path``; then Ray Serve is shut down, whatever happened."""
    from recserve.deploy import ray_serve

    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1, default=str))
    ray_serve.shutdown()


def _scores_diff(url: str, model: str, scale: float, seed: int, queries: int = 2) -> float:
    """Max |score difference| of ``queries`` queries through Ray's proxy at ``url`` against the in-process model."""
    import torch

    from recserve.measure.loadgen import LoadSession
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import HttpTarget
    from recserve.zoo import build

    spec = get_model(model)
    pool = RequestPool(spec, scale, (64,) * queries, seed)
    reference = build(spec, scale=scale, seed=seed).eval()
    diffs = []
    with LoadSession(HttpTarget(url, model, timeout_s=60.0), pool) as session:
        for i in range(queries):
            got = session.outputs(i)["scores"]
            with torch.inference_mode():
                want = reference(pool.batch(i)).numpy()
            diffs.append(float(np.abs(got.reshape(want.shape) - want).max()))
    return max(diffs)


def _check_colocation(args: argparse.Namespace, plan: Any, routes: dict[str, str]) -> dict[str, float]:
    """Queries to every model of every planned server group through Ray's proxy, against the in-process model."""
    from recserve.deploy.nodeconfig import server_groups

    out = {}
    for k, (server, _count) in enumerate(server_groups(plan)):
        url = f"http://127.0.0.1:{args.http_port}{routes[f'hera-node-{k}']}"
        for p in server.placements:
            out[f"hera-node-{k}/{p.model}"] = _scores_diff(url, p.model, args.scale, args.seed)
    print("co-location plan: scores vs the in-process models, max |diff|: "
          + ", ".join(f"{k} {v:.3g}" for k, v in out.items()), file=sys.stderr)
    return out


def _check_provision(args: argparse.Namespace, plan: Any, routes: dict[str, str],
                     settle_s: float = 6.0) -> dict[str, Any]:
    """Each (workload, type) deployment planned to run now: scores against the in-process model and a short
    Poisson load through Ray's proxy; then the replicas Ray runs (``serve.status``) beside the autoscaling
    policy's decision (planned count for the hour, raised by the reactive rule for the load carried)."""
    from recserve.deploy import ray_serve
    from recserve.deploy.ray_plans import provision_targets
    from recserve.measure.loadgen import LoadSession
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import HttpTarget
    from recserve.planners.replicas import replicas_for
    from recserve.policies.provision_autoscaler import hour_of_day

    rate = args.rate or 4.0
    out: dict[str, Any] = {"hour_utc": hour_of_day(), "rate_qps": rate, "seconds": args.seconds, "deployments": {}}
    for target in provision_targets(plan):
        planned = target.decision(out["hour_utc"])
        entry: dict[str, Any] = {"workload": target.workload, "server": target.server, "planned_now": planned,
                                 "qps_per_server": target.qps_per_server,
                                 "replicas_after_deploy": ray_serve.wait_replicas({target.name: planned}, target.name,
                                                                                  60.0).get(target.name, 0)}
        if planned:  # a deployment planned at 0 servers now has no replica to answer
            url = f"http://127.0.0.1:{args.http_port}{routes[target.name]}"
            entry["scores_max_abs_diff"] = _scores_diff(url, target.workload, args.scale, args.seed)
            pool = RequestPool.from_mix(get_model(target.workload), args.scale, args.mix, pool=16, seed=args.seed)
            with LoadSession(HttpTarget(url, target.workload, timeout_s=30.0), pool) as session:
                result = session.run(rate, args.seconds, timeout_s=30.0, seed=args.seed)
            entry["load"] = {"sent": result.sent, "ok": result.ok, "errors": dict(result.errors),
                             "achieved_qps": result.achieved_qps, "p99_ms": result.percentile(99),
                             "p50_ms": float(np.percentile(result.latencies_ms, 50))}
        out["deployments"][target.name] = entry
    time.sleep(settle_s)  # a few of the policy's metric intervals
    hour = hour_of_day()
    for target in provision_targets(plan):
        entry = out["deployments"][target.name]
        carried = entry.get("load", {}).get("achieved_qps", 0.0)
        entry["reactive_servers"] = replicas_for(carried, target.qps_per_server) if carried and \
            target.qps_per_server > 0 else 0
        entry["policy_decision"] = target.decision(hour, carried)
        entry["replicas_running"] = ray_serve.replica_counts(target.name).get(target.name, 0)
        entry["as_decided"] = entry["replicas_running"] == entry["policy_decision"]
        load = entry.get("load") or {}
        print(f"{target.name}: planned now {entry['planned_now']}, reactive {entry['reactive_servers']}, policy "
              f"decision {entry['policy_decision']}, Ray runs {entry['replicas_running']}"
              + (f"; scores max |diff| {entry['scores_max_abs_diff']:.3g}; {load['ok']}/{load['sent']} ok at "
                 f"{load['achieved_qps']:.1f} qps, p50 {load['p50_ms']:.1f} ms p99 {load['p99_ms']:.1f} ms"
                 if load else ""), file=sys.stderr)
    return out


def _load_plan(args: argparse.Namespace, plan: Any, models: list[str]) -> dict[str, Any]:
    """The query pool and this host's in-process latency table (measured before Ray starts, for the simulator)."""
    from recserve.measure.profiler import Budget, latency_vs_batch
    from recserve.measure.requests import RequestPool

    if plan.kind != "pool":
        raise RecserveError("--rate drives a pool plan (a Kairos pool); a co-location plan is served without load")
    choice = next((c for c in plan.pools if not models or c.model in models), None)
    if choice is None:
        raise RecserveError(f"plan has none of the models {models}")
    spec = get_model(choice.model)
    pool = RequestPool.from_mix(spec, args.scale, args.mix, pool=16, seed=args.seed)
    latency = latency_vs_batch(spec, args.scale, Budget.of(quick=True), sorted(set(pool.sizes)), seed=args.seed)
    qos = plan.inputs.get("qos_ms", {})
    return {"choice": choice, "spec": spec, "pool": pool, "latency": latency,
            "qos_ms": float(qos.get(choice.model, spec.sla.target_ms))}


def _run_load(args: argparse.Namespace, drive: dict[str, Any], routes: dict[str, str],
              log_path: str | None) -> dict[str, Any]:
    """Scores against the in-process model, then one Poisson run through Ray's proxy, beside the prediction."""
    from recserve.measure.loadgen import LoadSession
    from recserve.measure.targets import HttpTarget
    from recserve.zoo import build

    choice, pool, spec = drive["choice"], drive["pool"], drive["spec"]
    url = f"http://127.0.0.1:{args.http_port}{routes[f'kairos-{choice.model}']}"
    target = HttpTarget(url, choice.model, timeout_s=30.0, size_header=True)
    model = build(spec, scale=args.scale, seed=args.seed).eval()
    out: dict[str, Any] = {"model": choice.model, "pool": choice.config, "qos_ms": drive["qos_ms"],
                           "rate_qps": args.rate, "seconds": args.seconds}
    with LoadSession(target, pool) as session:
        diffs, unloaded = _scores_and_unloaded(session, pool, model)
        out["scores_max_abs_diff"] = max(diffs)
        print(f"scores vs the in-process model: max |diff| {max(diffs):.3g} over {len(diffs)} queries", file=sys.stderr)
        first_measured = len(Path(log_path).read_text().splitlines()) if log_path else 0
        result = session.run(args.rate, args.seconds, timeout_s=30.0, seed=args.seed)
    out["router_prior"] = bool(drive.get("prior"))
    sizes, predicted, out["simulated_with_ray_overhead"] = _predict(args, drive, unloaded)
    out["measured"] = _measured(result)
    out["simulated"] = predicted
    out["latency_table"] = drive["latency"].to_dict()
    if log_path:
        _router_decisions(log_path, first_measured, sizes, out)
    _print_load(args, choice, out)
    return out


def _scores_and_unloaded(session: Any, pool: Any, model: Any) -> tuple[list[float], list[list[float]]]:
    """Every pooled query twice, one at a time, through Ray: its scores' max |difference| from the in-process
    model's (also the warm-up), and its unloaded latency via Ray as [size, ms]."""
    import torch

    diffs, unloaded = [], []
    for _ in range(2):
        for i in range(len(pool.sizes)):
            start = time.perf_counter()
            got = session.outputs(i)["scores"]
            unloaded.append([pool.sizes[i], (time.perf_counter() - start) * 1e3])
            with torch.inference_mode():
                want = model(pool.batch(i)).numpy()
            diffs.append(float(np.abs(got.reshape(want.shape) - want).max()))
    return diffs, unloaded


def _predict(args: argparse.Namespace, drive: dict[str, Any],
             unloaded: list[list[float]]) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
    """The sizes of the trace sent and the simulator's predictions for it: with the in-process service times, and
    with the unloaded latency via Ray as service time."""
    from recserve.deploy.ray_plans import pool_list, predict_pool
    from recserve.measure.loadgen import schedule

    choice, pool = drive["choice"], drive["pool"]
    times, choices = schedule(args.rate, args.seconds, None, len(pool.sizes), args.seed)
    sizes = np.asarray(pool.sizes)[choices]
    prior = drive.get("prior")
    predicted = predict_pool(drive["latency"], pool_list(choice.config), drive["qos_ms"], times, sizes, args.policy,
                             args.seed, prior)
    via_ray = unloaded_table(drive["latency"], unloaded[len(pool.sizes):])  # the second, warm pass
    return sizes, predicted, predict_pool(via_ray, pool_list(choice.config), drive["qos_ms"], times, sizes,
                                          args.policy, args.seed, prior)


def _measured(result: Any) -> dict[str, Any]:
    lat = result.latencies_ms
    return {"sent": result.sent, "ok": result.ok, "errors": result.errors, "achieved_qps": result.achieved_qps,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": result.percentile(99), "mean_ms": float(lat.mean())}


def _router_decisions(log_path: str, first_measured: int, sizes: np.ndarray, out: dict[str, Any]) -> None:
    """From the router's decision log: its pool, and the queries of the measured run it started, by type (were
    they the sizes sent?)."""
    records = [json.loads(line) for line in Path(log_path).read_text().splitlines()]
    out["router_pool"] = next((r["instances"] for r in reversed(records) if r.get("event") == "pool"), None)
    starts = [r for r in records[first_measured:] if r.get("event") == "start"]
    by_type: dict[str, int] = {}
    for r in starts:
        by_type[r["type"]] = by_type.get(r["type"], 0) + 1
    out["measured"]["served_by_type"] = by_type
    out["router_decisions"] = len(starts)
    out["router_sizes_match_sent"] = sorted(r["size"] for r in starts) == sorted(int(s) for s in sizes)


def _print_load(args: argparse.Namespace, choice: Any, out: dict[str, Any]) -> None:
    m, p, v = out["measured"], out["simulated"], out["simulated_with_ray_overhead"]
    print(f"{choice.model} on {choice.config} at {args.rate:g} qps for {args.seconds:g} s: measured p50 "
          f"{m['p50_ms']:.1f} ms p99 {m['p99_ms']:.1f} ms ({m['ok']}/{m['sent']} ok, by type "
          f"{m.get('served_by_type')}); simulated (in-process service times) p50 {p['p50_ms']:.1f} ms p99 "
          f"{p['p99_ms']:.1f} ms (by type {p['served_by_type']}); simulated (unloaded latency via Ray as service "
          f"time) p50 {v['p50_ms']:.1f} ms p99 {v['p99_ms']:.1f} ms (by type {v['served_by_type']})", file=sys.stderr)


def unloaded_table(like: Any, samples: list[list[float]]) -> Any:
    """A latency_vs_batch table from queries sent one at a time through Ray (mean per size as mean/p50/p99): the
    simulator's service times with the proxy and HTTP costs included."""
    from recserve.profiles import ProfileTable

    by_size: dict[int, list[float]] = {}
    for size, ms in samples:
        by_size.setdefault(int(size), []).append(ms)
    rows = [[s, float(np.mean(v)), float(np.mean(v)), float(np.mean(v))] for s, v in sorted(by_size.items())]
    return ProfileTable(like.model, like.server, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows,
                        "measured", {"via": "ray proxy, one query at a time"})


def cmd_ray_shards(args: argparse.Namespace) -> int:
    from recserve.deploy import ray_serve

    spec, model, sampler, history = _shard_model(args)
    layout = _shard_layout(args, len(spec.tables), model, history, getattr(args, "shard_plan", None))
    print(f"deploying {spec.name} ({len(spec.tables)} tables, {len(layout.shard_names())} shards) on Ray Serve ...",
          file=sys.stderr)
    log: dict[str, Any] = {"model": spec.name, "scale": args.scale, "shards": layout.shard_names(), "steps": []}
    try:
        log["qps_max"] = _shard_qps_max(args, model, layout, history[-1])
        ray_serve.start_ray(args.address)
        handle = ray_serve.deploy(layout, autoscale=not args.no_autoscale, qps_max=log["qps_max"],
                                  max_replicas=args.max_replicas)
        _check_shards(handle, model, layout, args.batch, sampler, log)
        if not args.ramp and not args.json:
            _serve_shards_until_stopped()
        _ramp(args, handle, model, sampler, log)
    finally:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(log, indent=1))
        ray_serve.shutdown()
    return 0


def _shard_model(args: argparse.Namespace) -> tuple[Any, Any, Any, list[Any]]:
    """The model (``--max-tables`` first tables), its index sampler and 50 queries of history for the layout."""
    from dataclasses import replace

    from recserve.workload.indices import index_sampler
    from recserve.zoo import build, sample_batch

    spec = get_model(args.model)
    if args.max_tables > len(spec.tables):
        raise RecserveError(f"--max-tables {args.max_tables}: {spec.name} has {len(spec.tables)} tables")
    if args.max_tables:
        spec = replace(spec, tables=spec.tables[: args.max_tables])
    model = build(spec, scale=args.scale, seed=args.seed).eval()
    sampler = index_sampler(f"locality:p={args.locality}")
    history = [sample_batch(model, args.batch, rng=i, sampler=sampler) for i in range(50)]
    return spec, model, sampler, history


def _shard_layout(args: argparse.Namespace, tables: int, model: Any, history: list[Any], plan: Any) -> Any:
    """The shard plan's layout (its first ``tables`` tables, the model's), else ``--shards-per-table`` even shards
    a table."""
    from dataclasses import replace

    from recserve.deploy.sharding import access_counts, even_layout, layout_from_plan

    if plan is not None:
        plan = replace(plan, tables=plan.tables[:tables])
        return layout_from_plan(plan, model, access_counts(model, history), seed=args.seed, scale=args.scale)
    return even_layout(model, access_counts(model, history), args.shards_per_table, seed=args.seed, scale=args.scale)


def _shard_qps_max(args: argparse.Namespace, model: Any, layout: Any, probe_batch: Any) -> dict[str, float]:
    """Each sparse shard's QPSmax, measured on its part of ``probe_batch`` before Ray starts (its start-up would
    skew the timing), times ``--headroom``: a replica carries at most that share of its profiled gather rate (Ray
    calls cost more than the gather)."""
    import torch

    from recserve.deploy.sharding import shard_weights
    from recserve.embedding.sharded import bucketize

    weights = shard_weights(model, layout)
    probes = {}
    for table in layout.tables:
        indices, offsets = probe_batch.table(table.table)
        parts = bucketize(torch.from_numpy(table.remap)[indices], offsets, torch.tensor(table.boundaries))
        for s, part in enumerate(parts):
            probes[f"{table.name}-s{s}"] = (part.indices.numpy(), part.offsets.numpy())
    measured = _measure_qps_max(weights, probes)
    qps_max = {k: v * args.headroom for k, v in measured.items()}
    print("QPSmax per shard (x headroom): " + ", ".join(f"{k}={v:.1f}" for k, v in qps_max.items()), file=sys.stderr)
    return qps_max


def _check_shards(handle: Any, model: Any, layout: Any, batch: int, sampler: Any, log: dict[str, Any]) -> None:
    """Into ``log``: the replicas Ray runs once they come up, against the plan's, and the shards' scores against
    the in-process model's."""
    from recserve.deploy import ray_serve

    log["planned_replicas"] = ray_serve.planned_replicas(layout)
    start = time.monotonic()
    log["replicas_after_deploy"] = ray_serve.wait_replicas(log["planned_replicas"])
    log["replicas_wait_s"] = time.monotonic() - start
    log["replicas_as_planned"] = log["replicas_after_deploy"] == log["planned_replicas"]
    log["scores_max_abs_diff"] = _shard_scores_diff(handle, model, batch, sampler)
    print(f"shards: replicas as planned {log['replicas_as_planned']} ({log['replicas_after_deploy']}); scores vs "
          f"the in-process model, max |diff| {log['scores_max_abs_diff']:.3g}", file=sys.stderr)


def _serve_shards_until_stopped() -> None:
    """Serve until Ctrl-C, printing the replica counts every 5 s."""
    from recserve.deploy import ray_serve

    print("serving; Ctrl-C to stop", file=sys.stderr)
    while True:
        time.sleep(5)
        print(json.dumps(ray_serve.replica_counts()), file=sys.stderr)


def _ramp(args: argparse.Namespace, handle: Any, model: Any, sampler: Any, log: dict[str, Any]) -> None:
    """Each ``--ramp`` rate for ``--step-s`` through the dense shard's handle, its latency and the replica counts
    after it appended to ``log["steps"]``."""
    from recserve.deploy import ray_serve
    from recserve.zoo import sample_batch

    queries = [sample_batch(model, args.batch, rng=1000 + i, sampler=sampler).as_arrays() for i in range(64)]
    rng = np.random.default_rng(args.seed)
    for rate in _parse_rates(args.ramp) if args.ramp else []:
        result = asyncio.run(_drive(handle, queries, rate, args.step_s, rng))
        result["replicas"] = ray_serve.replica_counts()
        log["steps"].append(result)
        print(f"rate {rate:g}/s: p95 {result['p95_ms']:.1f} ms, errors {result['errors']}, "
              f"replicas {result['replicas']}", file=sys.stderr)


def _shard_scores_diff(handle: Any, model: Any, batch: int, sampler: Any, queries: int = 4) -> float:
    """Max |score difference| of queries through the dense shard's handle against the monolithic in-process model."""
    import torch

    from recserve.zoo import sample_batch

    diffs = []
    for i in range(queries):
        query = sample_batch(model, batch, rng=500 + i, sampler=sampler)
        with torch.inference_mode():
            want = model(query).numpy()
        got = handle.infer.remote(query.as_arrays()).result()
        diffs.append(float(np.abs(np.asarray(got).reshape(want.shape) - want).max()))
    return max(diffs)


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("ray", help="run a plan on Ray Serve (Kairos pool with the Kairos request router, "
                                       "Hera co-location) or a model as autoscaled ElasticRec shards")
    p.add_argument("--plan", help="a pool, colocate, provision, shard or fleet plan JSON")
    p.add_argument("--dir", default="out/fleet-ray",
                   help="with a fleet plan: where endpoints.json, endpoints-direct.json and node*.yaml go")
    p.add_argument("--dry-run", action="store_true",
                   help="with a fleet plan: print each server type's `ray start --resources`, write the node configs "
                        "and exit (no Ray)")
    p.add_argument("--cluster-cpus", type=count, default=None,
                   help="with a fleet plan and --dry-run: the CPUs to scale the servers onto (default: this host's)")
    p.add_argument("--models", help="with --plan: only these models of the plan (comma-separated)")
    p.add_argument("--policy", default="kairos", help="with a pool plan: the request router's dispatch policy")
    p.add_argument("--cpus", type=positive, default=None,
                   help="with --plan: Ray CPUs per pool instance / per planned Hera worker (below 1 on small hosts; "
                        "default 1); with a fleet plan, per deployed worker (default: what the nodes hold)")
    p.add_argument("--rate", type=non_negative, default=0.0,
                   help="with a pool plan: Poisson queries/s through the proxy; with a provision plan and --json: per "
                        "deployment (default 4)")
    p.add_argument("--seconds", type=positive, default=None,
                   help="with --rate: length of the run (default 20); with a fleet plan: stop after this long "
                        "(default: until Ctrl-C)")
    p.add_argument("--mix", default="production", help="with --rate: query-size mix")
    p.add_argument("--http-port", type=port, default=8000, help="with --plan: port of Ray Serve's HTTP proxy")
    p.add_argument("--prior", action="store_true",
                   help="with --rate: seed the request router's latency predictor (and the simulator's) with this "
                        "host's in-process latency table for every type, as a pool file's `prior`")
    p.add_argument("--decisions", default=None, help="with a pool plan: JSON-lines log of the router's decisions")
    p.add_argument("--model", help="ElasticRec shards of this model (instead of --plan)")
    p.add_argument("--scale", type=positive, default=1e-3, help="table-row scale for this host")
    p.add_argument("--max-tables", type=non_negative_int, default=0,
                   help="keep only the first N tables (small hosts; 0: all)")
    p.add_argument("--shards-per-table", type=count, default=2,
                   help="with --model: shards per table (a hot shard + even cold shards)")
    p.add_argument("--locality", type=fraction, default=0.9, help="share of lookups on the hottest 10%% of rows")
    p.add_argument("--batch", type=count, default=64, help="items per query")
    p.add_argument("--address", default=None, help="join an existing Ray cluster (default: start a local one)")
    p.add_argument("--ramp", default="", help="comma-separated arrival rates to step through, e.g. 5,20,60")
    p.add_argument("--step-s", type=positive, default=20.0, help="seconds per ramp step")
    p.add_argument("--max-replicas", type=count, default=4,
                   help="most replicas the autoscaler gives one shard (at least its initial ones)")
    p.add_argument("--headroom", type=positive, default=0.5,
                   help="share of a shard's profiled gather QPSmax one replica may carry before another is added "
                        "(a Ray call costs more than the gather itself)")
    p.add_argument("--no-autoscale", action="store_true", help="keep each shard at its initial replicas")
    p.add_argument("--seed", type=seed, default=0, help="seed of the model's weights, queries and arrivals")
    p.add_argument("--json", default=None, help="write the run log here")
    p.set_defaults(func=cmd_ray)
