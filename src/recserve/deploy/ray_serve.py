"""ElasticRec on Ray Serve: one deployment per embedding shard plus a dense-shard ingress.

The dense shard bucketizes each query, calls every embedding shard concurrently through its
``DeploymentHandle``, sums the partial pooled embeddings and runs the dense part.  Each
deployment autoscales with recserve's own rules (``policies.shard_autoscaler``) as Ray Serve
custom autoscaling policies: sparse shards on their QPSmax, the dense shard on p95 latency at
65% of the SLA.  Replicas publish those metrics through ``record_autoscaling_stats``.

Ray is imported lazily so the rest of recserve works without it.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from recserve.deploy.sharding import ShardLayout, shard_weights
from recserve.embedding.sharded import ShardedLookup
from recserve.errors import RecserveError
from recserve.serving.node.metrics import SlidingWindow
from recserve.zoo import QueryBatch, build

APP_NAME = "recserve-elasticrec"
STATS_WINDOW_S = 5.0


def _autoscaling_stats(window: SlidingWindow) -> dict[str, float]:
    """What the shard autoscaling policies read: completions/s and p95 latency over the window."""
    return {"qps": window.rate(), "p95_ms": window.tail(95.0)}


class EmbeddingShard:
    """Holds one contiguous, hotness-sorted slice of a table; returns partial pooled sums or rows."""

    def __init__(self, weight: np.ndarray) -> None:
        torch.set_num_threads(1)
        self.weight = torch.from_numpy(weight)
        self.window = SlidingWindow(STATS_WINDOW_S)

    async def pool(self, indices: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        out = F.embedding_bag(torch.from_numpy(indices), self.weight, torch.from_numpy(offsets), mode="sum").numpy()
        self.window.add((time.perf_counter() - start) * 1e3)
        return out

    async def gather(self, indices: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        out = F.embedding(torch.from_numpy(indices), self.weight).numpy()
        self.window.add((time.perf_counter() - start) * 1e3)
        return out

    def record_autoscaling_stats(self) -> dict[str, float]:
        return _autoscaling_stats(self.window)

    def replica_pid(self) -> int:
        return os.getpid()


class DenseShard:
    """The ingress: dense part of the model; embedding shards are called through their handles, the Ray
    transport of the one :class:`~recserve.embedding.sharded.ShardedLookup` path (gRPC services are the other)."""

    def __init__(self, layout: ShardLayout, handles: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        self.layout = layout
        self.model = build(layout.spec, scale=1e-12, seed=layout.seed, min_rows=1)
        self.handles = handles
        self.lookups = [ShardedLookup(t.name, t.boundaries[-1], self.model.tables[t.table].dim, t.boundaries, t.remap)
                        for t in layout.tables]
        self.bounds = [lookup.boundaries for lookup in self.lookups]
        self.sequence_lengths = self.model.sequence_lengths
        self.window = SlidingWindow(STATS_WINDOW_S)

    def _send(self, shard: str, indices: np.ndarray, offsets: np.ndarray | None) -> Any:
        handle = self.handles[shard]
        return handle.gather.remote(indices) if offsets is None else handle.pool.remote(indices, offsets)

    async def _table(self, t: int, batch: QueryBatch, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        sequence = t in self.sequence_lengths
        out = await self.lookups[t].start(indices, None if sequence else offsets, self._send).wait()
        return out.view(batch.size, self.sequence_lengths[t], -1) if sequence else out

    async def infer(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        start = time.perf_counter()
        batch = QueryBatch.from_arrays(arrays)
        batch.validate(self.model.spec.dense_in, tuple(int(b[-1]) for b in self.bounds), self.sequence_lengths)
        tables = batch.tables()
        pooled = await asyncio.gather(*(self._table(t, batch, i, o) for t, (i, o) in enumerate(tables)))
        with torch.no_grad():
            scores = self.model.dense(batch.dense, list(pooled)).numpy()
        self.window.add((time.perf_counter() - start) * 1e3)
        return scores

    def record_autoscaling_stats(self) -> dict[str, float]:
        return _autoscaling_stats(self.window)


def _require_ray() -> Any:
    try:
        import ray
        from ray import serve
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RecserveError("Ray Serve is not installed: pip install 'ray[serve]==2.60.*'") from exc
    return ray, serve


def start_ray(address: str | None = None, num_cpus: int | None = None,
              resources: dict[str, float] | None = None) -> None:
    """Start a local Ray instance (with ``resources``, custom ones) or join a cluster at ``address`` (no dashboard,
    no auth token)."""
    ray, _ = _require_ray()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address:
            kwargs["address"] = address
        else:
            if num_cpus:
                kwargs["num_cpus"] = num_cpus
            if resources:
                kwargs["resources"] = resources
        ray.init(**kwargs)


def build_app(layout: ShardLayout, qps_max: dict[str, float] | None = None, max_replicas: int = 4,
              num_cpus: float = 0.2, autoscale: bool = True) -> Any:
    """The Ray Serve application for ``layout`` (not yet running)."""
    _, serve = _require_ray()
    model = build(layout.spec, scale=layout.scale, seed=layout.seed)
    weights = shard_weights(model, layout)
    handles = {}
    for table in layout.tables:
        for s, replicas in enumerate(table.replicas):
            name = f"{table.name}-s{s}"
            options: dict[str, Any] = {"name": f"shard-{name}", "ray_actor_options": {"num_cpus": num_cpus}}
            if autoscale:
                options["autoscaling_config"] = {
                    "min_replicas": 1, "initial_replicas": replicas, "max_replicas": max(max_replicas, replicas),
                    "metrics_interval_s": 0.5, "look_back_period_s": 2.0, "upscale_delay_s": 1.0,
                    "downscale_delay_s": 30.0,
                    "policy": {"policy_function": "recserve.policies.shard_autoscaler:RaySparsePolicy",
                               "policy_kwargs": {"qps_max": (qps_max or {}).get(name, 50.0),
                                                 "max_replicas": max(max_replicas, replicas)}},
                }
            else:
                options["num_replicas"] = replicas
            handles[name] = serve.deployment(EmbeddingShard).options(**options).bind(weights[name])
    dense_options: dict[str, Any] = {"name": "dense", "ray_actor_options": {"num_cpus": num_cpus}}
    if autoscale:
        dense_options["autoscaling_config"] = {
            "min_replicas": 1, "initial_replicas": layout.dense_replicas,
            "max_replicas": max(max_replicas, layout.dense_replicas), "metrics_interval_s": 0.5,
            "look_back_period_s": 2.0, "upscale_delay_s": 1.0, "downscale_delay_s": 30.0,
            "policy": {"policy_function": "recserve.policies.shard_autoscaler:RayDensePolicy",
                       "policy_kwargs": {"sla_ms": layout.sla_ms, "max_replicas": max_replicas}},
        }
    else:
        dense_options["num_replicas"] = layout.dense_replicas
    return serve.deployment(DenseShard).options(**dense_options).bind(layout, handles)


def deploy(layout: ShardLayout, address: str | None = None, **kwargs: Any) -> Any:
    """Run the application and return the dense shard's DeploymentHandle (no HTTP proxy: handles only, so no
    port of the host is taken)."""
    start_ray(address)
    _, serve = _require_ray()
    serve.start(proxy_location="Disabled")
    return serve.run(build_app(layout, **kwargs), name=APP_NAME, route_prefix=None)


def planned_replicas(layout: ShardLayout) -> dict[str, int]:
    """Replicas per deployment of :func:`build_app` as the layout plans them (what Ray starts with)."""
    shards = {f"shard-{t.name}-s{s}": int(n) for t in layout.tables for s, n in enumerate(t.replicas)}
    return {**shards, "dense": int(layout.dense_replicas)}


def replica_counts(app_name: str = APP_NAME) -> dict[str, int]:
    """Running replicas per deployment of an application (from ``serve.status``; the ElasticRec one by default)."""
    _, serve = _require_ray()
    app = serve.status().applications.get(app_name)
    if app is None:
        return {}
    return {name: sum(n for state, n in d.replica_states.items() if str(state).endswith("RUNNING"))
            for name, d in app.deployments.items()}


def wait_replicas(expected: dict[str, int], app_name: str = APP_NAME, timeout_s: float = 120.0) -> dict[str, int]:
    """Poll the running replicas until they equal ``expected`` or ``timeout_s`` passes; the last counts read.
    ``serve.run`` returns once an autoscaled application is within its bounds, before all initial replicas run."""
    deadline = time.monotonic() + timeout_s
    counts = replica_counts(app_name)
    while counts != expected and time.monotonic() < deadline:
        time.sleep(0.5)
        counts = replica_counts(app_name)
    return counts


def shutdown() -> None:
    """Stop Serve and disconnect (a cluster joined by address keeps running; a local one stops)."""
    ray, serve = _require_ray()
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
