"""A provisioning plan online: the planned count for the hour of day, raised when the load outgrows it."""

from __future__ import annotations

from types import SimpleNamespace

from recserve.policies.provision_autoscaler import RayScheduledPolicy, planned_count, scheduled_replicas

STEPS = [[0.0, 1], [8.0, 3], [16.5, 2]]


def test_planned_count_follows_the_daily_steps():
    assert [planned_count(STEPS, t) for t in (0.0, 7.9, 8.0, 16.4, 16.5, 23.9, 24.5)] == [1, 1, 3, 3, 2, 2, 1]
    assert planned_count([[6.0, 4], [18.0, 1]], 3.0) == 1  # before the day's first step the last one holds


def test_reactive_rule_adds_servers_above_the_plan_only():
    assert scheduled_replicas(STEPS, 9.0, observed_qps=200.0, qps_per_server=100.0) == 3  # plan covers it
    assert scheduled_replicas(STEPS, 9.0, observed_qps=450.0, qps_per_server=100.0) == 5  # ceil(450 / 100)
    assert scheduled_replicas(STEPS, 9.0, observed_qps=450.0, qps_per_server=100.0, max_replicas=4) == 4


def test_ray_policy_reads_published_qps():
    policy = RayScheduledPolicy(STEPS, qps_per_server=100.0)
    policy.hour_of_day = lambda: 20.0
    ctx = SimpleNamespace(aggregated_metrics={"qps": {"r1": 150.0, "r2": 160.0}}, current_num_replicas=2,
                          capacity_adjusted_min_replicas=0, capacity_adjusted_max_replicas=10, policy_state={})
    want, state = policy(ctx)
    assert want == 4 and state["last_qps"] == 310.0
    ctx.aggregated_metrics = {}
    assert policy(ctx)[0] == 2  # no load reported: the plan's count for 20:00
