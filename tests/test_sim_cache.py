"""Trace-driven SDM cache hit rates (sim/cache.py)."""

from __future__ import annotations

import pytest

from recserve.embedding.row_index import slot_overhead_bytes
from recserve.sim.cache import simulate_tier_hits
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.workload import zipf_alpha_for_locality, zipf_rank_cdf


def _spec(rows: int = 20_000, pooling: int = 20) -> ModelSpec:
    tables = (TableSpec("u0", rows, 16, pooling=pooling, side="user"),
              TableSpec("u1", rows, 16, pooling=pooling, side="user"),
              TableSpec("i0", 1000, 16, pooling=4, side="item"))
    return ModelSpec("sim-cache", "dlrm", 8, tables, "concat", SLA(50.0), bottom_mlp=(8,), top_mlp=(1,),
                     bytes_per_elem=1)


def test_hit_rate_grows_with_cache_and_stays_below_the_ideal_fill():
    spec = _spec()
    slot = 16 + slot_overhead_bytes("clock")  # the simulator's default policy
    rates = []
    for share in (0.02, 0.1, 0.4):
        r = simulate_tier_hits(spec, [0, 1], share * 40_000 * slot, queries=300, locality={"user": 0.9})
        assert abs(r.slots - share * 40_000) <= 1  # the bytes hold that many slots (to a rounding)
        rates.append(r.hit_rate)
        ideal = zipf_rank_cdf(20_000, zipf_alpha_for_locality(0.9, 20_000))[int(share * 20_000)]
        assert r.hit_rate <= ideal + 0.03      # no cache beats holding exactly the hottest rows
    assert 0.0 < rates[0] < rates[1] < rates[2]


def test_no_cache_no_hits_and_pooled_cache_catches_repeated_bags():
    spec = _spec()
    assert simulate_tier_hits(spec, [0], 0.0, queries=50).hit_rate == 0.0
    tiny = ModelSpec("tiny", "dlrm", 8, (TableSpec("u", 5, 4, pooling=4, side="user"),), "concat", SLA(50.0),
                     bottom_mlp=(8,), top_mlp=(1,), bytes_per_elem=1)
    r = simulate_tier_hits(tiny, [0], 1e6, queries=400, pooled_bytes=1e6, locality={"user": 0.95})
    assert r.pooled_hit_rate > 0.05          # a 5-row table repeats whole bags often
    assert r.queries == 400


def test_bad_input():
    with pytest.raises(Exception, match="no SM tables"):
        simulate_tier_hits(_spec(), [], 1e6)
