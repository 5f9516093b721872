"""Coercions the codec used to answer with nonsense: each is now a 400 / INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recserve.serving.wire import codec
from recserve.serving.wire.errors import InferError


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


@pytest.mark.parametrize("request_id", [None, "q7", 2**70])
def test_a_json_answer_reads_back_as_the_exact_scores_and_id(request_id):
    """Each float32 score reads back as itself (as ``json`` wrote it, whichever library writes it); an ``id`` orjson
    cannot write (past 64 bits) is written by ``json``."""
    scores = np.random.default_rng(3).random((257, 1)).astype(np.float32) ** 9  # down to ~1e-30: exponents too
    request = {} if request_id is None else {"id": request_id}
    body, headers = codec.http_infer_response("m", request, scores, version="4")
    answer = json.loads(body)
    assert headers == {"Content-Type": "application/json"} and answer.get("id") == request_id
    assert answer["model_version"] == "4" and answer["outputs"][0]["shape"] == [257, 1]
    data = answer["outputs"][0]["data"]
    assert data == scores.reshape(-1).tolist()  # the same float64 values json.dumps would have written
    assert np.array_equal(np.asarray(data, np.float32), scores.reshape(-1))


def _infer_request(raw: bool = True):
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="m", model_version="2", id="q7")
    request.parameters["timeout"].int64_param = 5000
    arrays = {"dense": np.arange(6, dtype=np.float32).reshape(2, 3),
              "sparse_values": np.arange(5, dtype=np.int64), "sparse_lengths": np.array([[2, 3]], np.int64)}
    for name, array in arrays.items():
        entry = request.inputs.add(name=name, datatype=codec.DATATYPES[array.dtype], shape=list(array.shape))
        if raw:
            request.raw_input_contents.append(array.tobytes())
        elif array.dtype == np.float32:
            entry.contents.fp32_contents.extend(array.reshape(-1).tolist())
        else:
            entry.contents.int64_contents.extend(array.reshape(-1).tolist())
    request.outputs.add(name="scores")
    return request, arrays


def test_raw_contents_split_off_as_views_leave_the_same_request_for_protobuf():
    from tritonclient.grpc import service_pb2

    request, arrays = _infer_request()
    message = memoryview(request.SerializeToString())
    rest, raw = codec.split_raw_input_contents(message)
    assert [bytes(r) for r in raw] == list(request.raw_input_contents)
    assert all(r.obj is message.obj for r in raw)  # views of the received bytes, not copies
    parsed = service_pb2.ModelInferRequest.FromString(rest)
    expected = service_pb2.ModelInferRequest()
    expected.CopyFrom(request)
    del expected.raw_input_contents[:]
    assert parsed == expected
    decoded = codec.parse_grpc_infer(parsed, raw)
    assert all(np.array_equal(decoded[n], a) for n, a in arrays.items())


def test_a_request_without_raw_contents_splits_into_itself():
    request, arrays = _infer_request(raw=False)
    rest, raw = codec.split_raw_input_contents(memoryview(request.SerializeToString()))
    assert raw == [] and rest == request.SerializeToString()


@pytest.mark.parametrize("cut", [1, 7, -1, -3])
def test_a_truncated_or_malformed_request_is_not_split(cut):
    message = _infer_request()[0].SerializeToString()
    assert codec.split_raw_input_contents(memoryview(message[:cut])) is None
    assert codec.split_raw_input_contents(memoryview(b"\x0b" + message)) is None  # wire type 3 (a group)
    assert codec.split_raw_input_contents(memoryview(b"\x08" + b"\xff" * 11)) is None  # an endless varint


def test_a_request_of_too_many_top_level_fields_is_refused_before_protobuf_builds_them():
    """Empty ``inputs`` fields are two bytes each: walked in Python they would hold a worker's loop, and protobuf
    would build an object for each.  The walk stops at MAX_REQUEST_FIELDS, whichever of its two walks reads them."""
    limit, empty_input, raw = codec.MAX_REQUEST_FIELDS, b"\x2a\x00", b"\x3a\x01\x07"
    within = memoryview(empty_input * (limit - 1) + raw)
    rest, contents = codec.split_raw_input_contents(within)
    assert [bytes(c) for c in contents] == [b"\x07"] and len(rest) == 2 * (limit - 1)
    assert codec.first_raw_content(within) == 2 * (limit - 1)
    assert codec.largest_raw_content(within) == 2 * (limit - 1) + 2
    over = memoryview(empty_input * limit + raw)
    with pytest.raises(codec.TooManyFields) as refused:
        codec.split_raw_input_contents(over)
    assert refused.value.error().code == "invalid" and "top-level fields" in refused.value.error().public_message()
    assert codec.first_raw_content(over) == -1 and codec.largest_raw_content(over) == 0


def test_the_server_process_refuses_a_request_of_too_many_fields_before_protobuf():
    """What the server process's gRPC service decodes with (``tolerant``): the same bound as the workers' walk, for
    every request message; a well-formed request of fewer fields decodes as protobuf reads it."""
    from tritonclient.grpc import service_pb2

    from recserve.serving.wire.grpc_messages import Undecodable, tolerant

    decode = tolerant(service_pb2.ModelInferRequest.FromString)
    request = _infer_request()[0].SerializeToString()
    assert decode(request) == service_pb2.ModelInferRequest.FromString(request)
    refused = decode(request + b"\x2a\x00" * codec.MAX_REQUEST_FIELDS)
    assert isinstance(refused, Undecodable) and "top-level fields" in refused.error.public_message()
    assert isinstance(decode(b"\x0b"), Undecodable)  # not protobuf at all: as before
    codec.check_request_fields(memoryview(b"\x2a\x00" * codec.MAX_REQUEST_FIELDS))  # at the bound: walked, kept


def test_aligned_hands_back_an_aligned_array_equal_to_its_input():
    store = np.zeros(4 * 12 + codec.TENSOR_ALIGN, np.uint8)
    start = -store.ctypes.data % codec.TENSOR_ALIGN
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    for offset in (0, 4, 12):
        placed = store[start + offset : start + offset + values.nbytes].view(np.float32).reshape(3, 4)
        placed[...] = values
        out = codec.aligned(placed)
        assert out.ctypes.data % codec.TENSOR_ALIGN == 0 and np.array_equal(out, values) and out.dtype == np.float32
        assert (out is placed) == (offset == 0)


@pytest.mark.parametrize("name", ["config", "file:1/model.safetensors"])
def test_a_load_that_overrides_the_config_or_sends_files_is_refused(name):
    from recserve.serving.wire.protocol import check_load_parameters

    with pytest.raises(InferError, match="not supported") as caught:
        check_load_parameters({name: "x", "other": 1})
    assert caught.value.code == "invalid" and caught.value.field == f"parameters.{name}"
    check_load_parameters({"other": 1})  # what Triton's load does not read is let through
