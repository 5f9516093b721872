"""ElasticRec on CPU-GPU nodes (§V-A, §VI-C): the GKE node type, GPU-holding replicas packed one per T4, and the
stepped-load memory of Fig. 19's rows."""

from __future__ import annotations

import pytest

from recserve.planners.elasticrec import (
    Replica,
    ShardCostModel,
    cost_model_from_perfmodel,
    evaluate_plan,
    pack_servers,
    plan_replicas,
    plan_shards,
)
from recserve.specs import SLA, ModelSpec, ServerType, TableSpec, get_server


def _toy_spec() -> ModelSpec:
    return ModelSpec(name="toy", family="dlrm", dense_in=8, bottom_mlp=(16,), top_mlp=(8, 1), interaction="dot",
                     tables=(TableSpec("t0", 200_000, 16, pooling=64),), sla=SLA(400.0))


def test_the_gke_node_is_in_the_catalogue_as_the_paper_gives_it():
    node = get_server("gke-n1-standard-32-t4")
    assert (node.cores, node.mem_gb, node.accelerator, node.accel_mem_gb) == (16, 120, "T4", 16)
    assert node.accel_tflops == get_server("g4dn.xlarge").accel_tflops          # the T4 as the catalogue states it
    assert "ElasticRec §V-A" in node.source and any("CPU not printed" in a for a in node.assumptions)


def test_the_planner_puts_the_dense_shard_on_the_t4_and_the_gathers_on_the_host():
    spec = _toy_spec()
    gpu = cost_model_from_perfmodel(spec, get_server("gke-n1-standard-32-t4"), 32)
    cpu = cost_model_from_perfmodel(spec, get_server("hera-xeon"), 32)
    assert gpu.dense_device == "T4" and cpu.dense_device == ""
    plan = plan_shards(spec, 200.0, gpu, batch=32, locality=0.9, locality_model="zipf")
    sharded, modelwise = plan_replicas(plan, spec, gpu)
    assert [r.gpus for r in sharded if r.name == "dense"] == [1] * plan.dense_replicas
    assert all(r.gpus == 0 for r in sharded if r.name != "dense") and all(r.gpus == 1 for r in modelwise)
    assert all(r.gpus == 0 for r in plan_replicas(plan, spec, cpu)[0])


def test_one_gpu_replica_per_node_when_the_node_has_one_gpu():
    server = ServerType(name="s", cores=16, mem_gb=100, mem_bw_gbs=10, accelerator="T4")
    small = [Replica(f"m{i}", 0.5, 1e9, gpus=1) for i in range(3)] + [Replica("s0", 0.5, 1e9)]
    assert pack_servers(small, server) == 1                                     # GPUs not counted: as before
    assert pack_servers(small, server, gpus_per_server=1) == 3                  # the CPU-only replica shares a node
    with pytest.raises(Exception, match="fits no"):
        pack_servers([Replica("two", 0.5, 1e9, gpus=2)], server, gpus_per_server=1)
    spec = _toy_spec()
    cost = ShardCostModel(0.05, 0.002, 300.0, 30 * 2**20, dense_device="T4")
    plan = plan_shards(spec, 2000.0, cost, batch=32, locality=0.9, locality_model="zipf")
    ev = evaluate_plan(plan, spec, cost, server, locality=0.9, locality_model="zipf", gpus_per_server=1)
    assert ev.servers >= plan.dense_replicas and ev.servers_modelwise >= plan.modelwise_replicas


def test_stepped_memory_follows_the_load_and_the_peak_ratio_is_model_wise_over_elasticrec():
    from benchmarks.papers.elasticrec_gpu import peak_ratio, stepped_memory

    spec = _toy_spec()
    cost = ShardCostModel(0.05, 0.002, 5000.0, 30 * 2**20)
    loads = [100.0, 100.0, 3000.0, 3000.0, 3000.0, 100.0]
    plan = plan_shards(spec, loads[0], cost, batch=32, locality=0.9, locality_model="zipf", dp_target_qps=3000.0)
    steps = stepped_memory(plan, spec, cost, loads)
    assert [s["load_qps"] for s in steps] == loads
    assert steps[2]["modelwise_replicas"] > steps[0]["modelwise_replicas"] == 1
    assert steps[2]["elasticrec_bytes"] > steps[0]["elasticrec_bytes"]
    assert steps[-1]["modelwise_bytes"] == steps[0]["modelwise_bytes"]        # scaled back in
    per_model = spec.embedding_bytes + cost.dense_bytes + cost.min_mem_bytes
    assert steps[2]["modelwise_bytes"] == steps[2]["modelwise_replicas"] * per_model
    ratio = peak_ratio(steps)
    assert ratio == max(s["modelwise_bytes"] for s in steps) / max(s["elasticrec_bytes"] for s in steps)
    assert ratio > 1.0
