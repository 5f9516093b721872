"""ElasticRec per-shard autoscaling over a load trace, with the live rules (``policies.shard_autoscaler``).

Each interval the sparse shards are sized by ``sparse_replicas`` on the offered load and their planned
QPSmax, and the dense shard takes one ``dense_replicas`` step on its tail latency, modelled as M/M/c
(exponential service at the dense shard's QPS per replica, Erlang C waiting): the functions the Ray
Serve autoscaling policies and the Kubernetes HPA targets come from, replayed without a cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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
