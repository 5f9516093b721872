"""A fleet plan on a local two-node Ray cluster (issue #49): each planned server group lands on the node of its server
type and every model answers, through Ray's HTTP proxy and directly, as a local node server with the same config.
Slow: Ray start-up on a small host takes minutes."""

from __future__ import annotations

import numpy as np
import pytest

from recserve.planners.fleet import FleetGroup, FleetPlan
from tests.support.nodes import generous
from tests.support.ports import free_port

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

SCALE = 1e-4


def _plan() -> FleetPlan:
    """A Hera pair on type-a, a single model on type-b: one server per type, so one per Ray node."""
    return FleetPlan(groups=[
        FleetGroup("pair", "type-a", 1, 1, {"hercules-rmc1": 100.0, "kairos-rm2": 20.0},
                   {"hercules-rmc1": "dram", "kairos-rm2": "dram"}, "", "Hera pair",
                   {"hercules-rmc1": {"workers": 1, "threads": 1}, "kairos-rm2": {"workers": 1, "threads": 1}}),
        FleetGroup("single", "type-b", 1, 1, {"hercules-rmc1": 100.0}, {"hercules-rmc1": "dram"}, "", "Hercules",
                   {"hercules-rmc1": {"workers": 1, "threads": 1}}),
    ])


def _scores(url: str, model: str, queries: int = 2) -> list[np.ndarray]:
    from recserve.measure.loadgen import LoadSession
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import HttpTarget
    from recserve.specs import get_model

    pool = RequestPool(get_model(model), SCALE, (32,) * queries, seed=3)
    with LoadSession(HttpTarget(url, model, timeout_s=120.0), pool) as session:
        return [np.asarray(session.outputs(i)["scores"]) for i in range(queries)]


def test_fleet_plan_on_a_two_node_ray_cluster_answers_as_local_nodes(tmp_path):
    import ray

    from benchmarks.bench_ray_fleet import LocalRayCluster
    from recserve.deploy import ray_fleet, ray_serve
    from recserve.serving import NodeServer, config_from_dict

    plan = _plan()
    deployments, _ = ray_fleet.fleet_deployments(plan, cpus=2, scale=SCALE)
    for d in deployments:  # a busy host: the generous deadline, not the catalogue's
        d.config["models"] = [generous(m) for m in d.config["models"]]
    head, node = (ray_fleet.node_resources(deployments)[t] for t in ("type-a", "type-b"))
    with LocalRayCluster(head, node, cpus=1) as cluster:
        ray_serve.start_ray(cluster.address)
        try:
            nodes = ray.nodes()
            ray_fleet.check_cluster(deployments, nodes)
            share = ray_fleet.cpus_per_worker(deployments, nodes)
            assert share == pytest.approx(0.5)  # type-a's node: two workers on its one CPU
            proxy, where = ray_fleet.serve_fleet(deployments, share, http_port=free_port())
            placed = ray_fleet.placement(deployments, where, ray.nodes())
            assert all(p["as_planned"] for p in placed.values())  # each server on its type's node ...
            assert placed["fleet-0"]["node_id"] != placed["fleet-1"]["node_id"]  # ... so one per node
            for d in deployments:
                local = NodeServer(config_from_dict({**d.config, "host": "127.0.0.1", "http_port": 0,
                                                     "grpc_port": 0}, "test"))
                ports = local.start()
                try:
                    for m in d.models:
                        want = _scores(f"http://127.0.0.1:{ports.http}", d.served(m))
                        for url in (proxy[d.name], where[d.name]["url"]):  # through Ray's proxy, and direct
                            for got, expected in zip(_scores(url, d.served(m)), want, strict=True):
                                np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
                finally:
                    local.stop()
        finally:
            ray_serve.shutdown()
