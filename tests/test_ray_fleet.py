"""Every plan kind on a local two-node Ray cluster (slow: Ray start-up on a small host takes minutes)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def test_every_plan_kind_on_a_two_node_ray_cluster(tmp_path):
    from benchmarks.bench_ray_fleet import run, summarize

    result = run(tmp_path, rate=6.0, seconds=30.0)
    print(json.dumps(summarize(result), indent=1))  # the numbers, with pytest -s
    pool = result["pool"]
    assert pool["scores_max_abs_diff"] <= 1e-5  # Ray replicas answer as the in-process model
    measured = pool["measured"]
    assert measured["errors"] == {} and measured["ok"] == measured["sent"] > 0
    assert pool["router_decisions"] == measured["sent"]  # every query placed by the Kairos request router
    assert pool["router_sizes_match_sent"]  # ... knowing each query's size (header through Ray's proxy)
    assert set(measured["served_by_type"]) <= set(pool["pool"])
    assert pool["simulated"]["completed"] == measured["sent"]  # the prediction covers the same trace
    colocate = result["colocate"]
    assert any(len(models) >= 2 for models in colocate["servers"])  # a Hera server hosting several models ...
    assert len(colocate["scores_max_abs_diff"]) == sum(len(m) for m in colocate["servers"])  # ... each one queried
    assert all(d <= 1e-5 for d in colocate["scores_max_abs_diff"].values())
    deployments = result["provision"]["provision"]["deployments"]
    assert deployments and all(d["replicas_running"] == d["policy_decision"] for d in deployments.values())
    answering = [d for d in deployments.values() if d["planned_now"]]
    assert answering and all(d["scores_max_abs_diff"] <= 1e-5 and d["load"]["ok"] == d["load"]["sent"] > 0
                             for d in answering)
    shards = result["shards"]
    assert shards["replicas_after_deploy"] == shards["planned_replicas"] and shards["scores_max_abs_diff"] <= 1e-5
