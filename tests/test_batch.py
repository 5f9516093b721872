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
