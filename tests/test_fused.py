"""Table-batched embeddings (zoo/fused.py): the fused sparse part scores exactly as the per-table one."""

from __future__ import annotations

import pytest
import torch

from recserve.specs import catalogue_models
from recserve.zoo import build, sample_batch
from recserve.zoo.fused import FusedModel, FusedTables, fusable

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
