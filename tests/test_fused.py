"""Table-batched embeddings (zoo/fused.py): the fused sparse part scores exactly as the per-table one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recserve.specs import catalogue_models
from recserve.zoo import build, sample_batch
from recserve.zoo.fused import FusedModel, FusedTables, fusable

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

# one of each family, a 100-table model, and widths that differ between tables (sdm-m1: 51 and 69)
MODELS = ["hera-dlrm-a", "hera-ncf", "hera-din", "hera-dien", "hera-wnd", "hercules-mtwnd", "hercules-rmc2",
          "sdm-m1"]


@pytest.mark.parametrize("name", MODELS)
def test_fused_scores_equal_per_table_scores(name):
    model = build(catalogue_models()[name], scale=1e-4)
    fused = FusedModel(model)
    for size in (1, 3, 37):
        batch = sample_batch(model, size, rng=size)
        with torch.inference_mode():
            torch.testing.assert_close(fused(batch), model(batch), rtol=0, atol=0)


def test_every_table_width_gets_one_weight_and_ids_land_in_their_own_table():
    model = build(catalogue_models()["sdm-m1"], scale=1e-4)
    fused = FusedTables(model)
    assert fused.widths == sorted({t.dim for t in model.tables})
    for g, width in enumerate(fused.widths):
        members = [t for t in model.tables if t.dim == width]
        assert fused.weight(g).shape == (sum(t.num_rows for t in members), width)
    batch = sample_batch(model, 5, rng=1)
    with torch.inference_mode():
        for t, (got, want) in enumerate(zip(fused(batch), model.sparse(batch), strict=True)):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"table {t}")


def test_a_model_with_a_table_that_is_not_in_memory_is_not_fused():
    model = build(catalogue_models()["hera-ncf"], scale=1e-4)
    assert fusable(model)

    class Elsewhere(torch.nn.Module):  # an SSD-tier or sharded table: rows not in one tensor
        num_rows, dim = model.rows[0], model.tables[0].dim

    model.tables[0] = Elsewhere()
    assert not fusable(model)
    with pytest.raises(ValueError, match="DramTable"):
        FusedTables(model)
    assert not fusable(object())


def test_to_device_leaves_the_per_table_copies_where_they_were():
    model = build(catalogue_models()["hera-ncf"], scale=1e-4)
    fused = FusedModel(model).to_device(torch.device("meta"))
    assert fused.sparse.weight(0).device.type == "meta"
    assert all(t.weight.device.type == "cpu" for t in model.tables)


# ---- fused in place: what a node's CPU workers run (RecModel.fuse_tables, issue #14) -------------------------------

@pytest.mark.parametrize("name", ["hercules-rmc1", "hera-din", "hercules-mtwnd", "sdm-m1"])
def test_a_model_fused_in_place_scores_exactly_as_before_on_both_paths(name):
    plain = build(catalogue_models()[name], scale=1e-4)
    model = build(catalogue_models()[name], scale=1e-4)
    model.fuse_tables()
    # rmc1 and mtwnd take the one-width, all-pooled lookup (``_one_group_lookup``); din (sequences), sdm-m1 do not
    assert model.fused._one_pooled_group == (name in ("hercules-rmc1", "hercules-mtwnd"))
    for size in (1, 37, 260):  # rmc1 at 260: each table's ids shifted on its own (``SHIFT_BY_TABLE_IDS``)
        batch = sample_batch(plain, size, rng=size)
        with torch.inference_mode():
            torch.testing.assert_close(model(batch), plain(batch), rtol=0, atol=0)
            sparse = model.sparse(batch)  # the pipeline's sparse stage reads the fused lookup too
            model_fused, model.fused = model.fused, None  # the per-table path over the moved rows
            for got, want in zip(sparse, model.sparse(batch), strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
            model.fused = model_fused


def test_ids_shifted_table_by_table_are_the_rows_the_repeat_gives(monkeypatch):
    """Both ways of turning a query's ids into rows of the fused weight agree, for int32 and int64 ids, and a shift
    past int32 does not wrap."""
    from recserve.zoo import fused as fused_module

    model = build(catalogue_models()["hercules-rmc1"], scale=1e-4)
    model.fuse_tables()
    batch = sample_batch(model, 30, rng=4)
    for dtype in (np.int32, np.int64):
        values, lengths = batch.values.numpy().astype(dtype), batch.lengths.numpy()
        monkeypatch.setattr(fused_module, "SHIFT_BY_TABLE_IDS", 0)
        by_table = model.fused._one_group_lookup(values, lengths)
        monkeypatch.setattr(fused_module, "SHIFT_BY_TABLE_IDS", 10**12)
        repeated = model.fused._one_group_lookup(values, lengths)
        for got, want in zip(by_table, repeated, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    counts = np.zeros(model.fused.num_tables, np.int64)
    counts[1] = 1
    first = int(model.fused.first_row[1])
    monkeypatch.setattr(fused_module, "SHIFT_BY_TABLE_IDS", 0)
    ids = fused_module.shifted(np.array([2**31 - 1], np.int32), counts, model.fused.first_row.numpy())
    assert ids[0] == 2**31 - 1 + first


def test_fusing_in_place_moves_the_rows_so_the_tables_are_held_once():
    model = build(catalogue_models()["sdm-m1"], scale=1e-4)  # two widths
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse_tables()
    fused = model.fused
    storages = {fused.weight(g).untyped_storage().data_ptr() for g in range(len(fused.widths))}
    for t, table in enumerate(model.tables):
        assert table.weight.untyped_storage().data_ptr() in storages, f"table {t} is a copy"
        assert not table.weight.requires_grad
    held = sum(t.weight.numel() for t in model.tables)
    assert sum(fused.weight(g).numel() for g in range(len(fused.widths))) == held
    after = model.state_dict()  # what is saved is unchanged: the fused weights are not persistent buffers
    assert after.keys() == before.keys()
    for key, value in before.items():
        torch.testing.assert_close(after[key], value, rtol=0, atol=0)


def test_a_fused_model_shared_with_another_process_keeps_one_copy_of_the_rows():
    import multiprocessing as mp

    model = build(catalogue_models()["hera-dlrm-a"], scale=1e-4)
    model.fuse_tables()
    model.share_memory()
    assert all(t.weight.is_shared() for t in model.tables) and model.fused.weight(0).is_shared()
    batch = sample_batch(model, 9, rng=3)
    with torch.inference_mode():
        want = model(batch)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_score_in_child, args=(child, model, batch))
    proc.start()
    try:
        got, aliased = parent.recv()
    finally:
        proc.join(60)
    assert aliased, "the child's tables are no longer views of its fused weights"
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=0, atol=0)


def _score_in_child(conn, model, batch) -> None:
    with torch.inference_mode():
        scores = model(batch)
    ptr = model.fused.weight(0).untyped_storage().data_ptr()
    conn.send((scores.numpy(), all(t.weight.untyped_storage().data_ptr() == ptr for t in model.tables)))


def test_replacing_a_table_drops_the_fused_lookup_and_fused_model_takes_it_over():
    model = build(catalogue_models()["hera-ncf"], scale=1e-4)
    model.fuse_tables()
    wrapped = FusedModel(model)  # an accelerator worker's wrapper reuses the rows (no second copy) ...
    assert model.fused is None and wrapped.sparse.weight(0).untyped_storage().data_ptr() == \
        model.tables[0].weight.untyped_storage().data_ptr()
    model.fuse_tables()
    model.replace_table(0, model.tables[0])  # ... and a table backed elsewhere means the fused rows are stale
    assert model.fused is None


def test_host_and_device_id_shifts_agree():
    model = build(catalogue_models()["sdm-m1"], scale=1e-4)
    fused = FusedTables(model)
    batch = sample_batch(model, 13, rng=5)
    lens = batch.lengths.to(torch.int64)
    host = fused.group_ids(batch.values, lens)
    owner = torch.repeat_interleave(torch.arange(lens.shape[0]), lens.sum(dim=1))  # the device path's formula
    device = fused.split_groups(batch.values.to(torch.int64) + fused.first_row[owner], lens)
    for got, want in zip(host, device, strict=True):
        assert torch.equal(got, want)


def test_a_query_with_many_ids_a_table_takes_the_per_table_path_over_the_same_rows(monkeypatch):
    import recserve.zoo.fused as fused_module

    plain = build(catalogue_models()["hercules-rmc1"], scale=1e-4)
    model = build(catalogue_models()["hercules-rmc1"], scale=1e-4)
    model.fuse_tables()
    batch = sample_batch(plain, 37, rng=2)
    assert model.fused.takes(batch)  # ~3 k ids a table: fused
    monkeypatch.setattr(fused_module, "HOST_FUSED_IDS_PER_TABLE", 50)
    assert not model.fused.takes(batch)
    monkeypatch.setattr(FusedTables, "forward", lambda *_: pytest.fail("a fused pass for a query past the limit"))
    with torch.inference_mode():
        torch.testing.assert_close(model(batch), plain(batch), rtol=0, atol=0)
