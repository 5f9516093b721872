"""ElasticRec's per-shard autoscaling rules (§IV-D), as pure decisions.

Sparse (embedding) shards scale on throughput: enough replicas that none serves more than its
measured QPSmax.  The dense shard scales on latency: add a replica when its tail latency passes
65% of the SLA, remove one when it is well below.  The same functions drive the Ray Serve
custom autoscaling policies (``RaySparsePolicy`` / ``RayDensePolicy``), the Kubernetes HPA
targets we export, and the simulator (``sim/shards.py``).  The replica count itself is the one rule
``planners.replicas.replicas_for`` the ElasticRec planner uses.
"""

from __future__ import annotations

from typing import Any

from recserve.planners.replicas import DENSE_LATENCY_FRACTION, replicas_for

DENSE_SCALE_DOWN_FRACTION = 0.30


def sparse_replicas(observed_qps: float, qps_max: float, current: int, min_replicas: int = 1,
                    max_replicas: int = 64) -> int:
    """Replicas so that each sees at most ``qps_max``; never below ``min_replicas``."""
    if qps_max <= 0:
        raise ValueError("qps_max must be positive")
    want = replicas_for(observed_qps, qps_max) if observed_qps > 0 else min_replicas
    return int(min(max(want, min_replicas), max_replicas))


def dense_replicas(tail_latency_ms: float | None, sla_ms: float, current: int, min_replicas: int = 1,
                   max_replicas: int = 64) -> int:
    """One step up above 65% of the SLA, one step down below 30%; hold in between (hysteresis)."""
    if tail_latency_ms is None:
        return max(current, min_replicas)
    if tail_latency_ms > DENSE_LATENCY_FRACTION * sla_ms:
        return min(current + 1, max_replicas)
    if tail_latency_ms < DENSE_SCALE_DOWN_FRACTION * sla_ms and current > min_replicas:
        return current - 1
    return current


# ---------------------------------------------------------------- Ray Serve adapters


def metric_sum(ctx: Any, name: str) -> float | None:
    metrics = ctx.aggregated_metrics or {}
    values = metrics.get(name)
    if not values:
        return None
    return float(sum(values.values()))


def hold_while_starting(ctx: Any, want: int) -> int:
    """``want``, but not below Ray's target while no replica runs yet: Ray applies a decision taken with none
    running at once (without its up/downscale delays), so a policy reading the idle start-up would cut the
    planned initial count before a replica served anything."""
    target = getattr(ctx, "target_num_replicas", None)
    if target is not None and ctx.current_num_replicas == 0:
        return max(want, int(target))
    return want


def _metric_max(ctx: Any, name: str) -> float | None:
    metrics = ctx.aggregated_metrics or {}
    values = metrics.get(name)
    if not values:
        return None
    return float(max(values.values()))


class RaySparsePolicy:
    """Ray Serve custom autoscaling policy for an embedding shard (Ray instantiates it once with
    ``policy_kwargs``; replicas publish ``qps`` through ``record_autoscaling_stats``)."""

    def __init__(self, qps_max: float, max_replicas: int = 8) -> None:
        self.qps_max, self.max_replicas = qps_max, max_replicas

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        qps = metric_sum(ctx, "qps") or 0.0
        want = sparse_replicas(qps, self.qps_max, ctx.current_num_replicas, ctx.capacity_adjusted_min_replicas,
                               min(self.max_replicas, ctx.capacity_adjusted_max_replicas))
        return hold_while_starting(ctx, want), {**(ctx.policy_state or {}), "last_qps": qps}


class RayDensePolicy:
    """Ray Serve custom autoscaling policy for the dense shard (replicas publish ``p95_ms``)."""

    def __init__(self, sla_ms: float, max_replicas: int = 8) -> None:
        self.sla_ms, self.max_replicas = sla_ms, max_replicas

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        latency = _metric_max(ctx, "p95_ms")
        want = dense_replicas(latency, self.sla_ms, ctx.current_num_replicas, ctx.capacity_adjusted_min_replicas,
                              min(self.max_replicas, ctx.capacity_adjusted_max_replicas))
        return hold_while_starting(ctx, want), {**(ctx.policy_state or {}), "last_p95_ms": latency}
