"""CoAff_DRAM (Hera Alg. 1 line 13) reads each model's bandwidth at the configuration that serves its load.

A capacity-bound model (DLRM(B)-like: 26 GB per worker) whose profile has a zero row at a worker count the
footprint table still admits (the perfmodel keeps 10 % of DRAM free, a real host OOMs) serves its max load
with fewer workers; its MemBW at half the cores is the bandwidth of those workers, not the 0 GB/s of the
zero row.
"""

from __future__ import annotations

import pytest

from recserve.planners.hera import affinity_matrix, all_curves, pair_allocation
from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import ServerType

NODE = ServerType(name="test-node", cores=16, mem_gb=192, mem_bw_gbs=128, llc_mb=22, llc_ways=11)


def _model(profiles: ProfileSet, name: str, qps: list[float], gbs: list[float], gb_per_worker: float) -> None:
    w = range(1, NODE.cores + 1)
    profiles.add(ProfileTable(name, NODE.name, "maxload_vs_workers", ("workers", "max_qps"),
                              [[float(i), q] for i, q in zip(w, qps, strict=True)], source="modelled"))
    profiles.add(ProfileTable(name, NODE.name, "membw_vs_workers", ("workers", "gbs"),
                              [[float(i), g] for i, g in zip(w, gbs, strict=True)], source="modelled"))
    profiles.add(ProfileTable(name, NODE.name, "footprint", ("workers", "mem_gb"),
                              [[float(i), gb_per_worker * i] for i in w], source="modelled"))
    profiles.add(ProfileTable(name, NODE.name, "maxload_vs_ways", ("ways", "max_qps"),
                              [[1.0, 1.0], [11.0, 1.0]], source="modelled"))


@pytest.fixture(scope="module")
def curves():
    profiles = ProfileSet()
    # capacity-bound: 25.9 GB/worker fits 7 workers in 192 GB, but the profile serves nothing with 7 (as the
    # perfmodel's hera-dlrm-b on hera-xeon: 0.9 x 192 GB usable -> 6 workers)
    big_q = [10.0 * i if i <= 6 else 0.0 for i in range(1, 17)]
    big_bw = [9.0 * i if i <= 6 else 0.0 for i in range(1, 17)]
    _model(profiles, "big", big_q, big_bw, 25.9)
    # bandwidth-hungry, scalable: 9 GB/s per worker
    _model(profiles, "wide", [20.0 * i for i in range(1, 17)], [9.0 * i for i in range(1, 17)], 2.0)
    return all_curves(profiles, ["big", "wide"], NODE)


def test_membw_at_half_cores_is_that_of_the_workers_serving_the_load(curves):
    big = curves[0]
    assert big.feasible_workers == 7
    assert big.qps[8] == pytest.approx(60.0)     # best with <= 8 workers: 6 workers
    assert big.membw[8] == pytest.approx(54.0)   # ... which draw 6 x 9 GB/s (old code: 0, the 7-worker row)
    assert big.membw[5] == pytest.approx(45.0)


def test_dram_affinity_counts_the_capacity_bound_models_bandwidth(curves):
    dram = affinity_matrix(curves, NODE)["dram"]
    assert dram[0, 1] == pytest.approx(1.0)  # 54 + 72 = 126 GB/s of 128
    slim = ServerType(name="test-node", cores=16, mem_gb=192, mem_bw_gbs=100, llc_mb=22, llc_ways=11)
    dram = affinity_matrix(curves, slim)["dram"]
    assert dram[0, 1] == pytest.approx(100.0 / (54.0 + 72.0))
    assert dram[0, 0] == pytest.approx(min(1.0, 100.0 / 108.0))


def test_pair_allocation_unchanged_for_served_worker_counts(curves):
    plan = pair_allocation(curves[0], curves[1], NODE)
    workers = {p.model: p.workers for p in plan.placements}
    assert workers["big"] == 6
    assert workers["wide"] == 10
