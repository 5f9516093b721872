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
    from recserve.serving.codec import check_inputs
    from recserve.serving.errors import InferError
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
