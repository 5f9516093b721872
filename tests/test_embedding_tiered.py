"""SSD-tiered tables: bit-exact lookups, file integrity at open, I/O errors during serving, caches."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from recserve.embedding.blockio import BlockReader, TableIOError, io_uring_available
from recserve.embedding.row_index import NativeIndex, available
from recserve.embedding.rowcache import DictIndex, PooledCache, RowCache, bag_keys
from recserve.embedding.tablefile import (
    TableFileError,
    decode_rows,
    dequantized_weight,
    quantize_rowwise,
    read_header,
    stride_for,
    write_table,
)
from recserve.embedding.tiered import TieredTable, TierResources, tier_model, tier_stats
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.zoo import DramTable, build, sample_batch

ENGINES = ["threads"] + (["io_uring"] if io_uring_available() else [])

NEEDS_NATIVE = pytest.mark.skipif(not available()[0], reason="the native row index is not usable here")


def small_spec(dim: int = 16) -> ModelSpec:
    tables = (
        TableSpec("u0", 3000, dim, pooling=8, side="user"),
        TableSpec("u1", 2000, dim, pooling=5, side="user"),
        TableSpec("i0", 500, dim, pooling=2, side="item"),
    )
    return ModelSpec("sdm-test", "dlrm", 8, tables, "dot", SLA(50.0), bottom_mlp=(32, dim), top_mlp=(16, 1))


def random_bags(rows: int, batch: int, rng: np.random.Generator, max_len: int = 12):
    lengths = rng.integers(0, max_len + 1, size=batch)
    idx = torch.from_numpy(rng.integers(0, rows, size=int(lengths.sum())))
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
    return idx, offsets


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dim", [16, 40, 200])
def test_fp32_tiered_equals_dram_bit_for_bit(disk_dir, engine, dim):
    torch.manual_seed(0)
    dram = DramTable(1500, dim)
    path = os.path.join(disk_dir, "t.tbl")
    write_table(path, dram.weight, "fp32")
    res = TierResources(RowCache(64 * 1024, dim * 4, "clock"), engine=engine, max_outstanding=8)
    tiered = TieredTable(path, res)
    rng = np.random.default_rng(1)
    for _ in range(4):  # later rounds are served partly from the row cache
        idx, offsets = random_bags(1500, 32, rng)
        assert torch.equal(tiered.pool(idx, offsets), dram.pool(idx, offsets))
        assert torch.equal(tiered.gather(idx), dram.gather(idx))
    assert tiered.stats.hits > 0 and tiered.stats.misses > 0
    assert tiered.reader.engine == engine
    assert tiered.stats.read_amplification >= 1.0
    tiered.close()


@pytest.mark.parametrize("dim", [8, 64, 600])
def test_int8_tiered_equals_dequantised_dram(disk_dir, dim):
    torch.manual_seed(1)
    dram = DramTable(700, dim)
    path = os.path.join(disk_dir, "q.tbl")
    write_table(path, dram.weight, "int8")
    ref = DramTable(700, dim)
    ref.bag.weight.data = dequantized_weight(dram.weight)
    tiered = TieredTable(path, TierResources(RowCache(16 * 1024, dim + 8)))
    rng = np.random.default_rng(2)
    for _ in range(3):
        idx, offsets = random_bags(700, 16, rng)
        assert torch.equal(tiered.pool(idx, offsets), ref.pool(idx, offsets))
    # the dequantised table is close to the original (per-row step (max-min)/255)
    step = (dram.weight.max(1).values - dram.weight.min(1).values) / 255
    assert bool(((ref.weight - dram.weight).abs() <= step[:, None] / 2 + 1e-6).all())
    tiered.close()


def test_quantize_matches_fbgemm_fused_rowwise():
    w = torch.randn(50, 24)
    fused = torch.ops.quantized.embedding_bag_byte_prepack(w).numpy()
    ours = quantize_rowwise(w.numpy())
    assert np.array_equal(ours, fused)
    assert torch.allclose(decode_rows(ours, 24, "int8"), w, atol=float((w.max() - w.min()) / 255))


def test_stride_keeps_rows_inside_one_block():
    for row in (8, 40, 72, 128, 300, 512, 513, 2056):
        s = stride_for(row, 512)
        assert s >= row
        assert (512 % s == 0) if s <= 512 else (s % 512 == 0)


def test_corrupt_table_detected_at_open(disk_dir):
    path = os.path.join(disk_dir, "c.tbl")
    write_table(path, torch.randn(4000, 32), "fp32", block_bytes=64 * 1024)
    with open(path, "r+b") as f:  # flip one byte in the middle of the data
        f.seek(4096 + 300_000)
        byte = f.read(1)
        f.seek(4096 + 300_000)
        f.write(bytes([byte[0] ^ 0x5A]))
    with pytest.raises(TableFileError, match="checksum mismatch in block 4"):
        TieredTable(path, TierResources(None))


def test_truncated_or_foreign_table_detected_at_open(disk_dir):
    path = os.path.join(disk_dir, "tr.tbl")
    write_table(path, torch.randn(1000, 16), "fp32")
    size = os.path.getsize(path)
    os.truncate(path, size - 4096)
    with pytest.raises(TableFileError, match="truncated"):
        TieredTable(path, TierResources(None))
    bad = os.path.join(disk_dir, "bad.tbl")
    with open(bad, "wb") as f:
        f.write(b"x" * 8192)
    with pytest.raises(TableFileError, match="not a recserve table file"):
        read_header(bad)
    with open(path, "r+b") as f:  # a corrupt header field is caught by the header CRC
        f.seek(20)
        f.write(b"\x07")
    with pytest.raises(TableFileError, match="header checksum"):
        read_header(path)


@pytest.mark.parametrize("engine", ENGINES)
def test_truncated_after_open_fails_the_query(disk_dir, engine):
    torch.manual_seed(3)
    dram = DramTable(5000, 32)
    path = os.path.join(disk_dir, "late.tbl")
    write_table(path, dram.weight)
    tiered = TieredTable(path, TierResources(RowCache(4096, 128), engine=engine))
    os.truncate(path, 4096 + 1000 * 128)  # rows ≥ ~1000 are gone after open
    idx = torch.tensor([5, 4000, 17], dtype=torch.int64)
    with pytest.raises(TableIOError, match="short read"):
        tiered.pool(idx, torch.tensor([0, 2]))
    # rows still present keep working, and nothing wrong was cached by the failed query
    ok = torch.tensor([5, 17])
    assert torch.equal(tiered.pool(ok, torch.tensor([0])), dram.pool(ok, torch.tensor([0])))
    tiered.close()


class FailingReader(BlockReader):
    """Injects an EIO on the n-th read."""

    fail_on = 2

    def read(self, offsets):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == self.fail_on:
            raise TableIOError(5, "injected EIO")
        return super().read(offsets)


def test_io_error_fails_query_in_a_served_model(disk_dir):
    spec = small_spec()
    model = build(spec, scale=1.0)
    ref = copy.deepcopy(model)
    tier_model(model, [0, 1], disk_dir, cache_bytes=0)
    table = model.tables[0]
    table.reader = FailingReader(table.path, table.window, "threads", 4)
    batch = sample_batch(model, 8, rng=5)
    with torch.no_grad():
        assert torch.equal(model(batch), ref(batch))  # read 1 fine
        with pytest.raises(TableIOError, match="injected"):
            model(batch)
        assert torch.equal(model(batch), ref(batch))  # the error did not poison anything


def test_tier_model_scores_equal_dram_model(disk_dir):
    spec = small_spec(dim=16)
    model = build(spec, scale=1.0)
    ref = copy.deepcopy(model)
    res = tier_model(model, {0: {}, 1: {"cache": False}}, disk_dir, cache_bytes=32 * 1024,
                     pooled_cache_bytes=0)
    assert isinstance(model.tables[0], TieredTable) and isinstance(model.tables[2], DramTable)
    assert not model.tables[1].use_cache
    with torch.no_grad():
        for seed in range(3):
            batch = sample_batch(model, 16, rng=seed)
            assert torch.equal(model(batch), ref(batch))
    stats = tier_stats(model)
    assert stats.misses > 0 and res.row_cache is not None and res.row_cache.hits == model.tables[0].stats.hits


def test_pooled_cache_hits_permuted_bags(disk_dir):
    torch.manual_seed(4)
    dram = DramTable(300, 8)
    path = os.path.join(disk_dir, "p.tbl")
    write_table(path, dram.weight)
    pooled = PooledCache(1 << 20, min_len=3)
    tiered = TieredTable(path, TierResources(RowCache(8192, 32), pooled))
    idx = torch.tensor([1, 2, 3, 4, 9, 9, 7], dtype=torch.int64)
    offsets = torch.tensor([0, 2, 4])  # bags: [1,2] (too short), [3,4], [9,9,7]
    first = tiered.pool(idx, offsets)
    assert torch.equal(first, dram.pool(idx, offsets))
    again = tiered.pool(torch.tensor([7, 9, 9]), torch.tensor([0]))  # same multiset, other order
    assert pooled.hits == 1
    assert torch.allclose(again, dram.pool(torch.tensor([7, 9, 9]), torch.tensor([0])), atol=1e-6)
    tiered.pool(torch.tensor([7, 9]), torch.tensor([0]))  # a sub-multiset is a different key
    assert pooled.hits == 1


def test_bag_keys_order_invariant_and_multiset_sensitive():
    hi1, lo1 = bag_keys(np.array([5, 9, 9, 2]), np.array([0]), 0)
    hi2, lo2 = bag_keys(np.array([9, 2, 9, 5]), np.array([0]), 0)
    hi3, lo3 = bag_keys(np.array([5, 9, 2]), np.array([0]), 0)
    hi4, _ = bag_keys(np.array([5, 9, 9, 2]), np.array([0]), 1)
    assert (hi1[0], lo1[0]) == (hi2[0], lo2[0])
    assert (hi1[0], lo1[0]) != (hi3[0], lo3[0])
    assert hi1[0] != hi4[0]


@pytest.mark.parametrize("index_cls", [pytest.param(NativeIndex, marks=NEEDS_NATIVE), DictIndex])
def test_key_index_matches_a_dict(index_cls):
    rng = np.random.default_rng(0)
    index, truth = index_cls(500), {}
    for _ in range(60):
        live = np.fromiter(truth, dtype=np.int64, count=len(truth))
        drop = rng.choice(live, size=min(live.size, 40), replace=False) if live.size else live
        index.remove(drop)
        for k in drop:
            del truth[int(k)]
        new = np.setdiff1d(np.unique(rng.integers(0, 10_000, 60)), np.fromiter(truth, np.int64, len(truth)))
        vals = rng.integers(0, 1000, new.size).astype(np.int32)
        index.insert(new, vals)
        truth.update(zip(new.tolist(), vals.tolist(), strict=True))
        probe = rng.integers(0, 10_000, 300)
        expect = np.array([truth.get(int(k), -1) for k in probe])
        assert np.array_equal(index.find(probe), expect)


@pytest.mark.parametrize("index", ["dict", pytest.param("native", marks=NEEDS_NATIVE)])
@pytest.mark.parametrize("policy", ["lru", "clock", "lfu"])
def test_row_cache_policies_keep_hot_rows(policy, index):
    cache = RowCache(capacity_bytes=100 * 16, slot_bytes=16, policy=policy, index=index)
    rng = np.random.default_rng(0)
    hot = np.arange(50)
    for step in range(200):
        keys = np.unique(np.concatenate([rng.choice(hot, 20), rng.integers(1000, 100_000, 20)]))
        slots = cache.lookup(keys)
        hit = slots >= 0  # check before inserting: an insert may evict a row this batch just hit
        assert np.array_equal(cache.data[slots[hit], 0], (keys[hit] % 251).astype(np.uint8))
        miss = keys[~hit]
        cache.insert(miss, np.repeat((miss % 251).astype(np.uint8)[:, None], 16, axis=1))
        if step == 100:
            cache.reset_stats()
    assert cache.filled == 100
    hot_hits = cache.lookup(hot) >= 0
    assert hot_hits.mean() > 0.6, f"{policy} kept only {hot_hits.mean():.0%} of the hot set"


def test_tiered_model_pickles_to_a_worker_and_reopens(disk_dir):
    import pickle

    spec = small_spec()
    model = build(spec, scale=1.0)
    ref = copy.deepcopy(model)
    tier_model(model, [0, 1], disk_dir, cache_bytes=16 * 1024)
    batch = sample_batch(model, 4, rng=9)
    with torch.no_grad():
        model(batch)
        clone = pickle.loads(pickle.dumps(model))
        assert clone.tables[0].reader is not model.tables[0].reader
        assert clone.tables[0].resources.row_cache is clone.tables[1].resources.row_cache  # still one shared cache
        assert torch.equal(clone(batch), ref(batch))


def test_tier_from_config_sides_names_and_errors(disk_dir):
    from recserve.embedding.tiered import tier_from_config
    from recserve.errors import SpecError

    spec = small_spec()
    model = build(spec, scale=1.0)
    ref = copy.deepcopy(model)
    res = tier_from_config(model, {"dir": disk_dir, "tables": "user", "cache_mb": 0.05, "dtype": "fp32",
                                   "no_cache": ["u1"]})
    assert [isinstance(t, TieredTable) for t in model.tables] == [True, True, False]
    assert model.tables[0].use_cache and not model.tables[1].use_cache and res.row_cache is not None
    batch = sample_batch(model, 8, rng=3)
    with torch.no_grad():
        assert torch.equal(model(batch), ref(batch))
    with pytest.raises(SpecError, match="cache: unknown field"):
        tier_from_config(build(spec, scale=1.0), {"dir": disk_dir, "cache": 1})
    with pytest.raises(SpecError, match="unknown table"):
        tier_from_config(build(spec, scale=1.0), {"dir": disk_dir, "tables": ["nope"]})
    with pytest.raises(SpecError, match="'dir'"):
        tier_from_config(build(spec, scale=1.0), {"tables": "user"})


def test_prefetch_reads_all_tables_and_keeps_results_exact(disk_dir):
    spec = small_spec()
    model = build(spec, scale=1.0)
    ref = copy.deepcopy(model)
    tier_model(model, [0, 1, 2], disk_dir, cache_bytes=0, prefetch=True)
    expected = 0
    with torch.no_grad():
        for seed in range(3):
            batch = sample_batch(model, 8, rng=seed)
            assert torch.equal(model(batch), ref(batch))
            expected += sum(int(np.unique(idx.numpy()).size) for idx, _ in batch.tables())
    # staged rows were consumed by pool: each distinct id fetched once per batch, not again by pool
    stats = tier_stats(model)
    assert stats.lookups == expected and stats.ios > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_file_truncated_while_serving_fails_the_query_through_prefetch(disk_dir, engine):
    spec = small_spec()
    model = build(spec, scale=1.0)
    ref = copy.deepcopy(model)
    tier_model(model, [0, 1, 2], disk_dir, cache_bytes=0, engine=engine)
    batch = sample_batch(model, 16, rng=4)
    with torch.no_grad():
        assert torch.equal(model(batch), ref(batch))
        os.truncate(model.tables[0].path, 4096 + 64 * 10)  # table 0 keeps only its first rows
        with pytest.raises(TableIOError, match="short read"):
            model(batch)


def test_pooled_cache_keys_differ_between_tables_without_row_cache(disk_dir):
    torch.manual_seed(6)
    a, b = DramTable(100, 8), DramTable(100, 8)
    write_table(os.path.join(disk_dir, "a.tbl"), a.weight)
    write_table(os.path.join(disk_dir, "b.tbl"), b.weight)
    res = TierResources(None, PooledCache(1 << 20, min_len=2))
    ta, tb = TieredTable(os.path.join(disk_dir, "a.tbl"), res), TieredTable(os.path.join(disk_dir, "b.tbl"), res)
    idx, offsets = torch.tensor([3, 4, 5]), torch.tensor([0])
    assert torch.equal(ta.pool(idx, offsets), a.pool(idx, offsets))
    assert torch.equal(tb.pool(idx, offsets), b.pool(idx, offsets))  # same ids, other table: no false hit
    assert res.pooled.hits == 0


def test_o_direct_refused_falls_back_logged_and_exact(disk_dir, monkeypatch, caplog):
    """A file system that refuses O_DIRECT (older tmpfs, some overlays; this kernel's tmpfs accepts it) is
    simulated by an os.open that fails with EINVAL for O_DIRECT."""
    import errno

    from recserve.embedding import blockio

    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    torch.manual_seed(7)
    dram = DramTable(300, 16)
    path = os.path.join(disk_dir, "t.tbl")
    write_table(path, dram.weight)
    monkeypatch.setattr(blockio.os, "open", refusing_open)
    with caplog.at_level("WARNING", logger="recserve.embedding"):
        tiered = TieredTable(path, TierResources(RowCache(4096, 64)))
    assert tiered.reader.mode == "buffered+fadvise"
    assert "O_DIRECT refused" in caplog.text and "falling back to buffered pread" in caplog.text
    idx, offsets = torch.tensor([1, 299, 5, 1]), torch.tensor([0, 2])
    assert torch.equal(tiered.pool(idx, offsets), dram.pool(idx, offsets))
    tiered.close()


def test_buffered_mode_on_request(disk_dir):
    dram = DramTable(200, 8)
    path = os.path.join(disk_dir, "b.tbl")
    write_table(path, dram.weight)
    tiered = TieredTable(path, TierResources(None, direct=False))
    assert tiered.reader.mode == "buffered+fadvise" and not tiered.use_cache
    idx, offsets = torch.tensor([0, 199, 7]), torch.tensor([0])
    assert torch.equal(tiered.pool(idx, offsets), dram.pool(idx, offsets))
    tiered.close()
