"""Hercules' gradient-guided task-scheduling search against exhaustive search and DeepRecSys, on the perfmodel."""

from __future__ import annotations

import json

import pytest

from recserve.perfmodel import PerfModel, SizeMix
from recserve.perfmodel.evaluator import perfmodel_evaluator
from recserve.perfmodel.queueing import production_sizes
from recserve.planners.hercules.search import (
    SchedConfig,
    deeprecsys,
    exhaustive,
    search,
    space,
)
from recserve.specs import SLA, ModelSpec, ServerType, TableSpec, catalogue_models

BATCHES = (32, 128, 512, 1024)
SERVERS = [
    ServerType(name="fx-cpu12", cores=12, mem_gb=96, mem_bw_gbs=60, llc_mb=30, llc_ways=12, freq_ghz=2.4,
               flops_per_cycle=32, power_w=150),
    ServerType(name="fx-cpu10-bw", cores=10, mem_gb=128, mem_bw_gbs=25, llc_mb=14, llc_ways=11, freq_ghz=2.0,
               flops_per_cycle=32, power_w=120),
    ServerType(name="fx-cpu8-lowmem", cores=8, mem_gb=24, mem_bw_gbs=30, llc_mb=11, llc_ways=11, freq_ghz=3.0,
               flops_per_cycle=32, power_w=80),
    ServerType(name="fx-cpu8-slow", cores=8, mem_gb=256, mem_bw_gbs=80, llc_mb=22, llc_ways=11, freq_ghz=1.6,
               flops_per_cycle=16, power_w=130),
]
GPU = ServerType(name="fx-gpu6", cores=6, mem_gb=64, mem_bw_gbs=40, llc_mb=12, llc_ways=12, freq_ghz=2.5,
                 flops_per_cycle=32, accelerator="fx", accel_tflops=12, accel_mem_gb=16, accel_mem_bw_gbs=600,
                 pcie_gbs=16, power_w=350)
PM = PerfModel()
MIX = SizeMix.of(production_sizes(4000, seed=3))


def models() -> list[ModelSpec]:
    found = list(catalogue_models().values())
    if len(found) >= 3:
        return found
    return [ModelSpec(name=f"fx-dlrm{i}", family="dlrm", dense_in=13, interaction="concat", sla=SLA(sla, 95),
                      tables=tuple(TableSpec(f"t{k}", rows, 32, pooling) for k in range(8)),
                      bottom_mlp=(256, 64), top_mlp=top)
            for i, (sla, rows, pooling, top) in enumerate([(100, 1_000_000, 80, (256, 64, 1)),
                                                          (20, 100_000, 2, (1024, 512, 1)),
                                                          (50, 4_000_000, 20, (512, 128, 1))])]


@pytest.mark.parametrize("server", SERVERS, ids=lambda s: s.name)
@pytest.mark.integration  # seconds of work
def test_search_finds_exhaustive_optimum_with_a_quarter_of_the_evaluations(server):
    rows = []
    for spec in models()[SERVERS.index(server) % 2:: 2]:  # every model on two of the four servers
        evaluate = perfmodel_evaluator(spec, server, PM, MIX)
        truth = exhaustive(server, evaluate, BATCHES)
        found = search(server, evaluate, BATCHES)
        assert found.evaluations <= truth.evaluations / 4, (spec.name, found.evaluations, truth.evaluations)
        if truth.best_qps > 0:
            assert found.best_qps >= 0.97 * truth.best_qps, (spec.name, found.best, truth.best)
        else:
            assert found.best is None
        rows.append((spec.name, found.best_qps, truth.best_qps))
    assert any(q > 0 for _, q, _ in rows)


@pytest.mark.integration  # seconds of work
def test_search_on_an_accelerator_server():
    """Model-based on the device (co-location x query size) and SparseNet-on-host / DenseNet-on-device."""
    for spec in models()[:: max(1, len(models()) // 4)]:
        evaluate = perfmodel_evaluator(spec, GPU, PM, MIX)
        truth = exhaustive(GPU, evaluate, BATCHES)
        found = search(GPU, evaluate, BATCHES)
        assert found.evaluations <= truth.evaluations / 4
        assert found.best_qps >= 0.97 * truth.best_qps


def test_exhaustive_is_the_true_maximum_and_deeprecsys_only_tunes_batch():
    server = SERVERS[2]
    spec = models()[0]
    evaluate = perfmodel_evaluator(spec, server, PM, MIX)
    configs = space(server, BATCHES)
    values = [evaluate(c) or 0.0 for c in configs]
    truth = exhaustive(server, evaluate, BATCHES)
    assert truth.evaluations == len(configs) and truth.best_qps == max(values)
    drs = deeprecsys(server, evaluate, BATCHES)
    assert drs.evaluations <= len(BATCHES)
    assert all(c.threads == server.cores and c.cores_per_thread == 1 and c.mode == "model" for c, _ in drs.path)
    assert drs.best_qps <= truth.best_qps


def test_search_on_a_convex_function_and_counts_evaluations():
    server = ServerType(name="fx", cores=16, mem_gb=64, mem_bw_gbs=50)
    calls = []

    def bowl(cfg: SchedConfig) -> float | None:
        calls.append(cfg)
        if cfg.mode == "pipeline":
            return 50.0 - abs(cfg.sparse_threads - 4) - abs(cfg.threads - 6) - abs(cfg.batch - 128) / 64
        return 100.0 - 3 * abs(cfg.threads - 7) - 10 * abs(cfg.cores_per_thread - 2) - abs(cfg.batch - 256) / 32

    found = search(server, bowl)
    assert found.best == SchedConfig("model", 7, 2, 256)
    assert found.evaluations == len(set(calls)) < len(space(server)) / 10


def test_search_is_not_stopped_by_a_cache_cliff_and_never_returns_less_than_deeprecsys():
    """Threads that share hot rows: past 8 of them the rows leave the LLC (a dip at 9-10 threads, the SLA missed at
    batch 1024), then the load grows with threads again; the best point is every core at a small batch."""
    server = ServerType(name="fx", cores=16, mem_gb=64, mem_bw_gbs=50)

    def cliff(cfg: SchedConfig) -> float | None:
        if cfg.mode == "pipeline" or cfg.cores_per_thread > 1:
            return None
        t, b = cfg.threads, cfg.batch
        if t in (9, 10) and b >= 512 or b == 1024 and t > 8:
            return None
        per_thread = 100.0 if t <= 8 else 60.0
        return t * per_thread * (1.0 + 0.1 * (b >= 128)) * (0.5 if b >= 512 and t > 8 else 1.0)

    found, base = search(server, cliff, batches=BATCHES), deeprecsys(server, cliff, batches=BATCHES)
    assert found.best_qps >= base.best_qps
    assert found.best == SchedConfig("model", 16, 1, 128) == exhaustive(server, cliff, batches=BATCHES).best


def test_power_budget_is_respected():
    server, spec = SERVERS[0], models()[0]
    free = search(server, perfmodel_evaluator(spec, server, PM, MIX), BATCHES)
    assert free.best is not None
    power = perfmodel_evaluator(spec, server, PM, MIX).detail(free.best).power_w
    capped_eval = perfmodel_evaluator(spec, server, PM, MIX, power_budget_w=power * 0.8)
    capped = search(server, capped_eval, BATCHES)
    if capped.best is not None:
        assert capped_eval.detail(capped.best).power_w <= power * 0.8
        assert capped.best_qps < free.best_qps


def test_plan_search_cli(tmp_path, capsys):
    from recserve.cli import main

    name = models()[0].name
    out = tmp_path / "s.json"
    from recserve.specs import catalogue_servers

    server = next((s for s in catalogue_servers().values() if s.cores <= 8 and not s.accelerator), None)
    if server is None:
        pytest.skip("no small CPU server type in the catalogue")
    assert main(["plan", "search", "--model", name, "--server", server.name, "--batches", "64,256,1024",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hercules" in text and "exhaustive" in text and "deeprecsys" in text
    data = json.loads(out.read_text())
    assert data["hercules"]["evaluations"] <= data["exhaustive"]["evaluations"]
    assert main(["plan", "search", "--model", name, "--server", server.name, "--live"]) == 2


GPU12 = ServerType(name="fx-gpu12", cores=12, mem_gb=64, mem_bw_gbs=40, llc_mb=12, llc_ways=12, freq_ghz=2.5,
                   flops_per_cycle=32, accelerator="fx", accel_tflops=12, accel_mem_gb=16, accel_mem_bw_gbs=600,
                   pcie_gbs=16, power_w=350)


def test_one_device_thread_cap_for_every_mode():
    from recserve.planners.hercules.search import MAX_DEVICE_THREADS

    configs = space(GPU12, BATCHES)
    assert max(c.threads for c in configs if c.mode == "model") == MAX_DEVICE_THREADS < GPU12.cores
    assert max(c.threads for c in configs if c.mode == "pipeline") == MAX_DEVICE_THREADS
    assert max(c.threads for c in space(SERVERS[0], BATCHES) if c.mode == "model") == SERVERS[0].cores
    spec = models()[0]
    found = search(GPU12, perfmodel_evaluator(spec, GPU12, PM, MIX), BATCHES)
    assert all(c.threads <= MAX_DEVICE_THREADS for c, _ in found.path)


def test_baymax_colocates_on_the_device_and_is_deeprecsys_on_cpu():
    from recserve.planners.hercules.search import MAX_DEVICE_THREADS, baymax

    spec = models()[0]
    ev = perfmodel_evaluator(spec, GPU12, PM, MIX)
    bm, drs = baymax(GPU12, ev, BATCHES), deeprecsys(GPU12, ev, BATCHES)
    assert bm.best_qps >= drs.best_qps
    assert any(c.threads > 1 for c, _ in bm.path) and all(c.threads <= MAX_DEVICE_THREADS for c, _ in bm.path)
    cpu_ev = perfmodel_evaluator(spec, SERVERS[2], PM, MIX)
    assert baymax(SERVERS[2], cpu_ev, BATCHES).best == deeprecsys(SERVERS[2], cpu_ev, BATCHES).best
