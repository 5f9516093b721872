"""The load generator's v2 protocols for servers other than recserve: plain-JSON requests (JsonHttpTarget, what
KServe's and MLServer's REST take) and gRPC answers in typed contents (MLServer's default), without servers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recserve.measure.targets import (
    HttpTarget,
    JsonHttpTarget,
    RequestFailed,
    decode_grpc_response,
    encode_json_request,
    grpc_messages,
    make_target,
)
from recserve.serving.wire.codec import decode_http_response, parse_http_infer, raw_tensor
from recserve.specs import get_model
from recserve.zoo import build, sample_batch


@pytest.fixture(scope="module")
def batch():
    return sample_batch(build(get_model("hercules-rmc1"), scale=1e-3), 5, rng=3)


def test_json_request_is_plain_json_that_a_v2_parser_reads_back_exactly(batch) -> None:
    body = encode_json_request(batch)
    request = json.loads(body)  # no binary part: the whole body is the JSON document
    assert all("data" in t and "parameters" not in t for t in request["inputs"])
    assert request["outputs"] == [{"name": "scores"}]  # no binary_data: the scores come back as JSON too
    _, arrays = parse_http_infer(body, None)  # recserve's own server-side parser
    for name, want in batch.as_arrays().items():
        assert arrays[name].dtype == want.dtype and np.array_equal(arrays[name], want), name


def test_json_target_is_made_from_its_scheme_and_encodes_json(batch) -> None:
    target = make_target("http+json://127.0.0.1:8000", "m")
    assert type(target) is JsonHttpTarget and target.base == "http://127.0.0.1:8000"
    body, headers = target._encode(batch)
    assert headers == {"Content-Type": "application/json"} and body == encode_json_request(batch)
    assert type(make_target("http://127.0.0.1:8000", "m")) is HttpTarget  # the binary extension stays the default


def test_a_json_answer_as_kserve_and_mlserver_send_it_is_decoded() -> None:
    scores = np.array([[0.25], [0.5], [0.125]], np.float32)
    body = json.dumps({"model_name": "m", "id": "x", "outputs": [
        {"name": "scores", "shape": [3, 1], "datatype": "FP32", "data": scores.ravel().tolist()}]}).encode()
    out = decode_http_response(body, None)["scores"]
    assert out.dtype == np.float32 and np.array_equal(out, scores)


def _response(scores: np.ndarray, raw: bool):
    pb = grpc_messages()
    resp = pb.ModelInferResponse(model_name="m")
    if raw:
        entry, data = raw_tensor("scores", scores)
        resp.outputs.add(**entry)
        resp.raw_output_contents.append(data)
    else:
        out = resp.outputs.add(name="scores", datatype="FP32", shape=list(scores.shape))
        out.contents.fp32_contents.extend(scores.ravel().tolist())
    return resp


@pytest.mark.parametrize("raw", [True, False])
def test_grpc_answers_in_raw_or_typed_contents_decode_to_the_same_scores(raw: bool) -> None:
    pytest.importorskip("tritonclient.grpc")
    scores = np.array([[0.1], [0.7], [-3.5], [1e-8]], np.float32)
    out = decode_grpc_response(_response(scores, raw))["scores"]
    assert out.dtype == np.float32 and out.shape == (4, 1) and np.array_equal(out, scores)


def test_grpc_typed_contents_whose_size_does_not_fit_the_shape_are_a_bad_response() -> None:
    pytest.importorskip("tritonclient.grpc")
    resp = _response(np.zeros((4, 1), np.float32), raw=False)
    resp.outputs[0].shape[:] = [5, 1]
    with pytest.raises(RequestFailed) as err:
        decode_grpc_response(resp)
    assert err.value.kind == "bad_response"
