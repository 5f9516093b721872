"""ElasticRec sharded serving on this host: embedding-shard replica processes + a dense-shard node server.

``start_sharded(layout)`` starts, on loopback, per embedding shard its planned number of replica processes
(:mod:`recserve.serving.shards.service`, each a gRPC server with a private copy of its rows) and a
:class:`~recserve.serving.NodeServer` whose model is the dense shard (``table_backend: elasticrec``, built by
:func:`recserve.serving.shards.remote_table.build_dense_shard_model`).  This module is the *deployment* (layouts, plans,
replica counts, processes); the query path lives in ``serving/shards/remote_table.py``, so the node server never
reads plans.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recserve.deploy.sharding import ShardLayout, access_counts, even_layout, layout_from_plan, shard_weights
from recserve.errors import RecserveError, SpecError
from recserve.hostinfo import how_it_ended
from recserve.planners.plan import Plan, ShardPlan
from recserve.planners.replicas import replicas_for
from recserve.serving.shards.remote_table import BACKEND, DEFAULT_TIMEOUT_S
from recserve.serving.shards.service import (
    ReplicaArgs,
    replica_main,
)
from recserve.specs import ModelSpec, get_model
from recserve.zoo import RecModel, build, sample_batch

RESTART_FIRST_S, RESTART_MOST_S = 1.0, 30.0  # a replica whose restart failed is tried again after this (doubling)


def dense_options(layout: ShardLayout, rows: tuple[int, ...], endpoints: dict[str, list[str]],
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    tables = [{"name": t.name, "rows": int(rows[t.table]), "boundaries": [int(b) for b in t.boundaries],
               "remap": np.asarray(t.remap, dtype=np.int64)} for t in layout.tables]
    return {"tables": tables, "endpoints": endpoints, "timeout_s": timeout_s}


# ---------------------------------------------------------------- layouts


def plan_from_json(path: str | Path) -> ShardPlan:
    """A :class:`ShardPlan` from ``recserve plan shard --json`` output (the one plan reader, ``Plan.load``)."""
    try:
        plan = Plan.load(path)
    except RecserveError as exc:
        raise RecserveError(f"not a `recserve plan shard --json` file: {exc}") from exc
    if not isinstance(plan, ShardPlan):
        raise RecserveError(f"{path}: not a `recserve plan shard --json` file (a {plan.kind!r} plan)")
    return plan


def warmup_counts(model: RecModel, queries: int = 50, batch: int = 32, locality: float = 0.9,
                  seed: int = 10_000) -> list[np.ndarray]:
    """Access counts over a warm-up sample from the locality-P index model (the hotness history)."""
    from recserve.workload.indices import index_sampler

    sampler = index_sampler(f"locality:p={locality}")
    return access_counts(model, [sample_batch(model, batch, rng=seed + i, sampler=sampler) for i in range(queries)])


def make_layout(spec: ModelSpec, scale: float, seed: int = 0, plan: ShardPlan | None = None,
                shards_per_table: int = 2, replicas: list[int] | None = None, dense_replicas: int | None = None,
                warmup_queries: int = 50, batch: int = 32, locality: float = 0.9,
                model: RecModel | None = None) -> ShardLayout:
    """Layout of the live scaled model: from a plan, or a hot shard + even cold shards.

    ``replicas`` (per shard position, e.g. ``[2, 1]``) overrides the replica counts of every table."""
    model = model if model is not None else build(spec, scale=scale, seed=seed)
    counts = warmup_counts(model, warmup_queries, batch, locality)
    if plan is not None:
        if len(plan.tables) < len(spec.tables):
            raise RecserveError(f"plan has {len(plan.tables)} tables, model {spec.name} has {len(spec.tables)}")
        plan = replace(plan, tables=plan.tables[: len(spec.tables)])
        layout = layout_from_plan(plan, model, counts, seed=seed, scale=scale)
    else:
        layout = even_layout(model, counts, shards_per_table, seed=seed, scale=scale)
    if replicas:
        most = max(len(t.replicas) for t in layout.tables)
        if len(replicas) > most:
            raise RecserveError(f"--replicas gives {len(replicas)} counts, but the tables have at most {most} shards "
                                f"(one count per shard position, the last repeated)")
        for t in layout.tables:
            t.replicas = [int(replicas[min(s, len(replicas) - 1)]) for s in range(len(t.replicas))]
    if dense_replicas:
        layout.dense_replicas = int(dense_replicas)
    return layout


# ---------------------------------------------------------------- the local deployment


def _log(progress: bool, text: str) -> None:
    if progress:
        print(f"[shards] {text}", file=sys.stderr, flush=True)


@dataclass
class ReplicaProcess:
    shard: str
    replica: int
    process: Any
    conn: Any
    args: ReplicaArgs
    pid: int = 0
    port: int = 0
    next_try: float = 0.0  # a restart that failed is tried again from then (monotonic s)
    backoff_s: float = RESTART_FIRST_S

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class ShardedDeployment:
    """A running local ElasticRec deployment; ``ports`` is the dense shard's HTTP/gRPC front end."""

    layout: ShardLayout
    model_name: str
    replicas: list[ReplicaProcess]
    server: Any = None
    ports: Any = None
    weights_dir: Path | None = None  # the shards' rows, which a replica that died is restarted from
    _stopped: bool = field(default=False, repr=False)

    @property
    def endpoints(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for r in self.replicas:
            out.setdefault(r.shard, []).append(r.address)
        return out

    def replica_pids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in self.replicas:
            out.setdefault(r.shard, []).append(r.pid)
        return out

    def dense_worker_pids(self) -> list[int]:
        if self.server is None or self.server.core is None:
            return []
        return [w.pid for rt in self.server.core.models.values() for p in rt.pools.values() for w in p.workers
                if w.pid]

    def pids(self) -> list[int]:
        """Every process of the deployment except this one (the front end lives in the caller)."""
        return [r.pid for r in self.replicas if r.pid] + self.dense_worker_pids()

    def kill_replica(self, shard: str, replica: int = 0) -> int:
        """SIGKILL one replica (fault injection); returns its pid."""
        for r in self.replicas:
            if r.shard == shard and r.replica == replica:
                r.process.kill()
                r.process.join(5)
                return r.pid
        raise KeyError(f"{shard} replica {replica}")

    def restart_dead(self, progress: bool = True) -> int:
        """Restart every replica whose process died, on its own port (the dense workers' channels reconnect to
        it); each is logged.  A restart that fails is tried again after a back-off (1 s doubling to 30 s).
        Returns how many replicas are down after this call."""
        down = 0
        for r in self.replicas:
            if self._stopped or r.process.is_alive():
                continue
            now = time.monotonic()
            if now < r.next_try:
                down += 1
                continue
            _log(progress, f"embedding shard {r.shard} replica {r.replica} (pid {r.pid}) "
                           f"{how_it_ended(r.process.exitcode)}; restarting it on port {r.port}")
            try:
                _relaunch(r)
            except RecserveError as exc:
                r.next_try, r.backoff_s = now + r.backoff_s, min(RESTART_MOST_S, 2 * r.backoff_s)
                _log(progress, f"embedding shard {r.shard} replica {r.replica}: restart failed ({exc}); trying "
                               f"again in {r.next_try - now:.0f} s")
                down += 1
            else:
                r.backoff_s = RESTART_FIRST_S
        return down

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.server is not None:
            self.server.stop(drain=False)
        _stop_replicas(self.replicas)
        if self.weights_dir is not None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)

    def __enter__(self) -> ShardedDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_replicas(replicas: list[ReplicaProcess]) -> None:
    for r in replicas:
        try:
            r.conn.send(None)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    for r in replicas:
        r.process.join(max(0.1, deadline - time.monotonic()))
        if r.process.is_alive():
            r.process.kill()
            r.process.join(2)
        r.conn.close()


def _launch(args: ReplicaArgs) -> tuple[Any, Any]:
    """(process, pipe) of a replica started with ``args``."""
    from recserve.serving.node.forkserver import mp_context

    ctx = mp_context()
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=replica_main, args=(child, args), daemon=True,
                       name=f"recserve-shard-{args.shard}-{args.replica}")
    proc.start()
    child.close()
    return proc, parent


def _await_ready(r: ReplicaProcess) -> None:
    """Wait for a started replica's pid and port."""
    if not r.conn.poll(120):
        raise RecserveError(f"embedding shard {r.shard} replica {r.replica} did not start in time")
    try:
        msg = r.conn.recv()
    except EOFError:
        raise RecserveError(f"embedding shard {r.shard} replica {r.replica} exited while starting") from None
    if msg[0] != "ready":
        raise RecserveError(f"embedding shard {r.shard} replica {r.replica}: {msg[1]}")
    r.pid, r.port = int(msg[1]), int(msg[2])


def _relaunch(r: ReplicaProcess) -> None:
    """A dead replica started again on its port."""
    r.conn.close()
    r.process.join(0)
    r.args = replace(r.args, port=r.port)
    r.process, r.conn = _launch(r.args)
    try:
        _await_ready(r)
    except RecserveError:
        r.process.kill()
        r.process.join(2)
        raise


def _start_replicas(layout: ShardLayout, weights: dict[str, np.ndarray], workdir: Path, threads: int,
                    progress: bool) -> list[ReplicaProcess]:
    replicas: list[ReplicaProcess] = []
    try:
        for table in layout.tables:
            for s, count in enumerate(table.replicas):
                name = f"{table.name}-s{s}"
                path = workdir / f"{name}.npy"
                np.save(path, weights[name])
                for k in range(int(count)):
                    args = ReplicaArgs(name, k, str(path), threads=threads)
                    replicas.append(ReplicaProcess(name, k, *_launch(args), args))
        for r in replicas:
            _await_ready(r)
        _log(progress, f"{len(replicas)} embedding-shard replicas up: " + ", ".join(
            f"{r.shard}#{r.replica}@{r.port}" for r in replicas))
    except BaseException:
        _stop_replicas(replicas)
        raise
    return replicas


def start_sharded(layout: ShardLayout, *, model_name: str | None = None, dense_replicas: int | None = None,
                  host: str = "127.0.0.1", http_port: int = 0, grpc_port: int = 0, threads: int = 1,
                  timeout_s: float = DEFAULT_TIMEOUT_S, queue_limit: int = 256, max_batch_size: int = 1024,
                  progress: bool = True, model: RecModel | None = None,
                  deadline_ms: float | None = None) -> ShardedDeployment:
    """Start every embedding-shard replica and the dense-shard node server on loopback.

    ``deadline_ms``: the dense node's deadline for queries that set none (None: twice the model's SLA).

    ``model`` (the full scaled model built from ``layout.spec``/``scale``/``seed``) is only read to
    cut the shards; it is built here if not given.  ``layout.spec.name`` must resolve with
    ``get_model`` (a catalogue name, or ``<name>@tables=K``) because dense workers rebuild it by name.
    """
    from recserve.serving import ModelConfig, NodeConfig, NodeServer

    spec = layout.spec
    try:
        get_model(spec.name)
    except SpecError as exc:
        raise RecserveError(f"layout model {spec.name!r} must be a catalogue name or <name>@tables=K: {exc}") from exc
    model = model if model is not None else build(spec, scale=layout.scale, seed=layout.seed)
    rows = tuple(model.rows)
    _log(progress, f"cutting {len(layout.shard_names())} shards of {spec.name} (scale {layout.scale:g})")
    weights = shard_weights(model, layout)
    del model
    workdir = Path(tempfile.mkdtemp(prefix="recserve-shards-"))  # kept while the replicas may be restarted
    try:
        replicas = _start_replicas(layout, weights, workdir, threads, progress)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        del weights
    deployment = ShardedDeployment(layout, model_name or spec.name, replicas, weights_dir=workdir)
    try:
        cfg = ModelConfig(model=spec.name, name=deployment.model_name, scale=layout.scale,
                          workers=int(dense_replicas or layout.dense_replicas), threads=threads, share_tables=False,
                          seed=layout.seed, table_backend=BACKEND, queue_limit=queue_limit,
                          max_batch_size=max_batch_size, deadline_ms=deadline_ms,
                          options=dense_options(layout, rows, deployment.endpoints, timeout_s))
        deployment.server = NodeServer(NodeConfig(models=[cfg], host=host, http_port=http_port,
                                                  grpc_port=grpc_port, drain_timeout_s=5.0))
        deployment.ports = deployment.server.start()
    except BaseException:
        deployment.stop()
        raise
    _log(progress, f"dense shard {deployment.model_name!r}: {cfg.workers} workers, http {deployment.ports.http}, "
                   f"grpc {deployment.ports.grpc}")
    return deployment


def process_memory_mb(pids: list[int]) -> dict[str, float]:
    """Summed RSS and PSS (MB) of ``pids`` from /proc (PSS splits shared pages among their users)."""
    from recserve.serving.node.handle import memory_of

    total = {"rss_mb": 0.0, "pss_mb": 0.0, "processes": 0}
    for pid in pids:
        m = memory_of(pid)
        if m["rss_mb"] > 0:
            total["rss_mb"] += m["rss_mb"]
            total["pss_mb"] += m["pss_mb"]
            total["processes"] += 1
    return total


def service_rates(model: RecModel, layout: ShardLayout, batch: int = 32, locality: float = 0.9,
                  queries: int = 8, repeats: int = 5) -> dict[str, float]:
    """Queries/s one single-threaded worker sustains for each piece, timed in this process (median over
    ``repeats`` x ``queries`` calls): every embedding shard (its part of locality-P queries), the dense
    part, the whole model.

    ElasticRec's profiled QPS(x) (Fig. 9) measured on the live shards instead of fitted; protocol
    costs (one gRPC hop per shard call) are not included."""
    import torch.nn.functional as F  # noqa: N812

    from recserve.embedding.sharded import bucketize
    from recserve.workload.indices import index_sampler

    sampler = index_sampler(f"locality:p={locality}")
    qs = [sample_batch(model, batch, rng=90_000 + i, sampler=sampler) for i in range(queries)]

    def per_query_s(fn: Any) -> float:
        """Median of per-query times: robust to preemption on a busy host."""
        times = []
        for _ in range(repeats):
            for i in range(queries):
                start = time.perf_counter()
                fn(i)
                times.append(time.perf_counter() - start)
        return max(float(np.median(times)), 1e-9)

    rates: dict[str, float] = {}
    with torch.inference_mode():
        rates["model"] = 1.0 / per_query_s(lambda i: model(qs[i]))
        pooled = [model.sparse(q) for q in qs]
        rates["dense"] = 1.0 / per_query_s(lambda i: model.dense(qs[i].dense, pooled[i]))
        weights = shard_weights(model, layout)
        for t in layout.tables:
            remap = torch.from_numpy(t.remap)
            parts = [bucketize(remap[q.table(t.table)[0]], q.table(t.table)[1], t.boundaries) for q in qs]
            for s in range(len(t.replicas)):
                w = torch.from_numpy(weights[f"{t.name}-s{s}"])
                rates[f"{t.name}-s{s}"] = 1.0 / per_query_s(
                    lambda i, s=s, w=w, parts=parts: F.embedding_bag(parts[i][s].indices, w, parts[i][s].offsets,
                                                                     mode="sum"))
    return rates


def plan_replicas(layout: ShardLayout, rates: dict[str, float], target_qps: float) -> tuple[int, int]:
    """ElasticRec's rule (Alg. 1 REPLICAS, HPA on QPSmax): each shard gets ceil(target / its rate)
    replicas, set on ``layout`` in place.  Returns (dense replicas, model-wise replicas) for the target."""
    def need(rate: float) -> int:
        return replicas_for(target_qps, rate)

    for t in layout.tables:
        t.replicas = [need(rates[f"{t.name}-s{s}"]) for s in range(len(t.replicas))]
    layout.dense_replicas = need(rates["dense"])
    return layout.dense_replicas, need(rates["model"])
