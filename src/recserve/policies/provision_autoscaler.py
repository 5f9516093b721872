"""Hercules provisioning as an online rule: the plan's server count for this time of day, raised reactively.

A provisioning plan gives, per step (hour of day), how many servers of each type serve each workload.  Online,
each (workload, server type) pool keeps at least the planned count for the current step and adds servers when
the observed load passes what the pool sustains (``ceil(load / the type's latency-bounded QPS)``, the same
replica rule as everywhere else): the schedule handles the diurnal swing, the reactive part the load the plan
did not foresee.  Kubernetes gets this as daily CronJobs setting an HPA's floor (``deploy/k8s_plans.py``); Ray
Serve as the custom autoscaling policy :class:`RayScheduledPolicy`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from recserve.planners.replicas import replicas_for
from recserve.policies.shard_autoscaler import hold_while_starting, metric_sum


def planned_count(steps: Sequence[Sequence[float]], t_hours: float, period_h: float = 24.0) -> int:
    """The count of the last step starting at or before ``t_hours`` (mod the period); before the first step of the
    day, the day's last step still holds."""
    if not steps:
        raise ValueError("a schedule needs at least one step")
    t = t_hours % period_h
    ordered = sorted((float(s), int(n)) for s, n in steps)
    current = ordered[-1][1]
    for start, n in ordered:
        if start <= t:
            current = n
    return current


def hour_of_day(utc_offset_h: float = 0.0) -> float:
    """Now, as the hour of the day a plan's steps are written in (UTC unless ``utc_offset_h``)."""
    return (time.time() / 3600.0 + utc_offset_h) % 24.0


def scheduled_replicas(steps: Sequence[Sequence[float]], t_hours: float, observed_qps: float, qps_per_server: float,
                       min_replicas: int = 0, max_replicas: int = 64) -> int:
    """max(planned count now, servers the observed load needs), within [min, max]."""
    want = planned_count(steps, t_hours)
    if observed_qps > 0 and qps_per_server > 0:
        want = max(want, replicas_for(observed_qps, qps_per_server))
    return int(min(max(want, min_replicas), max_replicas))


class RayScheduledPolicy:
    """Ray Serve custom autoscaling policy for one (workload, server type) deployment of a provisioning plan
    (replicas publish ``qps`` through ``record_autoscaling_stats``).  Time of day is UTC unless ``utc_offset_h``."""

    def __init__(self, steps: list[list[float]], qps_per_server: float, utc_offset_h: float = 0.0) -> None:
        self.steps, self.qps_per_server, self.utc_offset_h = steps, float(qps_per_server), float(utc_offset_h)

    def hour_of_day(self) -> float:
        return hour_of_day(self.utc_offset_h)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        qps = metric_sum(ctx, "qps") or 0.0
        now = self.hour_of_day()
        want = scheduled_replicas(self.steps, now, qps, self.qps_per_server, ctx.capacity_adjusted_min_replicas,
                                  ctx.capacity_adjusted_max_replicas)
        return hold_while_starting(ctx, want), {**(ctx.policy_state or {}), "hour": now, "last_qps": qps}
