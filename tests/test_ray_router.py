"""The Kairos request router for Ray Serve drives the one Dispatcher (no Ray cluster: fake replicas)."""

from __future__ import annotations

import asyncio
import json
import pickle
from types import SimpleNamespace

import pytest

from recserve.deploy.ray_plans import KairosRouter, node_start_flags, query_size, type_resource
from recserve.planners.plan import PoolChoice
from recserve.wire import BATCH_SIZE_HEADER

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


class ProxyRequest:  # stands in for Ray's StreamingHTTPRequest, which the proxy sends pickled
    def __init__(self, scope: dict) -> None:
        self._asgi_scope = scope


def pending(request_id: str, size: int, via_header: bool = False) -> SimpleNamespace:
    meta = SimpleNamespace(internal_request_id=request_id, is_http_request=via_header)  # a property in Ray
    if via_header:
        scope = {"headers": [(b"content-type", b"x"), (BATCH_SIZE_HEADER.lower().encode(), str(size).encode())]}
        return SimpleNamespace(args=[pickle.dumps(ProxyRequest(scope))], kwargs={}, metadata=meta)
    return SimpleNamespace(args=[], kwargs={"size": size}, metadata=meta)


def make_router(tmp_path) -> tuple[KairosRouter, list[SimpleNamespace]]:
    router = KairosRouter.__new__(KairosRouter)  # Ray's constructor needs a running Serve; the state is ours
    # ribbon: FCFS to the best idle instance (Kairos, untrained, would hold q1 for the busy first instance)
    router.initialize_state(types={type_resource("fast"): "fast", type_resource("slow"): "slow"}, qos_ms=50.0,
                            policy="ribbon", default_size=10, log_path=str(tmp_path / "decisions.jsonl"))
    router._node_types = lambda: {"node-a": "fast", "node-b": "slow"}
    replicas = [SimpleNamespace(replica_id=f"r{i}", node_id=node) for i, node in enumerate(["node-b", "node-a"])]
    return router, replicas


def test_size_from_the_handle_keyword_or_the_proxy_header():
    assert query_size(pending("a", 70), 5) == 70 and query_size(pending("b", 30, via_header=True), 5) == 30
    assert query_size(SimpleNamespace(args=[], kwargs={}, metadata=None), 5) == 5
    handle_bytes = SimpleNamespace(args=[pickle.dumps(ProxyRequest({}))], kwargs={},
                                   metadata=SimpleNamespace(is_http_request=False))
    assert query_size(handle_bytes, 5) == 5  # bytes from a handle call are never unpickled


def test_requests_wait_in_the_dispatcher_until_an_instance_frees(tmp_path):
    router, replicas = make_router(tmp_path)

    async def scenario() -> list:
        first = await router.choose_replicas(replicas, pending("q0", 100))
        second = await router.choose_replicas(replicas, pending("q1", 100))
        third = asyncio.create_task(router.choose_replicas(replicas, pending("q2", 100)))
        await asyncio.sleep(0.01)
        assert not third.done()  # every instance is busy: q2 waits in the central queue
        freed = first[0][0]
        router.on_request_completed(freed.replica_id, "q0")
        return [first, second, await asyncio.wait_for(third, 5)]

    first, second, third = asyncio.run(scenario())
    assert {first[0][0].replica_id, second[0][0].replica_id} == {"r0", "r1"}
    assert third[0][0] is first[0][0]  # the freed instance takes the queued query
    records = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert records[0] == {"event": "pool", "instances": [[0, "fast", "r1"], [1, "slow", "r0"]]}
    starts = [(r["request"], r["type"]) for r in records if r["event"] == "start"]
    assert [s[0] for s in starts] == ["q0", "q1", "q2"] and starts[0][1] == "fast"  # idle fast instance first


def test_node_start_flags_mark_type_and_slots():
    flags = node_start_flags(PoolChoice("m", {"g4dn.xlarge": 1, "r5n.large": 2, "t3.xlarge": 0}, 1.0, 10.0))
    assert json.loads(flags["r5n.large"]) == {"recserve_slot": 2, "recserve_type_r5n_large": 1}
    assert set(flags) == {"g4dn.xlarge", "r5n.large"}


def test_a_prior_seeds_the_routers_predictor(tmp_path):
    router, replicas = make_router(tmp_path)
    row = [float(b) for b in range(1, 101)]  # one value per default predictor bucket
    router.initialize_state(types={type_resource("fast"): "fast", type_resource("slow"): "slow"}, qos_ms=50.0,
                            prior={"fast": row, "slow": [2 * x for x in row]})
    router._node_types = lambda: {"node-a": "fast", "node-b": "slow"}
    router._bind(replicas)
    predictor = router.dispatcher.policy.predictor
    assert predictor.pred[predictor.types.index("slow"), 9] == 20.0 and predictor.pred[0, 9] == 10.0


def test_provision_and_pool_plans_build_ray_applications():
    """Ray validates the deployment options (autoscaling policy, request router) when the app is built."""
    pytest.importorskip("ray.serve")
    from recserve.deploy.ray_plans import pool_app, provision_apps
    from recserve.planners.plan import ProvisionPlan, ProvisionStep

    steps = [ProvisionStep(0.0, {"w": 1.0}, {"hercules-rmc1": {"hercules-t1": 2}}, 1.0, {}),
             ProvisionStep(12.0, {"w": 1.0}, {"hercules-rmc1": {"hercules-t1": 0}}, 1.0, {})]
    plan = ProvisionPlan(planner="hercules", steps=steps, inputs={
        "available": {"hercules-t1": 5}, "efficiency": {"hercules-rmc1": {"hercules-t1": {"qps": 900.0}}}})
    (name, app), = provision_apps(plan, 1e-3, t_hours=1.0).items()
    config = app._bound_deployment._deployment_config
    assert name == "prov-hercules-rmc1-hercules-t1" and config.autoscaling_config.max_replicas == 5
    assert config.autoscaling_config.initial_replicas == 2  # the count planned for 01:00 ...
    (_, afternoon), = provision_apps(plan, 1e-3, t_hours=13.0).items()
    assert afternoon._bound_deployment._deployment_config.autoscaling_config.initial_replicas == 0  # ... for 13:00
    assert config.autoscaling_config.policy.policy_kwargs == {"steps": [[0.0, 2], [12.0, 0]], "qps_per_server": 900.0}
    assert app._bound_deployment.ray_actor_options["resources"] == {type_resource("hercules-t1"): 0.001}
    pool = pool_app(PoolChoice("kairos-wnd", {"g4dn.xlarge": 1, "r5n.large": 2}, 1.0, 1.0), 25.0, 1e-3)
    deployment = pool._bound_deployment
    assert deployment.num_replicas == 3 and deployment._deployment_config.max_ongoing_requests == 1
    assert deployment._deployment_config.request_router_config.request_router_class.endswith(":KairosRouter")
