"""Coercions the codec used to answer with nonsense: each is now a 400 / INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recserve.serving import codec
from recserve.serving.errors import InferError


def valid_request(batch: int = 2) -> dict:
    return {"inputs": [
        {"name": "dense", "datatype": "FP32", "shape": [batch, 3], "data": [0.5] * (batch * 3)},
        {"name": "sparse_values", "datatype": "INT64", "shape": [batch * 2], "data": [1] * (batch * 2)},
        {"name": "sparse_lengths", "datatype": "INT32", "shape": [2, batch], "data": [1] * (batch * 2)},
    ]}


def parse(request: dict | str) -> tuple[dict, dict]:
    body = request if isinstance(request, str) else json.dumps(request)
    return codec.parse_http_infer(body.encode(), None)


def refused_field(request: dict | str) -> str | None:
    with pytest.raises(InferError) as info:
        parse(request)
    assert info.value.status.http == 400 and info.value.status.grpc == "INVALID_ARGUMENT"
    assert info.value.field and str(info.value).startswith(f"{info.value.field}:")
    return info.value.field


def test_valid_request_parses():
    _, arrays = parse(valid_request())
    assert arrays["dense"].shape == (2, 3) and arrays["sparse_lengths"].sum() == 4


def test_null_and_nan_features_are_refused():
    req = valid_request()
    req["inputs"][0]["data"][1] = None
    assert refused_field(req) == "dense"
    text = json.dumps(valid_request()).replace("0.5", "NaN", 1)
    assert refused_field(text) == "dense"
    assert refused_field(json.dumps(valid_request()).replace("0.5", "Infinity", 1)) == "dense"


def test_rank_two_sparse_values_is_refused():
    req = valid_request()
    req["inputs"][1]["shape"] = [2, 2]
    assert refused_field(req) == "sparse_values"


def test_int64_lengths_whose_sum_wraps_are_refused():
    req = valid_request()
    half = 2**62
    # four lengths summing to 4 modulo 2**64: a wrapped sum would match the 4 ids
    req["inputs"][2] = {"name": "sparse_lengths", "datatype": "INT64", "shape": [2, 2],
                        "data": [half, half, half, half + 4]}
    assert refused_field(req) == "sparse_lengths"


def test_shapes_beyond_int64_are_refused():
    req = valid_request()
    req["inputs"][1] = {"name": "sparse_values", "datatype": "INT64", "shape": [2**64], "data": []}
    assert refused_field(req) == "sparse_values"
    req = valid_request()
    req["inputs"][0] = {"name": "dense", "datatype": "FP32", "shape": [0, 2**70], "data": []}
    assert refused_field(req) == "dense"


def test_binary_shape_product_beyond_int64_is_refused():
    head, raw = codec.raw_tensor("dense", np.zeros((0, 3), np.float32))
    head["shape"] = [2**40, 2**40]
    with pytest.raises(InferError, match="dense"):
        codec.from_raw("dense", head["datatype"], head["shape"], raw)


def test_a_response_never_carries_nan():
    with pytest.raises(InferError) as info:
        codec.http_infer_response("m", {}, np.array([0.5, np.nan], np.float32))
    assert info.value.status.http == 500 and info.value.field == "scores"
    body, _ = codec.http_infer_response("m", {}, np.array([0.5, 0.25], np.float32))
    assert json.loads(body)["outputs"][0]["data"] == [0.5, 0.25]
