"""ElasticRec local backend: embedding-shard services + dense-shard node server, live on loopback."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

from recserve.deploy.local_shards import make_layout, process_memory_mb, start_sharded
from recserve.measure.loadgen import LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.targets import GrpcTarget, HttpTarget
from recserve.serving.shards.remote_table import ShardClient
from recserve.serving.shards.service import OUTPUT_POOLED, lookup
from recserve.specs import get_model
from recserve.zoo import build
from tests.support import http
from tests.support.nodes import DEADLINE_MS, node_config, started
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

MODEL = "elasticrec-rm1@tables=2"
SCALE = 5e-4  # 10k rows per table


@pytest.fixture(scope="module")
def spec():
    return get_model(MODEL)


@pytest.fixture(scope="module")
def model(spec):
    return build(spec, scale=SCALE, seed=0)


@pytest.fixture(scope="module")
def pool(spec):
    return RequestPool(spec, SCALE, sizes=(1, 5, 32, 48), seed=7, index="locality:p=0.9")


@pytest.fixture(scope="module")
def sharded(spec, model):
    layout = make_layout(spec, SCALE, seed=0, shards_per_table=3, replicas=[2, 1, 1], model=model)
    deployment = start_sharded(layout, model=model, dense_replicas=1, timeout_s=30.0, progress=False,
                                 deadline_ms=DEADLINE_MS)
    try:
        yield deployment
    finally:
        deployment.stop()


def _outputs(target, pool) -> list[np.ndarray]:
    with LoadSession(target, pool) as session:
        return [session.outputs(i)["scores"].copy() for i in range(len(pool))]


def test_shard_lookup_matches_embedding_bag():
    weight = torch.randn(50, 8)
    indices = np.array([3, 49, 0, 7, 7], dtype=np.int64)
    offsets = np.array([0, 2, 2], dtype=np.int64)  # second bag empty
    name, out = lookup(weight, {"indices": indices, "offsets": offsets})
    assert name == OUTPUT_POOLED
    expected = torch.nn.functional.embedding_bag(torch.from_numpy(indices), weight, torch.from_numpy(offsets),
                                                 mode="sum")
    assert np.allclose(out, expected.numpy())
    assert np.all(out[1] == 0)
    with pytest.raises(ValueError, match="indices must lie"):
        lookup(weight, {"indices": np.array([50], dtype=np.int64), "offsets": np.array([0], dtype=np.int64)})


def test_sharded_scores_equal_monolithic(sharded, model, pool, spec):
    layout = sharded.layout
    assert [len(t.replicas) for t in layout.tables] == [3, 3]
    assert len(sharded.replicas) == 2 * 4  # per table: hot shard x2, two cold shards x1
    expected = [model(pool.batch(i)).detach().numpy() for i in range(len(pool))]
    sharded_grpc = _outputs(GrpcTarget(f"127.0.0.1:{sharded.ports.grpc}", sharded.model_name), pool)
    sharded_http = _outputs(HttpTarget(f"http://127.0.0.1:{sharded.ports.http}", sharded.model_name), pool)
    with started(node_config(MODEL, scale=SCALE, workers=1, share_tables=False)) as mono:
        mono_grpc = _outputs(GrpcTarget(f"127.0.0.1:{mono.ports.grpc}", MODEL), pool)
    for i in range(len(pool)):
        assert sharded_grpc[i].shape == (pool.sizes[i], 1)
        assert np.allclose(sharded_grpc[i], mono_grpc[i], atol=1e-6, rtol=0)
        assert np.allclose(sharded_http[i], mono_grpc[i], atol=1e-6, rtol=0)
        assert np.allclose(mono_grpc[i], expected[i], atol=1e-6, rtol=0)
    assert process_memory_mb(sharded.pids())["processes"] == len(sharded.pids())


def test_tritonclient_talks_to_the_dense_shard(sharded, pool):
    import tritonclient.grpc as grpcclient

    batch = pool.batch(1)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{sharded.ports.grpc}")
    try:
        assert client.is_model_ready(sharded.model_name)
        inputs = []
        for name, arr in batch.as_arrays().items():
            tensor = grpcclient.InferInput(name, list(arr.shape), {"float32": "FP32", "int64": "INT64",
                                                                    "int32": "INT32"}[str(arr.dtype)])
            tensor.set_data_from_numpy(arr)
            inputs.append(tensor)
        scores = client.infer(sharded.model_name, inputs).as_numpy("scores")
    finally:
        client.close()
    with LoadSession(GrpcTarget(f"127.0.0.1:{sharded.ports.grpc}", sharded.model_name), pool) as session:
        assert np.allclose(scores, session.outputs(1)["scores"], atol=1e-6, rtol=0)


def test_shard_service_serves_its_slice(sharded, model):
    table = sharded.layout.tables[0]
    lo, hi = table.boundaries[1], table.boundaries[2]  # first cold shard
    sorted_weight = torch.empty_like(model.tables[0].weight)
    sorted_weight[torch.from_numpy(table.remap)] = model.tables[0].weight.detach()
    client = ShardClient(sharded.endpoints, timeout_s=30.0)
    try:
        ids = np.array([0, hi - lo - 1, 5], dtype=np.int64)
        pooled = client.start(f"{table.name}-s1", ids, np.array([0, 1], dtype=np.int64)).result()
        assert np.allclose(pooled[0], sorted_weight[lo].numpy())
        assert np.allclose(pooled[1], (sorted_weight[hi - 1] + sorted_weight[lo + 5]).numpy(), atol=1e-6)
        rows = client.start(f"{table.name}-s1", ids, None).result()
        assert np.allclose(rows, sorted_weight[lo + ids].numpy())
        with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
            client.start(f"{table.name}-s1", np.array([hi - lo], dtype=np.int64), np.array([0])).result()
    finally:
        client.close()


def test_killed_replica_gives_error_reply_or_failover(sharded, pool):
    """Hot shards have 2 replicas: losing one fails over.  A cold shard has 1: its queries get an error
    reply (a gRPC status, not a hang), while queries that do not touch it still succeed; restarted, both serve."""
    t0 = sharded.layout.tables[0]
    target = GrpcTarget(f"127.0.0.1:{sharded.ports.grpc}", sharded.model_name, timeout_s=30.0)
    with LoadSession(target, pool) as session:
        sharded.kill_replica(f"{t0.name}-s0", 0)
        for i in range(len(pool)):  # hot shard keeps one replica: every query still answered
            assert session.outputs(i)["scores"].shape == (pool.sizes[i], 1)
        sharded.kill_replica(f"{t0.name}-s2", 0)
        remap = torch.from_numpy(t0.remap)
        errors = 0
        for i in range(len(pool)):
            indices, _ = pool.batch(i).table(0)
            touches = bool((remap[indices] >= t0.boundaries[2]).any())
            try:
                session.outputs(i)
                assert not touches, "a query reading the dead shard was answered"
            except Exception as exc:  # noqa: BLE001 - the load generator's RequestFailed
                assert touches
                assert "grpc_INTERNAL" in str(exc) and "s2" in str(exc)
                errors += 1
        assert errors >= 1
        dead = {r.pid for r in sharded.replicas if not r.process.is_alive()}
        assert len(dead) == 2 and sharded.restart_dead(progress=False) == 0  # `shards serve` does this each 0.5 s
        assert not dead & {r.pid for r in sharded.replicas} and all(r.process.is_alive() for r in sharded.replicas)
        deadline = time.monotonic() + 30  # on their own ports again: the dense workers' channels reconnect
        while time.monotonic() < deadline:
            try:
                [session.outputs(i) for i in range(len(pool))]
                break
            except Exception:  # noqa: BLE001 - reconnecting, within the channel's back-off
                time.sleep(0.2)
        for i in range(len(pool)):
            assert session.outputs(i)["scores"].shape == (pool.sizes[i], 1)


def test_readiness_follows_whether_every_shard_has_a_replica_serving(sharded):
    """Readiness while replicas restart: not ready while a shard has no replica (its queries would fail), ready
    while a shard keeps one healthy replica of two (every query is answered, the dead one's calls fail over)."""
    t0 = sharded.layout.tables[0]
    port = sharded.ports.http

    def ready() -> int:
        return http.get(port, "/v2/health/ready").status

    assert until(ready, lambda s: s == 200) == 200
    sharded.kill_replica(f"{t0.name}-s2", 0)  # the cold shard's only replica
    assert until(ready, lambda s: s == 503) == 503
    assert http.get(port, f"/v2/models/{sharded.model_name}/ready").status == 503
    assert sharded.restart_dead(progress=False) == 0
    assert until(ready, lambda s: s == 200) == 200
    sharded.kill_replica(f"{t0.name}-s0", 0)  # a hot shard keeps its second replica
    rt = sharded.server.core.models[sharded.model_name]
    dead = next(r.address for r in sharded.replicas if r.shard == f"{t0.name}-s0" and r.replica == 0)
    assert until(lambda: rt.upstreams.reachable(dead), lambda up: not up) is False  # the node has seen it go
    assert ready() == 200
    assert sharded.restart_dead(progress=False) == 0
    assert until(lambda: rt.upstreams.reachable(dead), bool) is True


def test_a_hung_shard_replica_makes_the_model_not_ready_until_it_resumes(sharded):
    """A stopped (SIGSTOP) replica still completes TCP handshakes; it does not answer ServerReady, so the cold
    shard whose only replica it is has none serving: the model is not ready, and ready again once it resumes."""
    port = sharded.ports.http
    hung = next(r for r in sharded.replicas if r.shard == f"{sharded.layout.tables[0].name}-s2")

    def ready() -> int:
        return http.get(port, "/v2/health/ready").status

    assert until(ready, lambda s: s == 200) == 200
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        assert until(ready, lambda s: s == 503) == 503
        assert http.get(port, f"/v2/models/{sharded.model_name}/ready").status == 503
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    assert until(ready, lambda s: s == 200) == 200


def test_layout_from_plan_json_and_planned_replicas(tmp_path, spec, model):
    import json

    from recserve.deploy.local_shards import plan_from_json, plan_replicas
    from recserve.planners.plan import ShardPlan, TableShards

    full = spec.tables[0].rows
    tables = [TableShards(t.name, [0, full // 10, full], [3, 1], [100.0, 10.0], 1.0) for t in spec.tables]
    plan = ShardPlan(model=spec.name, target_qps=1000.0, batch=32, dense_replicas=2, dense_memory_bytes=1.0,
                     tables=tables, modelwise_replicas=4, modelwise_memory_bytes=8.0)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    layout = make_layout(spec, SCALE, plan=plan_from_json(path), model=model)
    assert layout.dense_replicas == 2
    assert [t.boundaries for t in layout.tables] == [[0, model.rows[0] // 10, model.rows[0]]] * 2
    assert [t.replicas for t in layout.tables] == [[3, 1]] * 2
    rates = {"model": 100.0, "dense": 400.0, **{f"{t.name}-s{s}": [250.0, 2000.0][s] for t in layout.tables
                                                 for s in range(2)}}
    dense, modelwise = plan_replicas(layout, rates, target_qps=500.0)
    assert (dense, modelwise) == (2, 5)
    assert [t.replicas for t in layout.tables] == [[2, 1]] * 2
    with pytest.raises(Exception, match="not a `recserve plan shard"):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        plan_from_json(bad)


def test_sequence_tables_use_the_gather_variant():
    """DIN: pooled tables and the behaviour-history sequence table, all sharded; scores as the whole model's."""
    din = get_model("hera-din")
    scale = 1e-4
    din_model = build(din, scale=scale, seed=1)
    layout = make_layout(din, scale, seed=1, shards_per_table=2, warmup_queries=10, batch=8, model=din_model)
    din_pool = RequestPool(din, scale, sizes=(1, 9), seed=5, index="locality:p=0.9")
    deployment = start_sharded(layout, model=din_model, timeout_s=30.0, progress=False,
                                 deadline_ms=DEADLINE_MS)
    try:
        got = _outputs(GrpcTarget(f"127.0.0.1:{deployment.ports.grpc}", deployment.model_name), din_pool)
    finally:
        deployment.stop()
    for i in range(len(din_pool)):
        expected = din_model(din_pool.batch(i)).detach().numpy()
        assert got[i].shape == expected.shape == (din_pool.sizes[i], din.towers)
        assert np.allclose(got[i], expected, atol=1e-6, rtol=0)
