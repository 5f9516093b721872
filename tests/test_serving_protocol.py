"""Open Inference Protocol conformance of the node server: health bodies, JSON errors, whole-request
validation, gRPC ModelReady/ModelStreamInfer, Triton model-configuration rules; and the numpy-only codec."""

from __future__ import annotations

import copy
import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

import recserve
from recserve.serving import build_worker_model
from recserve.serving.wire import codec
from recserve.serving.wire.errors import STATUS, InferError
from recserve.specs import catalogue_models
from recserve.zoo import sample_batch
from tests.support import grpc_client, http, models
from tests.support.nodes import node_config, started
from tests.support.oip_inputs import DTYPE_NAMES, grpc_inputs

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

MAX_BODY = 1024 * 1024


@pytest.fixture(scope="module")
def node():
    model = models.first_dlrm()
    config = node_config(model, scale=1e-4, workers=1)
    config.max_body_bytes = MAX_BODY
    with started(config) as server:
        ports = server.ports
        yield server.config.models[0], ports


@pytest.fixture(scope="module")
def model(node):
    return build_worker_model(node[0])


def json_request(batch) -> dict:
    return http.json_infer_body(batch.as_arrays())


def post(port: int, path: str, body: bytes) -> http.Reply:
    return http.post(port, path, body, http.JSON, timeout_s=60)


# ---------------------------------------------------------------- HTTP health and errors


def test_health_endpoints_answer_with_oip_bodies(node):
    cfg, ports = node
    assert http.get(ports.http, "/v2/health/live").status_and_json() == (200, {"live": True})
    assert http.get(ports.http, "/v2/health/ready").status_and_json() == (200, {"ready": True})
    for path in (f"/v2/models/{cfg.name}/ready", f"/v2/models/{cfg.name}/versions/1/ready"):
        reply = http.get(ports.http, path)
        assert reply.status_and_json() == (200, {"name": cfg.name, "ready": True})
        assert reply.headers["Content-Type"].startswith("application/json")
    status, body = http.get(ports.http, f"/v2/models/{cfg.name}/versions/2/ready").status_and_json()
    assert status == 404 and body["field"] == "model_version"


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/nope", 404),
    ("GET", "/v2/models/{m}/infer", 405),
    ("POST", "/v2/health/live", 405),
])
def test_aiohttp_errors_are_json(node, method, path, status):
    cfg, ports = node
    reply = http.request(ports.http, path.format(m=cfg.name), method=method, body=b"{}" if method == "POST" else None,
                         headers=http.JSON)
    assert reply.status == status and reply.headers["Content-Type"].startswith("application/json")
    assert isinstance(reply.json()["error"], str) and reply.json()["error"]
    if status == 405:
        assert "Allow" in reply.headers


def test_malformed_json_and_too_large_body_are_json_errors(node):
    cfg, ports = node
    reply = post(ports.http, f"/v2/models/{cfg.name}/infer", b"{not json")
    assert reply.status == 400 and reply.json()["field"] == "body"
    assert reply.headers["Content-Type"].startswith("application/json")
    status, body = post(ports.http, f"/v2/models/{cfg.name}/infer", b" " * (MAX_BODY + 1)).status_and_json()
    assert status == STATUS["too_large"].http == 413 and body["field"] == "body"


def _stats(port: int, name: str) -> tuple[int, int]:
    """(successes, inference count) once settled: workers report within milliseconds (``STATS_FLUSH_S``), so the
    counts are read until two reads 0.1 s apart agree (an earlier test's queries may still be on their way)."""
    def read() -> tuple[int, int]:
        entry = http.get_json(port, f"/v2/models/{name}/stats")["model_stats"][0]
        return int(entry["inference_stats"]["success"]["count"]), int(entry["inference_count"])

    deadline, last = time.monotonic() + 30, read()
    while True:
        time.sleep(0.1)
        now = read()
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def _set_input(field: str, value):
    def mutate(req: dict) -> None:
        req["inputs"][0][field] = value  # inputs[0] is dense
    return mutate


def _set_data(name: str, value):
    def mutate(req: dict) -> None:
        next(t for t in req["inputs"] if t["name"] == name)["data"][0] = value
    return mutate


BAD_REQUESTS = {
    "unhashable input name": (lambda req: req.update(inputs=[{"name": ["dense"]}]), "inputs"),
    "id beyond int64": (_set_data("sparse_values", 2**70), "sparse_values"),
    "id just beyond int64": (_set_data("sparse_values", 2**63), "sparse_values"),
    "float id": (_set_data("sparse_values", 1.5), "sparse_values"),
    "text in dense": (_set_data("dense", "1.0"), "dense"),
    "request parameters a list": (lambda req: req.update(parameters=[1]), "parameters"),
    "binary_data_output not a bool": (lambda req: req.update(parameters={"binary_data_output": "yes"}),
                                      "parameters"),
    "input parameters a list": (_set_input("parameters", [1]), "dense"),
    "binary_data_size a bool": (_set_input("parameters", {"binary_data_size": True}), "dense"),
    "outputs holds a number": (lambda req: req.update(outputs=[1]), "outputs"),
    "output without a name": (lambda req: req.update(outputs=[{"parameters": {}}]), "outputs"),
    "output parameters a list": (lambda req: req.update(outputs=[{"name": "scores", "parameters": [1]}]), "scores"),
    "id a number": (lambda req: req.update(id=5), "id"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_malformed_request_is_400_before_the_model_runs(node, model, case):
    cfg, ports = node
    mutate, field = BAD_REQUESTS[case]
    req = json_request(sample_batch(model, 3, rng=1))
    mutate(req)
    before = _stats(ports.http, cfg.name)
    reply = post(ports.http, f"/v2/models/{cfg.name}/infer", json.dumps(req).encode())
    body = reply.json()
    assert reply.status == 400 and reply.headers["Content-Type"].startswith("application/json"), body
    assert body["field"] == field and body["error"].startswith(field), body
    assert _stats(ports.http, cfg.name) == before  # not run, not counted as a success


def test_valid_json_request_still_answers(node, model):
    cfg, ports = node
    req = json_request(sample_batch(model, 3, rng=1))
    req.update(id="q", parameters={"binary_data_output": False}, outputs=[{"name": "scores", "parameters": {}}])
    status, body = post(ports.http, f"/v2/models/{cfg.name}/infer", json.dumps(req).encode()).status_and_json()
    assert status == 200 and body["id"] == "q" and body["outputs"][0]["shape"][0] == 3


# ---------------------------------------------------------------- gRPC


def test_grpc_model_ready_honours_the_version(node):
    cfg, ports = node
    client = grpc_client.triton(ports.grpc)
    assert client.is_model_ready(cfg.name) and client.is_model_ready(cfg.name, "1")
    assert not client.is_model_ready(cfg.name, "2") and not client.is_model_ready("nope")
    # HTTP answers 404 there; tritonclient reads both as "not ready"
    assert http.get(ports.http, f"/v2/models/{cfg.name}/versions/2/ready").status == 404


def test_grpc_raw_and_typed_contents_together_is_invalid(node, model):
    cfg, ports = node
    request = service_pb2.ModelInferRequest(model_name=cfg.name)
    for name, arr in sample_batch(model, 2, rng=3).as_arrays().items():
        t = request.inputs.add(name=name, datatype=DTYPE_NAMES[arr.dtype], shape=list(arr.shape))
        request.raw_input_contents.append(arr.tobytes())
        if name == "dense":
            t.contents.fp32_contents.extend(arr.reshape(-1).tolist())
    with grpc_client.stub(ports.grpc) as stub, pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "dense" in err.value.details()


def test_grpc_request_of_too_many_fields_is_invalid_and_the_node_serves_on(node, model):
    """Empty inputs are two bytes each: past codec.MAX_REQUEST_FIELDS the worker refuses the request before
    protobuf builds them (the message is well under max_body_bytes); the next request is answered."""
    cfg, ports = node
    request = service_pb2.ModelInferRequest(model_name=cfg.name)
    for _ in range(codec.MAX_REQUEST_FIELDS):
        request.inputs.add()
    with grpc_client.stub(ports.grpc) as stub:
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"more than {codec.MAX_REQUEST_FIELDS} top-level fields" in err.value.details()
    client = grpc_client.triton(ports.grpc)
    assert client.infer(cfg.name, grpc_inputs(sample_batch(model, 2, rng=5))).as_numpy("scores").shape == (2, 1)


def test_grpc_stream_infer_answers_each_request(node, model):
    cfg, ports = node
    client = grpc_client.triton(ports.grpc)
    batches = [sample_batch(model, n, rng=n) for n in (4, 9)]
    expected = [client.infer(cfg.name, grpc_inputs(b)).as_numpy("scores") for b in batches]
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(cfg.name, grpc_inputs(batches[0]), request_id="a")
        client.async_stream_infer(cfg.name, grpc_inputs(batches[0]), model_version="7", request_id="bad")
        client.async_stream_infer(cfg.name, grpc_inputs(batches[1]), request_id="b")
        got = [answers.get(timeout=60) for _ in range(3)]
    finally:
        client.stop_stream()
    scores = {r.get_response().id: r.as_numpy("scores") for r, e in got if e is None}
    errors = [e for r, e in got if e is not None]
    assert sorted(scores) == ["a", "b"] and len(errors) == 1 and "version" in errors[0].message()
    np.testing.assert_array_equal(scores["a"], expected[0])
    np.testing.assert_array_equal(scores["b"], expected[1])


# ---------------------------------------------------------------- model configuration (Triton's rules)

TRITON_TYPES = {f"TYPE_{t}" for t in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                     "INT64", "FP16", "FP32", "FP64", "STRING", "BF16")}


def full_shape(config: dict, tensor: dict) -> list[int]:
    """Triton: ``[-1] + dims`` when max_batch_size > 0, ``dims`` when it is 0."""
    dims = [int(d) for d in tensor["dims"]]
    return ([-1] + dims) if int(config.get("max_batch_size", 0)) > 0 else dims


def triton_config_problems(config: dict, model_name: str) -> list[str]:
    """What docs/user_guide/model_configuration.md (triton-inference-server/server) rules out in ``config``."""
    problems = []
    if config.get("name", model_name) != model_name:
        problems.append("name differs from the model's")
    if not (config.get("platform") or config.get("backend")):
        problems.append("neither platform nor backend")
    if int(config.get("max_batch_size", 0)) < 0:
        problems.append("max_batch_size < 0")
    for kind in ("input", "output"):
        tensors = config.get(kind) or []
        names = [t.get("name") for t in tensors]
        if not tensors or len(set(names)) != len(names) or not all(names):
            problems.append(f"{kind} names missing or not unique: {names}")
        for t in tensors:
            dims = [int(d) for d in t.get("dims", [])]
            if t.get("data_type") not in TRITON_TYPES:
                problems.append(f"{t.get('name')}: data_type {t.get('data_type')!r}")
            if not dims or not all(d == -1 or d >= 1 for d in dims):
                problems.append(f"{t.get('name')}: dims {dims} (rank >= 1, each -1 or >= 1)")
    for group in config.get("instance_group", []):
        if int(group.get("count", 1)) < 1 or group.get("kind") not in ("KIND_CPU", "KIND_GPU", "KIND_AUTO"):
            problems.append(f"instance_group {group}")
    return problems


def shape_fits(config_shape: list[int], shape: list[int]) -> bool:
    """perf_analyzer / Triton request check: same rank, every fixed dim equal."""
    return len(config_shape) == len(shape) and all(c in (-1, s) for c, s in zip(config_shape, shape, strict=True))


def test_served_config_follows_triton_rules(node):
    cfg, ports = node
    spec = catalogue_models()[cfg.model]
    http_cfg = http.get_json(ports.http, f"/v2/models/{cfg.name}/config")
    grpc_cfg = grpc_client.triton(ports.grpc).get_model_config(cfg.name, as_json=True)
    grpc_cfg = grpc_cfg["config"]
    meta = http.get_json(ports.http, f"/v2/models/{cfg.name}")
    for config in (http_cfg, grpc_cfg):
        assert triton_config_problems(config, cfg.name) == []
        assert int(config.get("max_batch_size", 0)) == 0
        assert config["parameters"]["max_query_size"]["string_value"] == str(cfg.max_batch_size)
        # the full shapes Triton derives from the config are the metadata's shapes
        shapes = {t["name"]: full_shape(config, t) for t in config["input"] + config["output"]}
        assert shapes == {t["name"]: t["shape"] for t in meta["inputs"] + meta["outputs"]}
    dense = next(t for t in http_cfg["input"] if t["name"] == "dense")
    lengths = next(t for t in http_cfg["input"] if t["name"] == "sparse_lengths")
    assert shape_fits(full_shape(http_cfg, dense), [64, spec.dense_in])
    assert shape_fits(full_shape(http_cfg, lengths), [len(spec.tables), 64])
    old = copy.deepcopy(http_cfg) | {"max_batch_size": cfg.max_batch_size}  # what the server said before
    assert not shape_fits(full_shape(old, dense), [64, spec.dense_in])


# ---------------------------------------------------------------- codec (no server)


def test_codec_round_trips_and_reads_the_batch_size(model):
    arrays = sample_batch(model, 5, rng=2).as_arrays()
    body, head = codec.encode_http_request(arrays, "r1")
    request, parsed = codec.parse_http_infer(body, str(head))
    assert request["id"] == "r1" and parsed.keys() == arrays.keys()
    for name in arrays:
        np.testing.assert_array_equal(parsed[name], arrays[name])
    assert codec.batch_size_of(body, str(head)) == 5
    assert codec.batch_size_of(json.dumps(json_request(sample_batch(model, 7))).encode(), None) == 7
    with pytest.raises(InferError, match="dense"):
        codec.batch_size_of(b'{"inputs": []}', None)
    scores = np.arange(10, dtype=np.float32).reshape(5, 2)
    for binary in (True, False):
        request["outputs"][0]["parameters"]["binary_data"] = binary
        payload, headers = codec.http_infer_response("m", request, scores)
        length = headers.get(codec.HEADER_LENGTH)
        decoded = codec.decode_http_response(payload, None if length is None else int(length))
        np.testing.assert_array_equal(decoded["scores"], scores)


def _loaded_after(imports: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter (this checkout's recserve) holds after ``imports``."""
    code = f"import sys, {imports}; print(','.join(m for m in {modules!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(Path(recserve.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return [m for m in out.stdout.strip().split(",") if m]


def test_codec_and_router_import_without_torch():
    heavy = ("torch", "recserve.zoo", "recserve.serving.worker.main", "recserve.serving.node.runtime")
    assert _loaded_after("recserve.policies.router", heavy) == []
    assert _loaded_after("recserve.serving.wire.codec", heavy + ("aiohttp", "grpc")) == []
