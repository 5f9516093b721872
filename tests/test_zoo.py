"""Zoo models: every family builds, splits exactly into sparse + dense, and counts its FLOPs right."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recserve.errors import SpecError
from recserve.specs import ModelSpec, catalogue_models, model_from_dict
from recserve.zoo import FAMILY_CLASSES, build, sample_batch
from recserve.zoo.base import MLP
from recserve.zoo.flops import count_dense_flops, count_spec_flops, dense_flops_per_item
from recserve.zoo.layers import AUGRU, ActivationUnit, ScoreHead, candidate_tables

SLA = {"target_ms": 50}


def spec(name: str, **fields) -> ModelSpec:
    return model_from_dict(name, {"sla": SLA, **fields})


SPECS = {
    "dlrm": spec(
        "t-dlrm", family="dlrm", dense_in=5, bottom_mlp=[16, 8], top_mlp=[16, 1], interaction="dot",
        tables=[{"name": "e", "rows": 1000, "dim": 8, "pooling": 4, "repeat": 3}],
    ),
    "wnd": spec(
        "t-wnd", family="wnd", dense_in=6, top_mlp=[32, 16], interaction="concat",
        tables=[{"name": "e", "rows": 500, "dim": 8, "repeat": 4}],
    ),
    "mtwnd": spec(
        "t-mtwnd", family="mtwnd", dense_in=6, bottom_mlp=[8], top_mlp=[32, 16], towers=3, tower_mlp=[8, 1],
        interaction="concat", tables=[{"name": "e", "rows": 500, "dim": 8, "repeat": 3}],
    ),
    "ncf": spec(
        "t-ncf", family="ncf", dense_in=2, top_mlp=[32, 16, 8], interaction="concat",
        tables=[
            {"name": "user_mf", "rows": 300, "dim": 8, "side": "user"},
            {"name": "item_mf", "rows": 200, "dim": 8, "side": "item"},
            {"name": "user_mlp", "rows": 300, "dim": 8, "side": "user"},
            {"name": "item_mlp", "rows": 200, "dim": 8, "side": "item"},
        ],
    ),
    "din": spec(
        "t-din", family="din", dense_in=1, top_mlp=[24, 12, 2], attention_mlp=[16, 8], interaction="attention",
        tables=[
            {"name": "user", "rows": 300, "dim": 4, "side": "user"},
            {"name": "goods", "rows": 400, "dim": 8, "side": "item"},
            {"name": "history", "rows": 400, "dim": 8, "pooling": 12, "side": "user", "kind": "sequence"},
        ],
    ),
    "dien": spec(
        "t-dien", family="dien", dense_in=3, top_mlp=[24, 12, 2], gru_hidden=6, attention_mlp=[16, 8],
        interaction="gru",
        tables=[
            {"name": "user", "rows": 300, "dim": 4, "side": "user"},
            {"name": "goods", "rows": 400, "dim": 8, "side": "item"},
            {"name": "history", "rows": 400, "dim": 8, "pooling": 10, "side": "user", "kind": "sequence"},
        ],
    ),
}


def run(model, batch):
    with torch.no_grad():
        return model(batch), model.dense(batch.dense, model.sparse(batch))


def test_every_family_has_a_test_spec():
    assert set(SPECS) == set(FAMILY_CLASSES)


@pytest.mark.parametrize("family", sorted(SPECS))
@pytest.mark.parametrize("batch_size", [1, 7, 1024])
def test_family_scores_and_exact_split(family, batch_size):
    s = SPECS[family]
    model = build(s, scale=0.1)
    batch = sample_batch(model, batch_size, rng=batch_size)
    model.validate(batch)
    scores, split = run(model, batch)
    assert scores.shape == (batch_size, s.towers)
    assert scores.dtype == torch.float32
    assert bool(torch.isfinite(scores).all()) and bool(((scores > 0) & (scores < 1)).all())
    assert torch.equal(scores, split)


@pytest.mark.parametrize("family", sorted(SPECS))
def test_direct_mlp_passes_score_exactly_as_module_calls(family):
    """``direct_layers`` (what workers run) changes how the MLPs are called, never a score: bit-identical at
    batch 1 and 64; a hook on a layer (``zoo.flops``) makes that MLP run as modules again, and a dtype conversion
    is followed."""
    model = build(SPECS[family], scale=0.1).eval()
    batches = [sample_batch(model, n, rng=n) for n in (1, 64)]
    with torch.inference_mode():
        before = [model(b) for b in batches]
        model.direct_layers()
        mlps = [m for m in model.modules() if isinstance(m, MLP)]
        mlps = [m for m in mlps if len(m)]  # an empty stack (no bottom MLP) is the identity either way
        assert mlps and all(m._steps for m in mlps)
        assert all(torch.equal(model(b), want) for b, want in zip(batches, before, strict=True))
    seen = []
    handle = next(layer for layer in mlps[0] if isinstance(layer, nn.Linear)).register_forward_hook(
        lambda *args: seen.append(1))
    with torch.inference_mode():
        assert torch.equal(model(batches[0]), before[0]) and seen
    handle.remove()
    model.double()
    assert mlps[0]._steps[0][0].dtype == torch.float64


@pytest.mark.parametrize("family", sorted(SPECS))
def test_scores_do_not_depend_on_batch_neighbours(family):
    model = build(SPECS[family], scale=0.1)
    batch = sample_batch(model, 9, rng=5)
    with torch.no_grad():
        full = model(batch)
        parts = torch.cat([model(batch.slice(0, 1)), model(batch.slice(1, 9))])
    assert torch.allclose(full, parts, atol=1e-5)
    assert full.std() > 0  # different items get different scores


@pytest.mark.parametrize("family", sorted(SPECS))
def test_build_shrinks_rows_only(family):
    s = SPECS[family]
    small, full = build(s, scale=0.05), build(s, scale=1.0)
    assert small.rows == s.scaled_rows(0.05) and full.rows == tuple(t.rows for t in s.tables)
    dense_params = {k: v.shape for k, v in small.state_dict().items() if not k.startswith("tables.")}
    full_params = {k: v for k, v in full.state_dict().items() if not k.startswith("tables.")}
    assert dense_params == {k: v.shape for k, v in full_params.items()}
    assert all(torch.equal(small.state_dict()[k], v) for k, v in full_params.items())  # same dense weights
    assert [t.dim for t in small.tables] == [t.dim for t in s.tables]


def mlp_weights(s: ModelSpec) -> int:
    """Rough count of MLP weights (bottom chain + top chain over all embeddings), to skip giants."""
    widths = [s.dense_in, *s.bottom_mlp]
    top = [widths[-1] + sum(t.dim for t in s.tables), *s.top_mlp]
    chains = (widths, top)
    return sum(a * b for chain in chains for a, b in zip(chain[:-1], chain[1:], strict=True))


@pytest.mark.parametrize("name", sorted(catalogue_models()))
def test_catalogue_model_builds_and_splits_exactly(name):
    s = catalogue_models()[name]
    if mlp_weights(s) > 100_000_000:
        pytest.skip(f"{name}: about {mlp_weights(s) / 1e6:.0f}M MLP weights, too large to build in a unit test")
    model = build(s, scale=1e-9)
    assert all(r == 16 for r in model.rows)
    batch = sample_batch(model, 3, rng=1)
    scores, split = run(model, batch)
    assert scores.shape == (3, s.towers)
    assert bool(torch.isfinite(scores).all())
    assert torch.equal(scores, split)


# ---- family-specific behaviour ------------------------------------------------------------


def _replace_table_ids(batch, t: int, new_ids: torch.Tensor):
    starts = batch.table_offsets()
    values = batch.values.clone()
    values[int(starts[t]) : int(starts[t + 1])] = new_ids
    return type(batch)(batch.dense, values, batch.lengths)


@pytest.mark.parametrize("family", ["din", "dien"])
def test_history_and_candidate_both_change_the_score(family):
    model = build(SPECS[family], scale=1.0)
    batch = sample_batch(model, 4, rng=2)
    goods, history = 1, 2
    base, _ = run(model, batch)
    n_hist = int(batch.lengths[history].sum())
    other_history = _replace_table_ids(batch, history, torch.arange(n_hist) % model.rows[history])
    other_candidate = _replace_table_ids(batch, goods, (torch.arange(4) * 7 + 3) % model.rows[goods])
    assert not torch.allclose(base, run(model, other_history)[0])
    assert not torch.allclose(base, run(model, other_candidate)[0])


def test_din_attention_uses_the_matching_item_table_as_candidate():
    s = spec(
        "t-din2", family="din", dense_in=1, top_mlp=[8, 1], interaction="attention",
        tables=[
            {"name": "cate", "rows": 50, "dim": 4, "side": "item"},
            {"name": "goods", "rows": 50, "dim": 8, "side": "item"},
            {"name": "user", "rows": 50, "dim": 8, "side": "user"},
            {"name": "goods_hist", "rows": 50, "dim": 8, "pooling": 5, "kind": "sequence"},
            {"name": "cate_hist", "rows": 50, "dim": 4, "pooling": 5, "kind": "sequence"},
        ],
    )
    assert candidate_tables(s) == {3: 1, 4: 0}
    model = build(s, scale=1.0)
    scores, split = run(model, sample_batch(model, 5))
    assert scores.shape == (5, 1) and torch.equal(scores, split)


def test_din_candidate_prefers_the_history_id_space_then_the_largest_table():
    tables = [
        {"name": "category", "rows": 100, "dim": 8, "side": "item"},
        {"name": "item", "rows": 9000, "dim": 8, "side": "item"},
        {"name": "user", "rows": 50, "dim": 8, "side": "user"},
        {"name": "history", "rows": 9000, "dim": 8, "pooling": 5, "kind": "sequence"},
    ]
    fields = dict(family="din", dense_in=1, top_mlp=[8, 1], interaction="attention")
    assert candidate_tables(spec("a", **fields, tables=tables)) == {3: 1}
    tables[3] = {**tables[3], "rows": 10**6}  # history ids from a bigger space: take the largest item table
    assert candidate_tables(spec("b", **fields, tables=tables)) == {3: 1}
    tables[3] = {**tables[3], "rows": 100}  # same id space as category
    assert candidate_tables(spec("c", **fields, tables=tables)) == {3: 0}


def test_din_without_a_candidate_table_is_a_spec_error():
    s = spec(
        "t-bad", family="din", dense_in=1, top_mlp=[8, 1], interaction="attention",
        tables=[
            {"name": "goods", "rows": 50, "dim": 16, "side": "item"},
            {"name": "user", "rows": 50, "dim": 8, "side": "user"},
            {"name": "hist", "rows": 50, "dim": 8, "pooling": 5, "kind": "sequence"},
        ],
    )
    with pytest.raises(SpecError, match="hist.*candidate"):
        build(s)


def test_ncf_without_user_item_pair_is_a_spec_error():
    s = spec("t-ncf-bad", family="ncf", dense_in=1, top_mlp=[8], interaction="concat",
             tables=[{"name": "a", "rows": 10, "dim": 8, "side": "item", "repeat": 2}])
    with pytest.raises(SpecError, match="GMF"):
        build(s)


def test_ncf_gmf_is_the_product_of_the_user_and_item_embeddings():
    model = build(SPECS["ncf"], scale=1.0)
    batch = sample_batch(model, 6, rng=4)
    with torch.no_grad():
        pooled = model.sparse(batch)
        tower = model.tower(torch.cat([model.bottom(batch.dense), pooled[2], pooled[3]], dim=1))
        expected = torch.sigmoid(model.predict(torch.cat([pooled[0] * pooled[1], tower], dim=1)))
        assert torch.allclose(model(batch), expected, atol=1e-6)


def test_dot_interaction_is_every_pair_dot_product_once_in_row_major_order():
    from recserve.zoo.dlrm import DotInteraction

    feats = torch.randn(3, 4, 5)
    want = torch.stack([(feats[:, i] * feats[:, j]).sum(-1) for i in range(4) for j in range(i + 1, 4)], dim=1)
    torch.testing.assert_close(DotInteraction(4)(feats), want)


def test_activation_unit_factored_form_equals_the_paper_form():
    torch.manual_seed(0)
    unit = ActivationUnit(8, (16, 4))
    keys, query = torch.randn(5, 11, 8), torch.randn(5, 8)
    with torch.no_grad():
        assert torch.allclose(unit(keys, query), unit.reference(keys, query), atol=1e-5)


def test_augru_with_full_attention_is_a_gru():
    """With a_t = 1 the AUGRU is a GRU; PyTorch's z gate is 1 - u, so its weights are negated."""
    torch.manual_seed(0)
    augru, gru = AUGRU(5, 7), nn.GRU(5, 7, batch_first=True)
    with torch.no_grad():
        sign = torch.ones(21, 1)
        sign[7:14] = -1
        gru.weight_ih_l0.copy_(augru.x_proj.weight * sign)
        gru.weight_hh_l0.copy_(augru.h_proj.weight * sign)
        gru.bias_ih_l0.copy_(augru.x_proj.bias * sign[:, 0])
        gru.bias_hh_l0.copy_(augru.h_proj.bias * sign[:, 0])
        x = torch.randn(3, 6, 5)
        _, h_gru = gru(x)
        assert torch.allclose(augru(x, torch.ones(3, 6)), h_gru[0], atol=1e-5)
        assert torch.equal(augru(x, torch.zeros(3, 6)), torch.zeros(3, 7))  # no attention: no update


def test_score_head_reads_the_papers_last_layer():
    x = torch.randn(4, 10)
    two = ScoreHead((6, 2), 10, 1)
    with torch.no_grad():
        assert torch.allclose(torch.sigmoid(two(x)), torch.softmax(nn.Sequential(*two)(x), dim=1)[:, 1:], atol=1e-6)
    assert isinstance(ScoreHead((6, 5), 10, 1)[-1], nn.Linear) and ScoreHead((6, 5), 10, 1)[-1].out_features == 1
    assert len(ScoreHead((6, 1), 10, 1)) == 3  # Linear, ReLU, Linear: used as written


# ---- FLOPs --------------------------------------------------------------------------------


def test_flops_of_an_mlp_only_model_match_a_hand_count():
    s = spec("t-flops", family="dlrm", dense_in=3, bottom_mlp=[4], top_mlp=[8, 1], interaction="concat",
             tables=[{"name": "e", "rows": 100, "dim": 2, "pooling": 3}])
    bottom = 2 * 3 * 4
    top = 2 * (4 + 2) * 8 + 2 * 8 * 1
    assert dense_flops_per_item(s) == bottom + top


def test_flops_count_dien_attention_and_augru():
    s = SPECS["dien"]
    d, h, steps, w = 8, 6, 10, (16, 8)
    extractor = 2 * steps * 3 * (d * h + h * h)
    query = 2 * d * h
    attention = steps * h + 2 * steps * 2 * h * w[0] + 2 * h * w[0] + 2 * steps * (w[0] * w[1] + w[1] * 1)
    augru = 2 * steps * h * 3 * h + steps * 2 * h * 3 * h
    head = 2 * ((3 + 4 + 8 + h) * 24 + 24 * 12 + 12 * 2)
    assert dense_flops_per_item(s) == extractor + query + attention + augru + head


@pytest.mark.parametrize("family", sorted(SPECS))
def test_flops_per_item_equal_flops_of_a_real_run(family):
    s = SPECS[family]
    model = build(s, scale=0.1)
    batch = sample_batch(model, 1)
    with torch.no_grad():
        real = count_dense_flops(model, batch.dense, model.sparse(batch))
    assert real == dense_flops_per_item(s) > 0


def test_flops_on_the_meta_device_equal_flops_on_cpu():
    """The path used for giant MLPs; DIEN (GRU, attention, AUGRU loop) and DLRM (dot) cover every layer type."""
    for family in ("dien", "dlrm", "din"):
        assert count_spec_flops(SPECS[family], "meta") == count_spec_flops(SPECS[family], "cpu")


def test_flops_count_din_attention():
    s = SPECS["din"]
    d, steps, w = 8, 12, (16, 8)
    attention = steps * d + 2 * steps * 2 * d * w[0] + 2 * d * w[0] + 2 * steps * (w[0] * w[1] + w[1] * 1)
    pooling = 2 * steps * d
    head = 2 * ((1 + 4 + 8 + d) * 24 + 24 * 12 + 12 * 2)
    assert dense_flops_per_item(s) == attention + pooling + head


VARIATIONS = [
    # DIN as the papers write it: no attention_mlp (default unit), 200-80-2 head, two towers
    dict(family="din", dense_in=1, top_mlp=[20, 8, 2], towers=2, interaction="attention",
         tables=[{"name": "g", "rows": 40, "dim": 4}, {"name": "h", "rows": 40, "dim": 4, "pooling": 3,
                                                      "kind": "sequence"}]),
    # DIEN with DIEN's bilinear attention (no attention_mlp) and a hidden size unlike the embedding dim
    dict(family="dien", dense_in=2, top_mlp=[20, 8, 2], gru_hidden=5, interaction="gru",
         tables=[{"name": "g", "rows": 40, "dim": 4}, {"name": "h", "rows": 40, "dim": 4, "pooling": 3,
                                                      "kind": "sequence"}]),
    # Wide&Deep with a deep tower ending in 1 and a bottom MLP; MT-WnD with no tower MLP
    dict(family="wnd", dense_in=4, bottom_mlp=[8], top_mlp=[8, 1], interaction="concat",
         tables=[{"name": "e", "rows": 40, "dim": 4, "pooling": 2, "repeat": 2}]),
    dict(family="mtwnd", dense_in=4, top_mlp=[8], towers=2, interaction="concat",
         tables=[{"name": "e", "rows": 40, "dim": 4, "repeat": 2}]),
    # NCF with shared embeddings, a top MLP ending in the prediction layer, and an extra sequence table
    dict(family="ncf", dense_in=1, top_mlp=[8, 1], interaction="concat",
         tables=[{"name": "u", "rows": 40, "dim": 4, "side": "user"}, {"name": "i", "rows": 40, "dim": 4},
                 {"name": "h", "rows": 40, "dim": 2, "pooling": 3, "kind": "sequence"}]),
    # DLRM whose top MLP does not end in 1
    dict(family="dlrm", dense_in=4, bottom_mlp=[4], top_mlp=[8, 3], interaction="concat",
         tables=[{"name": "e", "rows": 40, "dim": 4, "pooling": 2}]),
]


@pytest.mark.parametrize("fields", VARIATIONS, ids=[f"{v['family']}-{i}" for i, v in enumerate(VARIATIONS)])
def test_spec_variations_build_and_score(fields):
    s = spec("t-var", **fields)
    model = build(s, scale=1.0)
    scores, split = run(model, sample_batch(model, 5))
    assert scores.shape == (5, s.towers) and torch.equal(scores, split)
    assert bool(((scores > 0) & (scores < 1)).all())
    assert dense_flops_per_item(s) > 0


def test_all_tables_at_once_equal_table_by_table():
    model = build(SPECS["mtwnd"], scale=0.1)
    for size in (1, 6):
        batch = sample_batch(model, size, rng=size)
        for t, (indices, offsets) in enumerate(batch.tables()):
            one_i, one_o = batch.table(t)
            assert torch.equal(indices, one_i) and torch.equal(offsets, one_o)
