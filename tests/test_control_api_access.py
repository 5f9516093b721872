"""The control token guards the same operations over HTTP and gRPC (``control_api.GUARDED_HTTP`` / ``GUARDED_GRPC``):
the control API, shared-memory status / register / unregister, and repository load / unload; inference, health and
metadata stay open."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from recserve.serving.node import control_api
from recserve.serving.wire.errors import InferError
from tests.support import grpc_client, http, models
from tests.support.nodes import node_config, started

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def node():
    model = models.first_dlrm()
    config = node_config(model, scale=1e-4, workers=1)
    config.control_token = TOKEN
    with started(config) as server:
        yield model, server.ports


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
    send = http.get if method == "GET" else http.post_json
    status, body = send(ports.http, path).status_and_json()
    assert status == 401 and body["field"] == "Authorization" and "Bearer <token>" in body["error"]
    status, body = send(ports.http, path, headers=AUTH).status_and_json()
    assert status != 401, body  # past the rule: answered (200) or refused for its own reason (no repository: 501)


def test_http_inference_side_stays_open(node):
    model, ports = node
    assert http.get(ports.http, "/v2/health/ready").status == 200
    assert http.get(ports.http, f"/v2/models/{model}").status == 200
    assert http.post_json(ports.http, "/v2/repository/index").status in (200, 501)


def test_grpc_guarded_operations_need_the_token(node):
    model, ports = node
    client = grpc_client.triton(ports.grpc)
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
