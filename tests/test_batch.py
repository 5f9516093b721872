from __future__ import annotations

import pytest
import torch

from recserve.specs import get_model
from recserve.zoo import build, sample_batch
from recserve.zoo.batch import BatchError, QueryBatch


def test_slice_concatenates_back_to_the_full_result():
    model = build(get_model("hercules-rmc1"), scale=1e-4)
    batch = sample_batch(model, 9, rng=3)
    with torch.no_grad():
        full = model(batch)
        parts = torch.cat([model(batch.slice(0, 4)), model(batch.slice(4, 9))])
    assert torch.allclose(full, parts, atol=1e-6)


def test_wire_round_trip_is_exact():
    model = build(get_model("hercules-rmc1"), scale=1e-4)
    batch = sample_batch(model, 5, rng=1)
    again = QueryBatch.from_arrays(batch.as_arrays())
    with torch.no_grad():
        assert torch.equal(model(batch), model(again))


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda b: QueryBatch(b.dense.double(), b.values, b.lengths), "dense"),
        (lambda b: QueryBatch(b.dense[:, :3], b.values, b.lengths), "dense"),
        (lambda b: QueryBatch(b.dense, b.values + 10**9, b.lengths), "sparse_values"),
        (lambda b: QueryBatch(b.dense, b.values[:-1], b.lengths), "sparse_values"),
        (lambda b: QueryBatch(b.dense, b.values, b.lengths[:, :2]), "sparse_lengths"),
    ],
)
def test_validation_names_the_bad_field(mutate, field):
    model = build(get_model("hercules-rmc1"), scale=1e-4)
    with pytest.raises(BatchError) as err:
        model.validate(mutate(sample_batch(model, 4)))
    assert err.value.field == field


def test_check_query_skips_only_the_length_checks_the_codec_made():
    """``lengths_checked`` (the serving codec's ``check_inputs`` ran) skips the lengths' sign and sum, nothing else."""
    from recserve.serving.wire.codec import check_inputs
    from recserve.serving.wire.errors import InferError
    from recserve.zoo.batch import check_query

    model = build(get_model("hercules-rmc1"), scale=1e-4)
    arrays = sample_batch(model, 4, rng=2).as_arrays()
    dense, values, lengths = arrays["dense"], arrays["sparse_values"], arrays["sparse_lengths"]
    spec = (model.spec.dense_in, tuple(model.rows))
    check_query(dense, values, lengths, *spec, lengths_checked=True)
    for bad, field in (((dense, values + 10**9, lengths), "sparse_values"), ((dense[:, :3], values, lengths), "dense"),
                       ((dense, values, lengths[:, :2]), "sparse_lengths")):
        with pytest.raises(BatchError) as err:
            check_query(*bad, *spec, lengths_checked=True)
        assert err.value.field == field
    negative = lengths.copy()
    negative[0, 0], negative[0, 1] = -1, negative[0, 1] + 1
    short = values[:-1]
    for bad in ((dense, values, negative), (dense, short, lengths)):
        with pytest.raises(BatchError):  # unchecked: found here
            check_query(*bad, *spec)
        with pytest.raises(InferError):  # checked: the codec's check refuses them first
            check_inputs({"dense": bad[0], "sparse_values": bad[1], "sparse_lengths": bad[2]})


@pytest.mark.parametrize("lengths_checked", [False, True])
def test_small_queries_get_the_same_verdict_as_large_ones(monkeypatch, lengths_checked):
    """A query of at most ``SMALL_QUERY_LENGTHS`` lengths is checked on Python lists (cheaper at batch 1): every
    verdict, and the field and message of every refusal, must equal the numpy path's."""
    import numpy as np

    from recserve.serving.wire.codec import check_inputs
    from recserve.serving.wire.errors import InferError
    from recserve.wire import SMALL_QUERY_LENGTHS
    from recserve.zoo import batch as batch_mod

    model = build(get_model("hercules-rmc1"), scale=1e-4)
    spec = (model.spec.dense_in, tuple(model.rows), {1: 5})
    rng = np.random.default_rng(7)
    cases = 0
    for _ in range(300):
        b = int(rng.integers(1, 3))
        lengths = rng.integers(0, 4, size=(len(model.rows), b)).astype(rng.choice([np.int32, np.int64]))
        lengths[1] = 5 if rng.random() < 0.7 else rng.integers(0, 7, size=b)  # table 1: a sequence table
        if rng.random() < 0.2:
            lengths[rng.integers(len(model.rows)), 0] = -1
        size = max(0, int(lengths.sum()) + int(rng.choice([0, 0, 0, -1, 1])))
        values = rng.integers(0, min(model.rows), size=size).astype(np.int64)
        if values.size and rng.random() < 0.3:  # just past a table's last row, negative, or far out
            values[rng.integers(values.size)] = rng.choice([min(model.rows), -1, 10**9])
        dense = rng.standard_normal((b, spec[0])).astype(np.float32)
        if rng.random() < 0.1:
            dense[0, 0] = rng.choice([np.nan, np.inf])
        verdicts = []
        for small in (True, False):
            for module in ("recserve.zoo.batch", "recserve.serving.wire.codec.tensors"):  # where check_inputs reads it
                monkeypatch.setattr(f"{module}.SMALL_QUERY_LENGTHS", SMALL_QUERY_LENGTHS if small else 0)
            try:
                if lengths_checked:
                    check_inputs({"dense": dense, "sparse_values": values, "sparse_lengths": lengths})
                batch_mod.check_query(dense, values, lengths, *spec, lengths_checked=lengths_checked)
                verdicts.append(None)
            except (BatchError, InferError) as exc:
                verdicts.append((type(exc).__name__, str(exc)))
        assert verdicts[0] == verdicts[1], (lengths.tolist(), values.tolist())
        cases += verdicts[0] is not None
    assert 50 < cases < 290  # both verdicts were exercised


@pytest.mark.parametrize("small", [True, False])
@pytest.mark.parametrize("bad_id", [-1, 10**9, 2**63 - 1])
def test_an_id_outside_its_table_is_refused_naming_the_table_its_size_the_place_and_the_id(monkeypatch, small,
                                                                                           bad_id):
    """Not wrapped or clamped (another item's row would be scored): the first bad id, where it is and its table's
    size, on the small-query path and the numpy path alike; tables before it may be empty."""
    import numpy as np

    from recserve.wire import SMALL_QUERY_LENGTHS
    from recserve.zoo.batch import check_query

    monkeypatch.setattr("recserve.zoo.batch.SMALL_QUERY_LENGTHS", SMALL_QUERY_LENGTHS if small else 0)
    model = build(get_model("hercules-rmc1"), scale=1e-4)
    rows = tuple(model.rows)
    lengths = np.full((len(rows), 2), 2, np.int32)
    lengths[0] = 0  # an empty first table: the bad id's place counts from the tables before it
    values = np.ones(int(lengths.sum()), np.int64)
    values[[5, 9]] = bad_id, 10**9  # table 2's second bag (table 1 holds 0-3); a later bad id is not named
    with pytest.raises(BatchError) as err:
        check_query(np.zeros((2, model.spec.dense_in), np.float32), values, lengths, model.spec.dense_in, rows)
    assert err.value.field == "sparse_values"
    assert str(err.value) == (f"sparse_values: table 2 index out of range [0, {rows[2]}): "
                              f"sparse_values[5] is {bad_id}")
