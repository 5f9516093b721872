"""Co-runner interference in the perfmodel: threads beside a worker take LLC with their calls' private data and add
DRAM bytes/s; one worker has no co-runner and is modelled as before."""

from __future__ import annotations

from recserve.perfmodel import Allocation, PerfModel, SizeMix
from recserve.perfmodel.corunners import back_to_back_ms, corunner_threads, displaced_llc_bytes, job_items
from recserve.perfmodel.cost import model_cost
from recserve.perfmodel.queueing import production_sizes
from recserve.specs import SLA, ModelSpec, ServerType, TableSpec

CPU = ServerType(name="t-cpu", cores=16, mem_gb=192, mem_bw_gbs=60, llc_mb=22, llc_ways=11, freq_ghz=2.2,
                 flops_per_cycle=32, power_w=200)
PM = PerfModel()
NO_TLB = PerfModel(PM.cal.with_values(tlb_reach_mb=0.0))  # every LLC-resident row gathered at the LLC rate


def dlrm(rows: int, pooling: int, bottom: tuple[int, ...] = (128, 32), top: tuple[int, ...] = (256, 64, 1),
         tables: int = 8, dim: int = 32) -> ModelSpec:
    return ModelSpec(name=f"t-dlrm-{rows}-{pooling}", family="dlrm", dense_in=13, interaction="dot",
                     sla=SLA(100.0, 95.0), tables=tuple(TableSpec(f"t{i}", rows, dim, pooling) for i in range(tables)),
                     bottom_mlp=(*bottom[:-1], dim), top_mlp=top)


def test_one_worker_has_no_corunner_and_keeps_the_whole_llc():
    spec = dlrm(rows=50_000, pooling=40)
    cost = model_cost(spec)
    assert corunner_threads(Allocation()) == 0 and displaced_llc_bytes(cost, Allocation(batch=512), 512) == 0.0
    assert PM._static(spec, CPU, Allocation(batch=512)).dram_cache_bytes == CPU.llc_mb * 1e6
    four = PM._static(spec, CPU, Allocation(workers=4, batch=512))
    assert four.dram_cache_bytes == CPU.llc_mb * 1e6 - 3 * 512 * (cost.index_bytes_per_item + 8 * cost.tables
                                                                  + cost.pooled_bytes_per_item
                                                                  + cost.dense_in_bytes_per_item)
    # op-parallelism adds cores, not co-runners; a pipeline's SparseNet threads are co-runners of its DenseNet ones
    assert corunner_threads(Allocation(workers=2, cores_per_worker=4)) == 1
    assert corunner_threads(Allocation(workers=2, sparse_workers=3)) == 4


def test_more_corunners_are_monotonely_slower():
    spec = dlrm(rows=60_000, pooling=40)  # 8 x 60k x 128 B = 61 MB: a share of the hot rows sits in the LLC
    skewed = Allocation(zipf_s=1.0)
    times = [back_to_back_ms(NO_TLB, spec, CPU, 512, t) for t in (1, 2, 4, 8, 16)]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False)), times
    assert times[-1] > times[0] * 1.05
    # the LLC term alone (no bandwidth contention at zero load): co-runners' private data evicts hot rows
    alone = [NO_TLB.latency_ms(spec, CPU, 512, Allocation(workers=w, batch=512, zipf_s=1.0)) for w in (1, 4, 16)]
    assert alone[0] < alone[1] < alone[2]
    assert NO_TLB.latency_ms(spec, CPU, 512, Allocation(batch=512, zipf_s=1.0)) == NO_TLB.call_ms(
        spec, CPU, 512, skewed)


def test_a_bandwidth_bound_model_slows_more_than_a_compute_bound_one():
    gathers = dlrm(rows=2_000_000, pooling=80, dim=64)  # DLRM(D)-like: DRAM gathers dominate a call
    compute = dlrm(rows=10_000, pooling=2, bottom=(1024, 512, 32), top=(2048, 1024, 1))

    def slowdown(spec: ModelSpec) -> float:
        return back_to_back_ms(PM, spec, CPU, 128, 8) / back_to_back_ms(PM, spec, CPU, 128, 1)

    assert slowdown(gathers) > 1.3
    assert slowdown(compute) < 1.05
    assert slowdown(gathers) > slowdown(compute)


def test_max_load_prices_corunners_by_the_mean_call():
    mix = SizeMix.of(production_sizes(4000, seed=2))
    assert job_items(Allocation(), mix) == mix.mean
    assert job_items(Allocation(batch=64), mix) < 64
    spec = dlrm(rows=60_000, pooling=40)
    wide = NO_TLB.evaluate(spec, CPU, Allocation(workers=16, batch=1024, zipf_s=1.0), mix)
    narrow = NO_TLB.evaluate(spec, CPU, Allocation(workers=16, batch=64, zipf_s=1.0), mix)
    assert wide.details["llc_miss"] > narrow.details["llc_miss"]
