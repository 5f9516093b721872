"""The analytic performance model: directions of every effect, queueing sanity, profiles and calibration files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recserve.errors import ProfileError
from recserve.perfmodel import Allocation, PerfModel, SizeMix, load_calibration, model_profiles
from recserve.perfmodel.cost import analytic_dense, model_cost, scaled_spec, zipf_hit
from recserve.perfmodel.queueing import Station, erlang_c, production_sizes, sojourn_percentile
from recserve.planners.hercules.search import efficiency_tables
from recserve.profiles import KINDS, ProfileSet
from recserve.specs import SLA, ModelSpec, ServerType, TableSpec, get_model


def dlrm(name: str = "t-dlrm", rows: int = 1_000_000, dim: int = 32, pooling: int = 40, tables: int = 8,
         bottom: tuple[int, ...] = (128, 64, 32), top: tuple[int, ...] = (256, 64, 1), sla_ms: float = 100.0,
         interaction: str = "dot") -> ModelSpec:
    if interaction == "dot":
        bottom = (*bottom[:-1], dim)
    return ModelSpec(name=name, family="dlrm", dense_in=13, interaction=interaction, sla=SLA(sla_ms, 95.0),
                     tables=tuple(TableSpec(f"t{i}", rows, dim, pooling) for i in range(tables)),
                     bottom_mlp=bottom, top_mlp=top)


CPU = ServerType(name="t-cpu", cores=16, mem_gb=192, mem_bw_gbs=100, llc_mb=22, llc_ways=11, freq_ghz=2.2,
                 flops_per_cycle=32, power_w=200)
GPU = ServerType(name="t-gpu", cores=8, mem_gb=64, mem_bw_gbs=50, llc_mb=16, llc_ways=11, freq_ghz=2.0,
                 flops_per_cycle=32, accelerator="G", accel_tflops=15, accel_mem_gb=16, accel_mem_bw_gbs=900,
                 pcie_gbs=16, power_w=500)
PM = PerfModel()
MIX = SizeMix.of(production_sizes(5000, seed=1))


def test_latency_grows_with_batch_and_falls_with_op_parallelism():
    spec = dlrm(bottom=(1024, 512, 32), top=(1024, 512, 1))
    lat = [PM.latency_ms(spec, CPU, b) for b in (1, 16, 128, 1024)]
    assert all(a < b for a, b in zip(lat, lat[1:], strict=False))
    one, four = (PM.latency_ms(spec, CPU, 512, Allocation(cores_per_worker=c)) for c in (1, 4))
    assert four < one and four > one / 4  # op-parallelism helps, with idle operator workers (Hercules III-A)


def test_llc_ways_and_corunner_bandwidth_slow_a_query():
    spec = dlrm(rows=7_000, tables=8)  # 8 x 7k x 128 B = 7 MB: fits the whole LLC (and the TLB reach), not one way
    full = PM.latency_ms(spec, CPU, 256, Allocation(llc_ways=11))
    one_way = PM.latency_ms(spec, CPU, 256, Allocation(llc_ways=1))
    assert one_way > full * 1.2
    big = dlrm(rows=5_000_000)
    quiet = PM.latency_ms(big, CPU, 256)
    noisy = PM.latency_ms(big, CPU, 256, Allocation(corunner_gbs=60))
    assert noisy > quiet * 1.2


def test_gathers_beyond_the_tlb_reach_cost_like_misses_but_add_no_dram_traffic():
    big_llc = ServerType(name="t-big-llc", cores=16, mem_gb=128, mem_bw_gbs=20, llc_mb=300, llc_ways=20, freq_ghz=2.1,
                         flops_per_cycle=32, power_w=200)
    no_tlb = PerfModel(PM.cal.with_values(tlb_reach_mb=0.0))
    large = dlrm(rows=200_000, tables=8)  # 8 x 200k x 128 B = 205 MB: LLC-resident, 25x the TLB reach
    small = dlrm(rows=7_000, tables=8)  # 7 MB: within the reach
    assert PM.call_ms(large, big_llc, 256) > 1.5 * no_tlb.call_ms(large, big_llc, 256)
    assert PM.call_ms(small, big_llc, 256) == pytest.approx(no_tlb.call_ms(small, big_llc, 256))
    alloc = Allocation(workers=4, batch=64)
    assert PM.evaluate(large, big_llc, alloc, MIX).membw_gbs == pytest.approx(0.0, abs=1e-9)  # all from the LLC
    # past the LLC as well, the DRAM rate is paid once: the reach adds nothing
    huge = dlrm(rows=5_000_000)
    assert PM.call_ms(huge, CPU, 256) == pytest.approx(no_tlb.call_ms(huge, CPU, 256), rel=0.02)


def test_a_single_row_product_takes_the_gemv_path_without_the_gemm_knee():
    """Batch 1 of an MLP model is a matrix-vector product: batch_half (the GEMM's per-call work on weight panels) does
    not apply there, only to products of two rows or more; attention over a sequence has many rows even at batch 1."""
    knee, flat = (PerfModel(PM.cal.with_values(batch_half=bh)) for bh in (200.0, 0.1))
    heavy = dlrm(rows=1_000, bottom=(1024, 1024, 32), top=(1024, 1024, 1))  # MLP-bound, weights in the LLC
    assert knee.call_ms(heavy, CPU, 1) == pytest.approx(flat.call_ms(heavy, CPU, 1))
    assert knee.call_ms(heavy, CPU, 2) > 5 * flat.call_ms(heavy, CPU, 2)
    din = scaled_spec(get_model("hera-din"), 1e-4)  # 250 GEMM rows per item
    assert knee.call_ms(din, CPU, 1) > 1.1 * flat.call_ms(din, CPU, 1)  # the knee still applies


def test_tensors_past_the_mmap_cap_fault_in_every_call():
    """DIN allocates three 80 KB-per-item activations: past 32 MiB (batch 512: 41 MB each) glibc maps them fresh every
    call, so each page faults in at fault_gbs_per_core; at batch 128 (10 MB) the heap reuses them."""
    din = scaled_spec(get_model("hera-din"), 1e-4)
    sizes = model_cost(din).alloc_bytes_per_item
    assert sorted(sizes)[-3:] == pytest.approx([80_000.0] * 3)  # [250 steps x 80 units] fp32
    slow, free = (PerfModel(PM.cal.with_values(fault_gbs_per_core=g)) for g in (1.0, 1e9))
    assert slow.call_ms(din, CPU, 128) == pytest.approx(free.call_ms(din, CPU, 128))
    assert slow.call_ms(din, CPU, 512) - free.call_ms(din, CPU, 512) == pytest.approx(3 * 80_000 * 512 / 1e9 * 1e3,
                                                                                     rel=0.01)
    mlp = dlrm()  # no tensor near the cap
    assert slow.call_ms(mlp, CPU, 512) == pytest.approx(free.call_ms(mlp, CPU, 512))


def test_locality_raises_hit_rate():
    assert zipf_hit(1000, 1_000_000, 0.0) == pytest.approx(1e-3)
    assert zipf_hit(1000, 1_000_000, 1.05) > 0.3
    spec = dlrm(rows=5_000_000)
    uniform = PM.latency_ms(spec, CPU, 256, Allocation(zipf_s=0.0))
    skewed = PM.latency_ms(spec, CPU, 256, Allocation(zipf_s=1.1))
    assert skewed < uniform


def test_memory_capacity_limits_copied_workers():
    spec = dlrm(rows=10_000_000, tables=8, dim=64)  # 20.5 GB of tables
    shared = PM.max_workers(spec, CPU, Allocation(tables="shared"))
    copied = PM.max_workers(spec, CPU, Allocation(tables="copied"))
    assert shared == CPU.cores
    assert copied == int(CPU.mem_gb * PM.cal.mem_usable_frac // (spec.embedding_bytes / 1e9 + 0.4))
    r = PM.evaluate(spec, CPU, Allocation(workers=copied + 1, tables="copied"), MIX)
    assert not r.feasible and "memory" in r.reason


def test_bandwidth_bound_model_stops_scaling():
    wide = dlrm(dim=256, pooling=80, rows=2_000_000)  # DLRM(D)-like: gathers dominate
    narrow = dlrm(bottom=(1024, 512, 32), top=(2048, 1024, 1), pooling=2, rows=100_000)
    def scaling(spec):
        q = [PM.max_load(spec, CPU, Allocation(workers=w, batch=128), MIX) for w in (4, 16)]
        return q[1] / q[0]
    assert scaling(narrow) > 3.5
    assert scaling(wide) < scaling(narrow)
    r = PM.evaluate(wide, CPU, Allocation(workers=16, batch=128), MIX)
    assert r.membw_gbs <= CPU.mem_bw_gbs * PM.cal.membw_eff


def test_max_load_respects_capacity_and_sla():
    spec = dlrm()
    alloc = Allocation(workers=8, batch=128)
    r = PM.evaluate(spec, CPU, alloc, MIX)
    def work(n: int) -> float:  # worker-ms of one query split into sub-batches of at most 128
        full, rem = divmod(int(n), 128)
        return full * PM.call_ms(spec, CPU, 128, alloc) + (PM.call_ms(spec, CPU, rem, alloc) if rem else 0.0)

    per_query_ms = sum(work(n) * p for n, p in zip(MIX.sizes, MIX.probs, strict=True))
    assert 0 < r.max_qps < 8 / per_query_ms * 1000
    assert r.latency_ms <= spec.sla.target_ms * 1.01
    tight = PM.max_load(spec, CPU, alloc, MIX, SLA(0.01, 95))
    assert tight == 0.0
    looser = PM.max_load(spec, CPU, alloc, MIX, SLA(400, 95))
    assert looser > r.max_qps


def test_queueing_formulas():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    # M/M/2 at a = 1: C = 1/3
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    probs = np.array([1.0])
    one = Station.from_jobs(1, probs, np.array([1.0]), np.array([10.0]), np.array([100.0]), np.array([10.0]))
    assert sojourn_percentile([one], probs, 0.0, 95) == pytest.approx(10.0)
    assert sojourn_percentile([one], probs, 80.0, 95) > sojourn_percentile([one], probs, 40.0, 95) > 10.0
    sizes = production_sizes(20000)
    assert 200 < sizes.mean() < 290 and 150 <= np.median(sizes) <= 210


def test_accelerator_speeds_up_dense_heavy_model():
    spec = dlrm(bottom=(2560, 1024, 32), top=(1024, 512, 1), rows=100_000)
    cpu_only = PM.latency_ms(spec, GPU, 512, Allocation(accelerator=False))
    on_gpu = PM.latency_ms(spec, GPU, 512, Allocation(accelerator=True))
    assert on_gpu < cpu_only / 2
    # tables larger than device memory: host gathers the cold part and ships partial sums over PCIe
    huge = dlrm(rows=200_000_000, dim=32, tables=4)
    assert PM.latency_ms(huge, GPU, 512) > PM.latency_ms(dlrm(rows=100_000, tables=4), GPU, 512)


def test_analytic_fallback_close_to_zoo_count():
    spec = dlrm(bottom=(256, 128, 32), top=(256, 64, 1))
    flops, params, _ = analytic_dense(spec)
    zoo = model_cost(spec)
    assert zoo.source == "zoo"
    assert flops == pytest.approx(zoo.flops_per_item, rel=0.05)
    assert params * 4 == pytest.approx(zoo.weight_bytes, rel=0.05)


def test_model_profiles_round_trip(tmp_path):
    spec = dlrm(tables=4)
    small = ServerType(name="t-small", cores=4, mem_gb=32, mem_bw_gbs=30, llc_mb=8, llc_ways=8, power_w=60)
    ps = model_profiles([spec], [small], sizes=production_sizes(2000), extra=efficiency_tables)
    kinds = {t.kind for t in ps}
    assert {"latency_vs_batch", "maxload_vs_workers", "maxload_vs_ways", "membw_vs_workers", "footprint",
            "efficiency"} <= kinds
    assert all(t.source == "modelled" for t in ps)
    assert ps.get(spec.name, small.name, "maxload_vs_ways").column("workers")[0] == 4
    assert ps.get(spec.name, small.name, "maxload_vs_ways", workers=2).column("ways").tolist() == list(range(1, 9))
    path = ps.save(tmp_path / "modelled.json")
    back = ProfileSet.load(path)
    assert len(back) == len(ps)
    for t in ps:
        assert back.get(t.model, t.server, t.kind, **t.conditions).rows == t.rows
    assert set(KINDS) >= kinds


def test_wrong_profile_version_is_refused_clearly(tmp_path):
    spec = dlrm(tables=2)
    small = ServerType(name="t-small", cores=2, mem_gb=16, mem_bw_gbs=20, llc_mb=4, llc_ways=4, power_w=40)
    path = model_profiles([spec], [small], sizes=[64, 128]).save(tmp_path / "p.json")
    data = json.loads(path.read_text())
    data["version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="version 99 is not supported"):
        ProfileSet.load(path)
    from recserve.cli import main

    assert main(["profile", "calibrate", "--measured", str(path), "--out", str(tmp_path / "c.json")]) == 2


def test_a_calibration_given_as_a_profile_is_named_as_one(tmp_path):
    from recserve.perfmodel.calibration import load_calibration

    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(load_calibration().to_dict()))
    with pytest.raises(ProfileError, match=r"calibration\.json: a perfmodel calibration, not a profile \(give it to "
                                            r"--calibration\)"):
        ProfileSet.load(path)


def test_calibration_file_round_trip_and_version(tmp_path):
    cal = load_calibration()
    path = cal.with_values(fixed_ms=0.123).save(tmp_path / "cal.json")
    assert load_calibration(path).fixed_ms == 0.123
    data = json.loads(path.read_text())
    data["version"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="calibration version 7"):
        load_calibration(path)
    path.write_text(json.dumps({"version": 1, "kind": "pool", "pools": []}))  # another recserve file
    with pytest.raises(ProfileError, match=r"not a calibration \(it holds no 'constants'"):
        load_calibration(path)


def test_near_memory_processing_helps_multi_hot_tables_only():
    from dataclasses import replace

    nmp = replace(CPU, name="t-nmp", nmp=True, source="CPU + NMPx4")
    multi = dlrm(rows=4_000_000, pooling=80)
    one_hot = dlrm(rows=4_000_000, pooling=1, bottom=(512, 256, 32), top=(512, 256, 1))
    assert PM.latency_ms(multi, nmp, 256) < 0.8 * PM.latency_ms(multi, CPU, 256)
    assert PM.latency_ms(one_hot, nmp, 256) == pytest.approx(PM.latency_ms(one_hot, CPU, 256))


def test_call_counts_follow_the_executed_module():
    """Framework overhead is charged per operator actually dispatched: DIEN's scripted recurrence runs
    thousands of small operators, SDM's M2 one bag per table; DIN's attention GEMMs have one row per
    behaviour step, so their efficiency is judged on a matrix far taller than the batch."""
    from recserve.perfmodel.cost import analytic_calls
    from recserve.specs import get_model

    dlrm, dien, din, m2 = (model_cost(get_model(n)) for n in ("hera-dlrm-a", "hercules-dien", "hera-din", "sdm-m2"))
    assert dien.dense_ops > 20 * dlrm.dense_ops
    assert m2.sparse_modules >= len(get_model("sdm-m2").tables)
    seq = max(t.pooling for t in get_model("hera-din").sequence_tables)
    assert 0.5 * seq < din.gemm_rows_per_item <= seq + 1
    assert dlrm.gemm_rows_per_item < 2.0
    assert din.activation_bytes_per_item > 10 * dlrm.activation_bytes_per_item
    est = analytic_calls(get_model("hera-dlrm-a"))  # the estimate for families the zoo cannot build
    assert 0.5 < est.sparse_ops / dlrm.sparse_ops < 2 and 0.5 < est.dense_ops / dlrm.dense_ops < 2


def test_operator_overhead_is_calibrated_not_per_layer():
    """A model with 730 tables pays per bag op, not per-layer constants: predicted batch-1 latency of
    SDM's M2 scales with its operator counts under the bundled constants."""
    from recserve.specs import get_model, get_server

    pm = PerfModel()
    host = get_server("this-host")
    m2, rm1 = get_model("sdm-m2"), get_model("hercules-rmc1")
    assert pm.call_ms(m2, host, 1) > 10 * pm.call_ms(rm1, host, 1)


def test_burstable_cpu_share_stretches_host_time():
    from dataclasses import replace as _replace

    from recserve.errors import SpecError
    from recserve.perfmodel import PerfModel
    from recserve.specs import get_model, get_server

    pm = PerfModel()
    spec, full = get_model("kairos-wnd"), get_server("c5n.2xlarge")
    half = _replace(full, cpu_share=0.5)
    assert pm.call_ms(spec, half, 64) == pytest.approx(2 * pm.call_ms(spec, full, 64))
    assert get_server("t3.xlarge").cpu_share == 0.4
    with pytest.raises(SpecError):
        _replace(full, cpu_share=0.0)


def test_a_calibration_to_distrust_is_called_out():
    from recserve.commands.profile_calibrate import _fit_warnings
    from recserve.perfmodel.fit import FIT_PARAMS

    assert _fit_warnings(200, 12.0, 20.0) == []
    few, off = _fit_warnings(len(FIT_PARAMS) - 1, 12.0, 215.4)
    assert "the fit is underdetermined" in few and "held-out models 215% off" in off
    assert _fit_warnings(200, 80.0, None) == ["it misses its own points by 80% (median)"]


def test_model_profiles_counts_the_pairs_it_models():
    spec = dlrm(tables=2)
    small = ServerType(name="t-small", cores=2, mem_gb=16, mem_bw_gbs=20, llc_mb=4, llc_ways=4, power_w=40)
    other = ServerType(name="t-other", cores=4, mem_gb=16, mem_bw_gbs=20, llc_mb=4, llc_ways=4, power_w=60)
    lines: list[str] = []
    model_profiles([spec], [small, other], sizes=[64, 128], progress=lines.append)
    assert lines == [f"modelling {spec.name} on t-small (1/2)", f"modelling {spec.name} on t-other (2/2)"]
