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


def test_provision_targets_start_at_the_hours_planned_count():
    """A provisioning plan becomes one target per (workload, type); each starts at the count planned for the hour,
    and its decision adds the reactive servers on top."""
    from recserve.deploy.ray_plans import provision_targets
    from recserve.planners.plan import ProvisionPlan, ProvisionStep

    steps = [ProvisionStep(0.0, {}, {"w": {"t1": 1, "t2": 1}}, 1.0, {}),
             ProvisionStep(12.0, {}, {"w": {"t1": 2}}, 1.0, {})]
    plan = ProvisionPlan(planner="hercules", steps=steps, inputs={
        "available": {"t1": 3}, "efficiency": {"w": {"t1": {"qps": 100.0}, "t2": {"qps": 50.0}}}})
    t1, t2 = provision_targets(plan)
    assert (t1.name, t1.steps, t1.max_replicas) == ("prov-w-t1", [[0.0, 1], [12.0, 2]], 3)
    assert (t2.name, t2.steps, t2.max_replicas) == ("prov-w-t2", [[0.0, 1], [12.0, 0]], 1)
    assert [t1.decision(6.0), t1.decision(13.0), t2.decision(13.0)] == [1, 2, 0]
    assert t1.decision(13.0, observed_qps=250.0) == 3 and t1.decision(13.0, observed_qps=950.0) == 3  # max 3
