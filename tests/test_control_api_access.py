"""The control token guards the same operations over HTTP and gRPC (``control_api.GUARDED_HTTP`` / ``GUARDED_GRPC``):
the control API, shared-memory status / register / unregister, and repository load / unload; inference, health and
metadata stay open."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from recserve.serving import NodeServer
from recserve.serving.node import control_api
from recserve.serving.wire.errors import InferError
from recserve.specs import catalogue_models
from tests.support.nodes import node_config

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def node():
    model = sorted(n for n, s in catalogue_models().items() if s.family == "dlrm")[0]
    config = node_config(model, scale=1e-4, workers=1)
    config.control_token = TOKEN
    server = NodeServer(config)
    ports = server.start()
    try:
        yield model, ports
    finally:
        server.stop()


def _http(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = b"{}" if method == "POST" else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_guarded_paths_and_methods_are_one_list():
    assert control_api.guarded_http("/control/models") == "the control API"
    assert control_api.guarded_http("/v2/systemsharedmemory/status") == "shared memory"
    assert control_api.guarded_http("/v2/repository/models/m/load") == "loading and unloading models"
    assert control_api.guarded_http("/v2/repository/index") is None
    assert control_api.guarded_http("/v2/models/m/infer") is None
    assert set(control_api.GUARDED_GRPC.values()) <= set(control_api.GUARDED_HTTP.values())
    control_api.require_token("shared memory", None, None)  # no token: open
    with pytest.raises(InferError, match="needs 'Bearer <token>'") as info:
        control_api.require_token("shared memory", "Bearer wrong", TOKEN)
    assert info.value.code == "unauthorized"


@pytest.mark.parametrize("method, path", [("GET", "/v2/systemsharedmemory/status"),
                                          ("POST", "/v2/systemsharedmemory/unregister"),
                                          ("POST", "/v2/repository/models/anything/load"),
                                          ("POST", "/v2/repository/models/anything/unload")])
def test_http_guarded_operations_need_the_token(node, method, path):
    _, ports = node
    status, body = _http(ports.http, method, path)
    assert status == 401 and body["field"] == "Authorization" and "Bearer <token>" in body["error"]
    status, body = _http(ports.http, method, path, AUTH)
    assert status != 401, body  # past the rule: answered (200) or refused for its own reason (no repository: 501)


def test_http_inference_side_stays_open(node):
    model, ports = node
    assert _http(ports.http, "GET", "/v2/health/ready")[0] == 200
    assert _http(ports.http, "GET", f"/v2/models/{model}")[0] == 200
    assert _http(ports.http, "POST", "/v2/repository/index")[0] in (200, 501)


def test_grpc_guarded_operations_need_the_token(node):
    model, ports = node
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
    auth = {"authorization": f"Bearer {TOKEN}"}
    calls = [lambda h: client.get_system_shared_memory_status(headers=h),
             lambda h: client.unregister_system_shared_memory(headers=h),
             lambda h: client.load_model("anything", headers=h),
             lambda h: client.unload_model("anything", headers=h)]
    try:
        for call in calls:
            with pytest.raises(InferenceServerException) as info:
                call(None)
            assert info.value.status() == "StatusCode.UNAUTHENTICATED"
            try:
                call(auth)
            except InferenceServerException as exc:  # past the rule: refused for its own reason only
                assert exc.status() != "StatusCode.UNAUTHENTICATED"
        assert client.is_model_ready(model)
        assert client.get_model_metadata(model).name == model
    finally:
        client.close()
