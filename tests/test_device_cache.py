"""Hot rows of the fused tables cached on the device, the rest on the host (zoo/device_cache.py, issue #16).

Everything runs with device ``cpu``: the cache's "device" weights are then host tensors, and every step of the
path (remap, gather into the spare region, refresh, the fused lookup) is the one a GPU runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recserve.errors import SpecError
from recserve.serving import build_worker_model, config_from_dict
from recserve.serving.worker.accel import device_runner
from recserve.specs import catalogue_models
from recserve.workload.indices import ZipfSampler
from recserve.zoo import build, device_cache, sample_batch
from recserve.zoo.device_cache import CachedModel, DeviceTableCache
from recserve.zoo.fused import FusedModel
from tests.support.nodes import started
from tests.support.scrape import metric_value, scrape

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

# every fusable family: DLRM, NCF, DIN and DIEN (sequence tables), WnD, MT-WnD, 100 tables, two widths (sdm-m1)
MODELS = ["hera-dlrm-a", "hera-ncf", "hera-din", "hera-dien", "hera-wnd", "hercules-mtwnd", "hercules-rmc2",
          "sdm-m1"]


def table_bytes(model) -> int:
    return sum(t.weight.numel() * t.weight.element_size() for t in model.tables)


def scores(cached: CachedModel, batch) -> torch.Tensor:
    return torch.from_numpy(cached.run((batch.dense.numpy(), batch.values.numpy(), batch.lengths.numpy())))


def consistent(cache: DeviceTableCache) -> None:
    """The remap and the slots agree, and every cached slot holds its row."""
    for g, slot_row in enumerate(cache.slot_row):
        used = np.flatnonzero(slot_row >= 0)
        np.testing.assert_array_equal(cache.remap[slot_row[used]], used)
        rows = torch.from_numpy(slot_row[used] - cache.base[g])
        torch.testing.assert_close(cache.weights[g][torch.from_numpy(used)], cache.host[g][rows], rtol=0, atol=0)
    assert (cache.remap >= 0).sum() == sum((s >= 0).sum() for s in cache.slot_row)


@pytest.mark.parametrize("name", MODELS)
def test_cached_scores_equal_the_model_exactly_at_every_budget(name):
    model = build(catalogue_models()[name], scale=1e-4).eval()
    fused = FusedModel(model)
    for share in (0.0, 0.2, 2.0):  # everything from the host, a fifth cached, whole tables
        cached = CachedModel(model, "cpu", share * table_bytes(model), count_stride=1, refresh_ids=256)
        for i, size in enumerate((1, 3, 37, 37, 64)):  # refreshes happen between these passes
            batch = sample_batch(model, size, rng=100 + i)
            with torch.inference_mode():
                got = scores(cached, batch)
                torch.testing.assert_close(got, fused(batch), rtol=0, atol=0)
                torch.testing.assert_close(got, model(batch), rtol=0, atol=0)
        consistent(cached.cache)
        assert cached.cache.refreshes > 0 if share < 1 else cached.cache.refreshes == 0


@pytest.mark.parametrize("per_table_ids", [1, 10**9], ids=["remap-per-table", "remap-global-ids"])
@pytest.mark.parametrize("mark_scan", [10**9, 0], ids=["dedup-mark", "dedup-positions"])
def test_every_path_gathers_each_missed_row_once_and_restores_the_remap(monkeypatch, per_table_ids, mark_scan):
    monkeypatch.setattr(device_cache, "PER_TABLE_IDS", per_table_ids)
    monkeypatch.setattr(device_cache, "MARK_SCAN", mark_scan)
    model = build(catalogue_models()["sdm-m1"], scale=1e-4).eval()  # 91 tables, two widths: two groups
    for share in (0.0, 0.2):  # every id missed, or a fifth of the rows cached
        cached = CachedModel(model, "cpu", share * table_bytes(model), count_stride=101, refresh_ids=10**9)
        cache = cached.cache
        batch = sample_batch(model, 47, rng=7)  # tables start off multiples of the stride
        batch.values[:] = 1000 + batch.values % 64  # beyond the prefix cached: repeats within a table and across
        batch.values[::3] = 1  # in the prefix: a hit at 20 %
        values, lengths = batch.values.numpy(), batch.lengths.numpy()
        ids = cache._global_ids(values, lengths)
        remap, counts = cache.remap.copy(), cache.counts.copy()
        with torch.inference_mode():  # the tables' outputs themselves: sdm-m1's scores barely depend on them
            got, want = cache.sparse(batch.values, batch.lengths), model.sparse(batch)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        missed = ids[remap[ids] < 0]
        assert cache.gathered == len(np.unique(missed)) and cache.lookups == len(ids)
        assert cache.hits == len(ids) - len(missed) and (share == 0) == (cache.hits == 0)
        np.testing.assert_array_equal(cache.remap, remap)  # spare slots released: uncached rows read ~row again
        counted = counts.copy()
        counted[ids[::101]] += 1  # every 101st id counted, once a pass whatever its repeats
        np.testing.assert_array_equal(cache.counts, counted)
        consistent(cache)


def test_hit_rate_rises_on_a_zipf_trace_once_the_hot_rows_are_counted():
    model = build(catalogue_models()["hera-dlrm-a"], scale=1e-3).eval()  # 8 tables, 8,000 rows
    sampler = ZipfSampler(alpha=1.05)  # hot rows scattered over the ids, as in the catalogue's workloads
    cache = DeviceTableCache(model, "cpu", 0.1 * table_bytes(model), count_stride=1, refresh_ids=10**9)  # by hand

    def hit_rate(seed: int) -> float:
        lookups, hits = cache.lookups, cache.hits
        for i in range(8):
            batch = sample_batch(model, 16, rng=seed + i, sampler=sampler)
            cache.prepare(batch.values.numpy(), batch.lengths.numpy())
        return (cache.hits - hits) / (cache.lookups - lookups)

    before = hit_rate(0)  # a prefix of every table: about the budget's share of a scattered trace
    assert before < 0.2
    cache.refresh()
    after = hit_rate(1000)
    assert after > 2 * before and after > 0.4, (before, after)
    consistent(cache)
    copied = cache.refresh()  # the hot set barely moves: rows staying keep their slots, few are copied
    assert copied < 0.25 * sum(cache.capacity)
    consistent(cache)


def test_a_budget_smaller_than_one_groups_rows_caches_each_group_pro_rata():
    model = build(catalogue_models()["sdm-m1"], scale=1e-4).eval()  # widths 51 and 69: two groups
    cache = DeviceTableCache(model, "cpu", 0.05 * table_bytes(model))
    rows = [int(w.shape[0]) for w in cache.host]
    assert all(0 < c < r // 10 for c, r in zip(cache.capacity, rows, strict=True))
    assert cache.capacity[0] * 51 * 4 + cache.capacity[1] * 69 * 4 <= 0.05 * table_bytes(model)
    tiny = DeviceTableCache(model, "cpu", 100)  # less than one row of either width: nothing cached
    assert tiny.capacity == [0, 0]
    cached = CachedModel(model, "cpu", 100)
    batch = sample_batch(model, 8, rng=5)
    with torch.inference_mode():
        torch.testing.assert_close(scores(cached, batch), model(batch), rtol=0, atol=0)


def test_budget_zero_reads_every_row_from_the_host():
    model = build(catalogue_models()["hera-din"], scale=1e-4).eval()
    cached = CachedModel(model, "cpu", 0)
    batch = sample_batch(model, 32, rng=3)
    with torch.inference_mode():
        torch.testing.assert_close(scores(cached, batch), model(batch), rtol=0, atol=0)
    cache = cached.cache
    assert cache.capacity == [0] and cache.hits == 0 and cache.lookups == batch.values.numel()
    assert cache.gathered == len(np.unique(cache._global_ids(batch.values.numpy(), batch.lengths.numpy())))
    np.testing.assert_array_equal(cache.remap, ~np.arange(len(cache.remap)))  # spare slots released: ~row again


def test_a_budget_larger_than_the_tables_holds_them_whole_as_today():
    model = build(catalogue_models()["hera-wnd"], scale=1e-4).eval()
    cached = CachedModel(model, "cpu", 10 * table_bytes(model))
    cache = cached.cache
    assert cache.whole and cache.capacity == [int(cache.host[0].shape[0])]
    np.testing.assert_array_equal(cache.remap, np.arange(len(cache.remap)))
    batch = sample_batch(model, 16, rng=4)
    with torch.inference_mode():
        torch.testing.assert_close(scores(cached, batch), model(batch), rtol=0, atol=0)
    assert cache.hits == cache.lookups and cache.gathered == 0 and cache.spare == [1]
    assert cache.refresh() == 0 and not cache.counts.any()  # nothing counted: there is nothing to choose


def test_device_runner_takes_the_budget_on_cpu_and_refuses_a_model_it_cannot_cache():
    model = build(catalogue_models()["hera-ncf"], scale=1e-4).eval()
    batch = sample_batch(model, 20, rng=6)
    arrays = (batch.dense.numpy(), batch.values.numpy(), batch.lengths.numpy())
    with torch.inference_mode():
        want = model(batch).numpy()
        np.testing.assert_array_equal(device_runner(model, "cpu")(arrays), want)  # today's path, unfused
        np.testing.assert_array_equal(device_runner(model, "cpu", table_mb=0.001)(arrays), want)
    with pytest.raises(ValueError, match="device_table_mb"):
        device_runner(torch.nn.Linear(2, 1), "cpu", table_mb=1)


def test_device_table_mb_is_validated_naming_the_field():
    model = {"name": "ncf", "model": "hera-ncf", "scale": 1e-4}
    for bad in (-1, "64", True, float("nan"), [1]):
        with pytest.raises(SpecError, match="device_table_mb"):
            config_from_dict({"models": [{**model, "accelerator": {"device": "cpu", "device_table_mb": bad}}]})
    with pytest.raises(SpecError, match="device_table_mb.*table_backend"):
        config_from_dict({"models": [{**model, "table_backend": "ssd",
                                      "accelerator": {"device": "cpu", "device_table_mb": 1}}]})
    config = config_from_dict({"models": [{**model, "accelerator": {"device": "cpu", "device_table_mb": 0.5}}]})
    assert config.models[0].accelerator.device_table_mb == 0.5
    assert config_from_dict({"models": [{**model, "accelerator": {"device": "cpu"}}]}).models[0] \
        .accelerator.device_table_mb is None


def test_an_accelerator_worker_with_a_table_budget_serves_a_node_end_to_end():
    from tests.support.accel import ACCEL, MODEL, accel_state, accel_state_after, infer_many
    from tests.support.models import scores

    config = config_from_dict({"models": [{**MODEL, "accelerator": {**ACCEL, "device_table_mb": 0.004,
                                                                     "fuse_delay_us": 0}}]})
    with started(config) as server:
        port = server.ports.http
        model = build_worker_model(server.config.models[0]).eval()
        before = accel_state(port)
        batches = [sample_batch(model, size, rng=size) for size in (4, 64, 200, 200)]
        answers = infer_many(port, batches)
        for batch, (status, got) in zip(batches, answers, strict=True):
            assert status == 200
            np.testing.assert_allclose(got, scores(model, batch), rtol=1e-5, atol=1e-6)
        after = accel_state_after(port, before, len(batches))
        assert after["queries"]["accelerator"] - before["queries"]["accelerator"] == 3
        cache = after["device_cache"]  # the cache's counters reach /control and /metrics
        assert cache["budget_mb"] == 0.004 and 0 <= cache["hits"] <= cache["lookups"] and cache["lookups"] > 0
        counted = metric_value(scrape(port), "recserve_device_cache_lookups_total", model="ncf", version="1")
        assert counted is not None and counted >= cache["lookups"]  # later passes may have reported meanwhile
