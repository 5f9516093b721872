"""What a tritonclient user meets past plain inference: compressed requests, the same scores by every protocol,
Triton extensions this server does not offer (answered so, not ignored), repository loads it cannot honour, and
streamed errors that name their request."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from recserve.serving import config_from_dict
from recserve.serving.wire import codec
from recserve.serving.wire.proto import service_pb2
from recserve.specs import model_from_dict
from recserve.zoo import FAMILY_CLASSES, sample_batch
from tests.support import grpc_client, http
from tests.support.nodes import generous, generous_yaml, started
from tests.support.oip_inputs import grpc_inputs, http_inputs

pytestmark = pytest.mark.integration  # starts a node

SPEC = dict(family="dlrm", dense_in=4, bottom_mlp=[8, 4], top_mlp=[8, 1], interaction="dot",
            tables=[dict(name="user", rows=1000, dim=4), dict(name="item", rows=1000, dim=4)],
            sla=dict(target_ms=100))


def trained() -> torch.nn.Module:
    spec = model_from_dict("ctr", SPEC)
    torch.manual_seed(1)
    return FAMILY_CLASSES["dlrm"](spec, tuple(t.rows for t in spec.tables)).eval()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from recserve.zoo.artifacts import write_version

    root = Path(tmp_path_factory.mktemp("repo"))
    (root / "ctr").mkdir()
    (root / "ctr" / "config.yaml").write_text("workers: 1\n" + generous_yaml())
    write_version(trained(), root / "ctr", 1, "safetensors")
    config = config_from_dict({"models": [generous({"model": "hera-ncf", "name": "ncf", "scale": 1e-4})],
                               "repository": str(root)})
    with started(config) as server:
        yield server.ports


def _batch(size: int = 4):
    return sample_batch(trained(), size, rng=size)


def _error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_one_query_scores_the_same_to_the_last_bit_by_every_protocol_and_compression(node):
    """BLAS rounds a small matrix's product by where it starts in memory: the model gets every query's floats at
    one alignment, so binary HTTP, plain JSON, gRPC and gzip-compressed gRPC agree bit for bit."""
    over_http, over_grpc = http.triton(node.http), grpc_client.triton(node.grpc)
    for size in (2, 3, 4):
        batch = _batch(size)
        answers = {
            "http binary": over_http.infer("ctr", http_inputs(batch)).as_numpy("scores"),
            "http json": over_http.infer("ctr", http_inputs(batch, binary=False)).as_numpy("scores"),
            "http gzip": over_http.infer("ctr", http_inputs(batch),
                                         request_compression_algorithm="gzip").as_numpy("scores"),
            "grpc": over_grpc.infer("ctr", grpc_inputs(batch)).as_numpy("scores"),
            "grpc gzip": over_grpc.infer("ctr", grpc_inputs(batch), compression_algorithm="gzip").as_numpy("scores"),
        }
        first = answers["grpc"]
        assert all(np.array_equal(a, first) for a in answers.values()), {k: a.ravel() for k, a in answers.items()}
    over_grpc.close()


def test_compressed_request_bodies_are_inflated_within_the_body_limit(node):
    """tritonclient's ``request_compression_algorithm`` (gzip, deflate) as Triton takes it; a body that inflates
    past the node's limit is refused 413 as it inflates, and the node serves on."""
    arrays = _batch(3).as_arrays()
    plain = http.post_json(node.http, "/v2/models/ctr/infer", http.json_infer_body(arrays))
    assert plain.status == 200, plain.body[:300]
    body = json.dumps(http.json_infer_body(arrays)).encode()
    for coding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        reply = http.post(node.http, "/v2/models/ctr/infer", packed,
                          headers={"Content-Type": "application/json", "Content-Encoding": coding})
        assert reply.status == 200 and reply.json()["outputs"] == plain.json()["outputs"], (coding, reply.body[:300])
    bomb = gzip.compress(b"\0" * (80 * 1024 * 1024), compresslevel=9)  # ~80 KB that inflate to 80 MiB
    reply = http.post(node.http, "/v2/models/ctr/infer", bomb, headers={"Content-Encoding": "gzip"})
    assert reply.status == 413, (reply.status, reply.body[:300])
    assert http.triton(node.http).is_server_ready()
    assert http.post_json(node.http, "/v2/models/ctr/infer", http.json_infer_body(arrays)).status == 200


def test_extensions_not_offered_answer_unimplemented_and_say_what_to_use(node):
    for method, path, words in (("GET", "/v2/trace/setting", "trace settings"),
                                ("POST", "/v2/models/ctr/trace/setting", "trace settings"),
                                ("GET", "/v2/logging", "log settings")):
        reply = http.request(node.http, path, method=method, body=b"{}" if method == "POST" else None)
        assert reply.status == 501 and words in reply.json()["error"], (path, reply.status, reply.body[:200])
    over_grpc = grpc_client.triton(node.grpc)
    for call, words in ((over_grpc.get_trace_settings, "trace settings"), (over_grpc.get_log_settings,
                                                                            "log settings")):
        error = _error(call)
        assert error.status() == "StatusCode.UNIMPLEMENTED" and words in error.message(), error
    over_grpc.close()


def test_a_classification_request_is_refused_not_answered_with_raw_scores(node):
    batch = _batch(2)
    over_http, over_grpc = http.triton(node.http), grpc_client.triton(node.grpc)
    error = _error(lambda: over_http.infer("ctr", http_inputs(batch),
                                           outputs=[thttp.InferRequestedOutput("scores", class_count=1)]))
    assert error.status() == "400" and "class_count" in error.message(), error
    error = _error(lambda: over_grpc.infer("ctr", grpc_inputs(batch),
                                           outputs=[tgrpc.InferRequestedOutput("scores", class_count=1)]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "class_count" in error.message(), error
    over_grpc.close()


def test_a_load_with_a_config_override_or_files_is_refused_and_the_model_serves_on(node):
    over_http, over_grpc = http.triton(node.http), grpc_client.triton(node.grpc)
    override = json.dumps({"version_policy": {"specific": {"versions": [1]}}})
    error = _error(lambda: over_http.load_model("ctr", config=override))
    assert error.status() == "400" and "config override" in error.message(), error
    error = _error(lambda: over_grpc.load_model("ctr", files={"file:1/model.safetensors": b"not weights"}))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "parameters.file:1" in error.message(), error
    assert over_http.is_model_ready("ctr")
    over_http.load_model("ctr")  # without parameters: loads as before
    over_grpc.close()


def test_a_model_of_the_node_config_is_not_unloaded_by_the_repository_api(node):
    over_http = http.triton(node.http)
    error = _error(lambda: over_http.unload_model("ncf"))
    assert error.status() == "400" and "node config" in error.message(), error
    assert over_http.is_model_ready("ncf")


def test_a_version_that_is_not_a_number_is_a_bad_request(node):
    reply = http.post_json(node.http, "/v2/models/ctr/versions/abc/infer",
                           http.json_infer_body(_batch(1).as_arrays()))
    assert reply.status == 400 and "whole number" in reply.json()["error"], reply.body[:200]
    assert http.get(node.http, "/v2/models/ctr/versions/abc/ready").status == 400


def _stream_request(request_id: str, model: str, arrays: dict[str, np.ndarray]) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype=codec.DATATYPES[array.dtype], shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    return request


def test_a_streamed_error_names_the_request_it_answers(node):
    """Answered in the worker (a bad shape), or by the server process (an unknown model): either error carries
    its request's id, as Triton's stream does; answers keep the requests' order."""
    arrays = _batch(2).as_arrays()
    bad = {**arrays, "dense": arrays["dense"][:, :2].copy()}
    requests = [_stream_request("ok-1", "ctr", arrays), _stream_request("bad-shape", "ctr", bad),
                _stream_request("no-model", "nothing", arrays), _stream_request("ok-2", "ctr", arrays)]
    with grpc_client.stub(node.grpc) as stub:
        answers = list(stub.ModelStreamInfer(iter(requests), timeout=120))
    assert [a.infer_response.id for a in answers] == ["ok-1", "bad-shape", "no-model", "ok-2"]
    assert [bool(a.error_message) for a in answers] == [False, True, True, False], answers


@pytest.mark.parametrize("path, body, field", [
    ("/v2/repository/index", {"ready": "false"}, "ready"), ("/v2/repository/index", {"ready": 1}, "ready"),
    ("/v2/repository/models/ctr/load", {"parameters": []}, "parameters"),
    ("/v2/repository/models/ctr/load", {"parameters": ""}, "parameters")])
def test_repository_bodies_of_the_wrong_type_are_refused_naming_the_field(node, path, body, field):
    reply = http.post_json(node.http, path, body)
    assert reply.status == 400 and reply.json()["field"] == field, reply.body[:200]
    assert http.post_json(node.http, "/v2/repository/index", {"ready": True}).status == 200
