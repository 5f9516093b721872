"""ElasticRec deployments without a cluster: per-shard autoscaling over a load trace, and the tail latency
of a planned deployment.

:func:`simulate_shard_scaling`: each interval the sparse shards are sized by ``sparse_replicas`` on the
offered load and their planned QPSmax, and the dense shard takes one ``dense_replicas`` step on its tail
latency, modelled as M/M/c (exponential service at the dense shard's QPS per replica, Erlang C waiting):
the functions the Ray Serve autoscaling policies and the Kubernetes HPA targets come from.

:func:`simulate_shard_latency`: queries replayed through every replica queue of a plan (fork to every
embedding shard, join, one RPC hop, the dense shard), so the planner's per-replica M/M/1 budget is checked
against what the whole fork-join does, the slowest of many shards included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.perfmodel.queueing import erlang_c
from recserve.planners.plan import ShardPlan
from recserve.policies.shard_autoscaler import dense_replicas, sparse_replicas


def dense_tail_ms(qps: float, replicas: int, qps_per_replica: float, percentile: float = 95.0) -> float:
    """Sojourn-time percentile of M/M/c: service mean + the waiting-time percentile (inf when overloaded)."""
    mu = qps_per_replica / 1000.0  # per ms
    lam = qps / 1000.0
    service = 1.0 / mu
    if lam <= 0:
        return service
    if lam >= replicas * mu:
        return math.inf
    waits = erlang_c(replicas, lam / mu)
    tail = 1.0 - percentile / 100.0
    wait = 0.0 if waits <= tail else math.log(waits / tail) / (replicas * mu - lam)
    return service + wait


def simulate_shard_scaling(plan: ShardPlan, load_qps: Sequence[float], dense_qps: float, sla_ms: float,
                           percentile: float = 95.0, max_replicas: int = 64) -> list[dict[str, Any]]:
    """One row per interval: offered load, dense tail before scaling, replicas per shard after the rules."""
    sparse = {f"{t.table}-s{s}": (t.replicas[s], t.qps_max[s] if t.qps_max else None)
              for t in plan.tables for s in range(t.num_shards)}
    current = {name: r for name, (r, _) in sparse.items()}
    dense = plan.dense_replicas
    rows = []
    for load in load_qps:
        tail = dense_tail_ms(load, dense, dense_qps, percentile)
        dense = dense_replicas(tail, sla_ms, dense, max_replicas=max_replicas)
        for name, (_, qps_max) in sparse.items():
            if qps_max:
                current[name] = sparse_replicas(load, qps_max, current[name], max_replicas=max_replicas)
        rows.append({"load_qps": float(load), "dense_tail_ms": tail, "dense_replicas": dense, "sparse": dict(current)})
    return rows


# ---------------------------------------------------------------- tail latency of a planned deployment


def fifo_departures(arrivals: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Departure times of a FIFO single-server queue (``arrivals`` sorted): ``d_i = max(a_i, d_{i-1}) + s_i``,
    in closed form ``d_i = S_i + max_{k<=i}(a_k - S_{k-1})`` with ``S`` the running sum of service times."""
    total = np.cumsum(service)
    return total + np.maximum.accumulate(arrivals - (total - service))


def replica_departures(arrivals: np.ndarray, mean_ms: float, replicas: int, rng: np.random.Generator) -> np.ndarray:
    """Departures from ``replicas`` FIFO replicas behind a random load balancer, exponential service of
    ``mean_ms`` (the planner's M/M/1 assumption); ``arrivals`` in any order, answers in the same order."""
    pick = rng.integers(0, replicas, arrivals.size)
    service = rng.exponential(mean_ms, arrivals.size)
    out = np.empty_like(arrivals)
    for r in range(replicas):
        idx = np.flatnonzero(pick == r)
        idx = idx[np.argsort(arrivals[idx], kind="stable")]
        out[idx] = fifo_departures(arrivals[idx], service[idx])
    return out


@dataclass
class ShardLatency:
    """Simulated tail latency of one plan: ElasticRec's fork-join and the model-wise baseline."""

    qps: float
    queries: int
    percentile: float
    sharded_ms: float
    modelwise_ms: float
    slowest_shard: str
    sharded_mean_ms: float = float("nan")    # mean latency of each path (ElasticRec §VI-B reports the added mean)
    modelwise_mean_ms: float = float("nan")

    @property
    def added_mean_ms(self) -> float:
        """Mean latency the sharded path adds over the model-wise one (fork-join, RPC hop, split replicas)."""
        return self.sharded_mean_ms - self.modelwise_mean_ms

    def within(self, sla_ms: float) -> bool:
        return self.sharded_ms <= sla_ms and self.modelwise_ms <= sla_ms


def simulate_shard_latency(plan: ShardPlan, gather_ms: dict[str, float], dense_ms: float, modelwise_ms: float,
                           rpc_ms: float = 2.0, percentile: float = 95.0, queries: int = 20_000,
                           seed: int = 0) -> ShardLatency:
    """Poisson queries at the plan's target through its replicas: every query fans out to every embedding
    shard (``gather_ms``: mean service per shard, keyed ``table-sK``), waits for the slowest, crosses one
    ``rpc_ms`` hop and runs on a dense replica.  The model-wise deployment runs each query whole on one
    replica of mean ``modelwise_ms``.  The first tenth of queries is warm-up and not counted."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1000.0 / plan.target_qps, queries))
    joined = arrivals.copy()
    worst: dict[str, float] = {}
    for t in plan.tables:
        for k, replicas in enumerate(t.replicas):
            name = f"{t.table}-s{k}"
            done = replica_departures(arrivals, gather_ms[name], replicas, rng)
            worst[name] = float(np.percentile(done - arrivals, percentile))
            np.maximum(joined, done, out=joined)
    answered = replica_departures(joined + rpc_ms, dense_ms, plan.dense_replicas, rng)
    whole = replica_departures(arrivals, modelwise_ms, plan.modelwise_replicas, rng)
    keep = slice(queries // 10, None)
    sharded, modelwise = (answered - arrivals)[keep], (whole - arrivals)[keep]
    return ShardLatency(plan.target_qps, queries, percentile, float(np.percentile(sharded, percentile)),
                        float(np.percentile(modelwise, percentile)), max(worst, key=worst.get) if worst else "",
                        float(sharded.mean()), float(modelwise.mean()))


def simulate_plan_latency(plan: ShardPlan, spec: Any, cost: Any, rpc_ms: float = 2.0, queries: int | None = None,
                          seed: int = 0) -> ShardLatency:
    """:func:`simulate_shard_latency` with service times from the plan's ``ShardCostModel`` (what it was sized
    on) and the SLA percentile of ``spec``; by default a minute of load (at least 20,000 queries)."""
    queries = queries or int(max(20_000, 60 * plan.target_qps))
    gather_ms = {f"{t.table}-s{k}": 1000.0 / float(cost.gather_qps(ns))
                 for t in plan.tables for k, ns in enumerate(t.rows_gathered)}
    total_gathers = sum(plan.batch * tab.pooling for tab in spec.tables)
    return simulate_shard_latency(plan, gather_ms, 1000.0 / cost.dense_qps, 1000.0 / cost.model_qps(total_gathers),
                                  rpc_ms, spec.sla.percentile, queries, seed)
