"""The replica rule has one home, and the shard-scaling simulator replays the live autoscaler's rules."""

from __future__ import annotations

import math

import numpy as np

from recserve.planners.plan import ShardPlan, TableShards
from recserve.planners.replicas import replicas_for
from recserve.policies.shard_autoscaler import DENSE_LATENCY_FRACTION, sparse_replicas
from recserve.sim.shards import dense_tail_ms, simulate_shard_scaling


def test_replica_rule_is_ceil_of_target_over_rate_at_least_one():
    assert replicas_for(1000.0, 250.0) == 4 and replicas_for(1001.0, 250.0) == 5 and replicas_for(0.0, 10.0) == 1
    assert replicas_for(1000.0, np.array([100.0, 300.0, 5000.0])).tolist() == [10, 4, 1]
    assert sparse_replicas(1001.0, 250.0, current=1) == replicas_for(1001.0, 250.0)


def test_dense_tail_grows_with_load_and_is_infinite_past_capacity():
    low, high = dense_tail_ms(10.0, 2, 100.0), dense_tail_ms(180.0, 2, 100.0)
    assert low >= 10.0 and high > low and math.isinf(dense_tail_ms(200.0, 2, 100.0))


def test_simulated_scaling_follows_the_autoscaler_rules():
    plan = ShardPlan(model="m", target_qps=100.0, dense_replicas=1,
                     tables=[TableShards("t0", [0, 10, 100], [1, 1], [20.0, 2.0], 1.0, qps_max=[150.0, 1000.0])])
    rows = simulate_shard_scaling(plan, [50.0, 400.0, 400.0, 400.0, 400.0, 20.0], dense_qps=200.0, sla_ms=50.0)
    assert [r["sparse"]["t0-s0"] for r in rows] == [1, 3, 3, 3, 3, 1]
    assert [r["sparse"]["t0-s1"] for r in rows] == [1, 1, 1, 1, 1, 1]
    dense = [r["dense_replicas"] for r in rows]
    assert dense[1] == 2 and max(dense) >= 3  # one step per interval while the tail is above 65% of the SLA
    settled = rows[4]
    assert settled["dense_tail_ms"] <= DENSE_LATENCY_FRACTION * 50.0 or dense[4] > dense[3]


def test_ray_shard_policies_keep_the_planned_count_until_a_replica_runs():
    """Ray applies a decision taken with no replica running at once: an idle start-up must not cut the plan."""
    from types import SimpleNamespace

    from recserve.policies.shard_autoscaler import RayDensePolicy, RaySparsePolicy

    def ctx(running: int, target: int, metrics: dict) -> SimpleNamespace:
        return SimpleNamespace(aggregated_metrics=metrics, current_num_replicas=running, target_num_replicas=target,
                               capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=8, policy_state={})

    dense, sparse = RayDensePolicy(sla_ms=100.0), RaySparsePolicy(qps_max=50.0)
    assert dense(ctx(0, 2, {}))[0] == 2 and sparse(ctx(0, 3, {}))[0] == 3  # starting: the planned initial count
    idle = {"p95_ms": {"r1": 1.0, "r2": 1.0}, "qps": {"r1": 0.0, "r2": 0.0}}
    assert dense(ctx(2, 2, idle))[0] == 1 and sparse(ctx(2, 2, idle))[0] == 1  # running and idle: scale down
    assert sparse(ctx(0, 1, {"qps": {"r1": 120.0}}))[0] == 3  # more than planned is still allowed
