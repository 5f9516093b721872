"""The replica rule, in one place: whole replicas so that none carries more than its sustainable rate.

ElasticRec's planner (Alg. 1 REPLICAS), the live shard deployment (replicas from measured rates) and
the shard autoscaler (sparse shards on observed QPS) all size a service this way.
"""

from __future__ import annotations

import math

import numpy as np


def replicas_for(target_qps: float | np.ndarray, qps_per_replica: float | np.ndarray) -> np.ndarray | int:
    """``ceil(target / rate)``, at least one (the paper writes ``//``; a replica count is whole).
    Arrays in, array out; scalars in, an ``int`` out."""
    need = np.maximum(1, np.ceil(np.asarray(target_qps, dtype=float) / np.asarray(qps_per_replica, dtype=float)
                                 - 1e-9))
    return int(need) if need.ndim == 0 else need


DENSE_LATENCY_FRACTION = 0.65  # §IV-D: the dense shard's HPA target, as a share of the SLA


def tail_factor(percentile: float) -> float:
    """``-ln(1 - p)``: the p-th percentile of an exponential distribution in units of its mean."""
    if not 0 < percentile < 100:
        raise ValueError(f"percentile must be in (0, 100), got {percentile}")
    return -math.log(1.0 - percentile / 100.0)


def sla_bounded_qps(qps_per_replica: float | np.ndarray, budget_ms: float,
                    percentile: float = 95.0) -> np.ndarray | float:
    """ElasticRec's QPSmax (§IV-D): the highest rate one replica takes while its tail latency stays in budget.

    The paper stress-tests each shard for the load at which its tail latency rises sharply; we take the
    replica as M/M/1, whose sojourn time is exponential with rate ``mu - lambda``, so the p-th percentile
    stays within ``budget_ms`` up to ``lambda = mu - tail_factor(p) / budget``.  0 where even an idle
    replica misses the budget, or there is no budget (no replica count helps)."""
    mu = np.asarray(qps_per_replica, dtype=float)
    if budget_ms <= 0:
        bound = np.zeros_like(mu)
    else:
        bound = np.maximum(mu - tail_factor(percentile) * 1000.0 / budget_ms, 0.0)
    return float(bound) if bound.ndim == 0 else bound
