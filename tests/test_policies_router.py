"""The live router: same protocol as a node server, queries dispatched by a policy to backend slots."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from recserve.errors import SpecError
from recserve.measure.requests import RequestPool
from recserve.measure.targets import decode_http_response, encode_http_request
from recserve.policies.router import Router, RouterThread, load_pool
from recserve.serving import NodeServer
from recserve.specs import catalogue_models, get_model
from tests.support.nodes import node_config

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


@pytest.fixture(scope="module")
def backend():
    model = sorted(n for n, s in catalogue_models().items() if s.family == "dlrm")[0]
    srv = NodeServer(node_config(model, scale=1e-4, workers=2))
    ports = srv.start()
    try:
        yield f"http://127.0.0.1:{ports.http}", model
    finally:
        srv.stop()


def write_pool(tmp_path, url: str, policy: str) -> str:
    path = tmp_path / "pool.yaml"
    path.write_text(f"qos_ms: 200\npolicy: {policy}\nbackends:\n"
                    f"  - {{url: '{url}', type: fast, slots: 1, base: true}}\n"
                    f"  - {{url: '{url}', type: slow, slots: 1}}\n")
    return str(path)


def post(url: str, body: bytes, header_len: int | None) -> tuple[int, bytes, dict]:
    headers = {"Content-Type": "application/octet-stream"}
    if header_len is not None:
        headers["Inference-Header-Content-Length"] = str(header_len)
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


@pytest.mark.parametrize("policy", ["kairos", "ribbon"])
def test_router_answers_like_the_node_server(tmp_path, backend, policy):
    url, model = backend
    router = Router(load_pool(write_pool(tmp_path, url, policy)))
    thread = RouterThread(router)
    port = thread.start()
    try:
        pool = RequestPool(get_model(model), 1e-4, (16, 40, 120, 8, 64, 200))

        def one(i: int) -> tuple[np.ndarray, np.ndarray]:
            body, hl = encode_http_request(pool.batch(i))
            s1, via_router, h1 = post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", body, hl)
            s2, direct, h2 = post(f"{url}/v2/models/{model}/infer", body, hl)
            assert s1 == 200 and s2 == 200
            a = decode_http_response(via_router, int(h1["Inference-Header-Content-Length"]))["scores"]
            b = decode_http_response(direct, int(h2["Inference-Header-Content-Length"]))["scores"]
            return a, b

        with ThreadPoolExecutor(4) as ex:
            results = list(ex.map(one, [i % len(pool) for i in range(24)]))
        for a, b in results:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/router/stats").read())
        assert stats["completed"] == 24 and stats["errors"] == 0 and stats["queued"] == 0
        assert sum(stats["served"].values()) == 24
        assert stats["policy"]["name"] == ("kairos" if policy == "kairos" else "ribbon")
        status, body, _ = post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", b"{not json", None)
        assert status == 400 and b"body" in body
    finally:
        thread.stop()


def test_pool_file_errors_are_clear(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("backends: []\n")
    with pytest.raises(SpecError, match="backends"):
        load_pool(bad)
    bad.write_text("backends:\n  - {url: 'http://x'}\n")
    with pytest.raises(SpecError, match="qos_ms"):
        load_pool(bad)


def test_a_backend_that_is_down_is_a_502_naming_it_and_errors_pass_through(tmp_path, backend):
    """A refused connection is answered 502 with the backend's URL; a backend's own error (an unknown model: 404)
    reaches the client with its status and JSON body."""
    import socket

    url, model = backend
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        thread = RouterThread(Router(load_pool(write_pool(tmp_path, dead, "ribbon"))))
        port = thread.start()
        try:
            body, hl = encode_http_request(RequestPool(get_model(model), 1e-4, (4,)).batch(0))
            status, answer, _ = post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", body, hl)
            assert status == 502 and dead.encode() in answer
        finally:
            thread.stop()
    thread = RouterThread(Router(load_pool(write_pool(tmp_path, url, "ribbon"))))
    port = thread.start()
    try:
        status, answer, headers = post(f"http://127.0.0.1:{port}/v2/models/no-such-model/infer", body, hl)
        assert status == 404 and "no-such-model" in json.loads(answer)["error"]
        assert headers["Content-Type"].startswith("application/json")
    finally:
        thread.stop()


def test_a_backend_url_with_a_route_prefix_is_posted_under_it(tmp_path, backend):
    """``http://host:port/prefix`` (a Ray Serve route, say): the query goes to ``/prefix/v2/models/...``; a node
    server has no such route and answers 404, which the client gets."""
    url, model = backend
    thread = RouterThread(Router(load_pool(write_pool(tmp_path, f"{url}/some/prefix", "ribbon"))))
    port = thread.start()
    try:
        body, hl = encode_http_request(RequestPool(get_model(model), 1e-4, (4,)).batch(0))
        status, _, _ = post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", body, hl)
        assert status == 404
        assert json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/router/stats").read())["errors"] == 1
    finally:
        thread.stop()
