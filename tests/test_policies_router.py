"""The live router: same protocol as a node server, queries dispatched by a policy to backend slots."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from recserve.errors import SpecError
from recserve.measure.requests import RequestPool
from recserve.measure.targets import encode_http_request
from recserve.policies.router import Router, RouterThread, load_pool
from recserve.specs import get_model
from tests.support import http, models
from tests.support.nodes import node_config, started

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


@pytest.fixture(scope="module")
def backend():
    model = models.first_dlrm()
    with started(node_config(model, scale=1e-4, workers=2)) as server:
        yield http.url(server.ports.http), model


def write_pool(tmp_path, url: str, policy: str) -> str:
    path = tmp_path / "pool.yaml"
    path.write_text(f"qos_ms: 200\npolicy: {policy}\nbackends:\n"
                    f"  - {{url: '{url}', type: fast, slots: 1, base: true}}\n"
                    f"  - {{url: '{url}', type: slow, slots: 1}}\n")
    return str(path)


def post(port: int, model: str, body: bytes, header_len: int | None) -> http.Reply:
    """An infer request to the router on ``port``: binary when ``header_len`` says where its JSON ends."""
    return http.post(port, f"/v2/models/{model}/infer", body, headers(header_len), timeout_s=60)


def headers(header_len: int | None) -> dict[str, str]:
    found = {"Content-Type": "application/octet-stream"}
    if header_len is not None:
        found["Inference-Header-Content-Length"] = str(header_len)
    return found


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
            via_router = post(port, model, body, hl)
            direct = http.post(url, f"/v2/models/{model}/infer", body, headers(hl), timeout_s=60)
            assert via_router.status == 200 and direct.status == 200
            return via_router.scores(), direct.scores()

        with ThreadPoolExecutor(4) as ex:
            results = list(ex.map(one, [i % len(pool) for i in range(24)]))
        for a, b in results:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        stats = http.get_json(port, "/router/stats")
        assert stats["completed"] == 24 and stats["errors"] == 0 and stats["queued"] == 0
        assert sum(stats["served"].values()) == 24
        assert stats["policy"]["name"] == ("kairos" if policy == "kairos" else "ribbon")
        reply = post(port, model, b"{not json", None)
        assert reply.status == 400 and b"body" in reply.body
    finally:
        thread.stop()


def test_pool_file_errors_are_clear(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("qos_ms: 50\nbackends: []\n")
    with pytest.raises(SpecError, match="backends: must be non-empty"):
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
            reply = post(port, model, body, hl)
            assert reply.status == 502 and dead.encode() in reply.body
        finally:
            thread.stop()
    thread = RouterThread(Router(load_pool(write_pool(tmp_path, url, "ribbon"))))
    port = thread.start()
    try:
        reply = post(port, "no-such-model", body, hl)
        assert reply.status == 404 and "no-such-model" in reply.json()["error"]
        assert reply.headers["Content-Type"].startswith("application/json")
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
        assert post(port, model, body, hl).status == 404
        assert http.get_json(port, "/router/stats")["errors"] == 1
    finally:
        thread.stop()


def test_metadata_and_readiness_come_from_a_backend_that_answers_and_all_down_is_named(tmp_path, backend):
    """A model's metadata GET skips a backend that refuses connections; with every backend down it is a 502 whose
    JSON names each one, not aiohttp's bare 500."""
    import socket

    url, model = backend
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        pool = tmp_path / "pool.yaml"
        for backends, want in (((dead, url), 200), ((dead,), 502)):
            pool.write_text("qos_ms: 200\npolicy: ribbon\nbackends:\n" + "".join(
                f"  - {{url: '{u}', type: t{i}, slots: 1, base: {str(i == 0).lower()}}}\n"
                for i, u in enumerate(backends)))
            thread = RouterThread(Router(load_pool(pool)))
            port = thread.start()
            try:
                reply = http.get(port, f"/v2/models/{model}")
                assert reply.status == want
                ready = http.get(port, "/v2/health/ready")  # the router's own: some backend ready
                if want == 200:
                    assert reply.json()["name"] == model
                    assert ready.status == 200 and ready.json() == {"ready": True}
                else:
                    assert dead in reply.json()["error"] and "ClientConnectorError" in reply.json()["error"]
                    assert ready.status == 503 and dead in ready.json()["error"]
            finally:
                thread.stop()


def test_route_on_a_taken_port_is_a_one_line_error(tmp_path, capsys):
    import socket

    from recserve.cli import main

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["route", "--pool", write_pool(tmp_path, "http://127.0.0.1:1", "kairos"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"route: cannot listen on 127.0.0.1:{port}" in err and "give another --port" in err
    assert "Traceback" not in err
