"""Data plane v2: workers accept and answer their own model's queries; everything else is handed off intact."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request

import aiohttp
import numpy as np
import pytest
import torch

from recserve.errors import SpecError
from recserve.serving import NodeServer, build_worker_model, config_from_dict
from recserve.serving.dataplane import ParseError, parse_head
from recserve.serving.server import _infer_target
from recserve.zoo import sample_batch

DTYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}
MODELS = {"a": "hera-dlrm-a", "b": "hera-ncf"}


@pytest.fixture(scope="module")
def node():
    config = config_from_dict({"models": [
        {"name": "a", "model": MODELS["a"], "scale": 1e-4, "workers": 2, "max_batch_size": 128},
        {"name": "b", "model": MODELS["b"], "scale": 1e-4, "workers": 1, "max_batch_size": 128},
    ]})
    server = NodeServer(config)
    ports = server.start()
    try:
        yield server, ports.http
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cases(node):
    server, _ = node
    out = {}
    for m in server.config.models:
        model = build_worker_model(m).eval()
        batches = [sample_batch(model, 1 + 7 * i, rng=i) for i in range(3)]
        with torch.no_grad():
            out[m.name] = [(b, model(b).numpy()) for b in batches]
    return out


def body_of(batch) -> tuple[bytes, dict[str, str]]:
    arrays = batch.as_arrays()
    head = json.dumps({"inputs": [{"name": n, "datatype": DTYPES[a.dtype], "shape": list(a.shape),
                                   "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(a.tobytes() for a in arrays.values()), {"Inference-Header-Content-Length": str(len(head))}


def scores_of(raw: bytes, header_length: str) -> np.ndarray:
    n = int(header_length)
    out = json.loads(raw[:n])["outputs"][0]
    return np.frombuffer(raw[n:], dtype=np.float32).reshape(out["shape"])


def get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return json.loads(r.read())


def pipe_items(port: int, model: str) -> int:
    return sum(w["items_done"] for w in get(port, f"/control/models/{model}")["stages"]["model"]["worker_detail"])


def successes(port: int, model: str) -> int:
    return get(port, f"/v2/models/{model}/stats")["model_stats"][0]["inference_stats"]["success"]["count"]


async def post_scores(session: aiohttp.ClientSession, name: str, batch) -> np.ndarray:
    body, headers = body_of(batch)
    async with session.post(f"http://127.0.0.1:{session.port}/v2/models/{name}/infer", data=body,
                            headers=headers) as r:
        assert r.status == 200, await r.text()
        return scores_of(await r.read(), r.headers["Inference-Header-Content-Length"])


def test_colocated_models_on_one_connection_are_answered_by_their_own_workers(node, cases):
    """One keep-alive connection alternates models: every answer right, and no query went through the server
    process's pipes (the workers answered them, after at most one hand-off of the connection)."""
    _, port = node
    before = {m: successes(port, m) for m in MODELS}

    async def run() -> list[tuple[str, np.ndarray, np.ndarray]]:
        got = []
        connector = aiohttp.TCPConnector(limit=1)  # one connection for everything
        async with aiohttp.ClientSession(connector=connector) as s:
            s.port = port
            for _round in range(3):
                for name, pairs in cases.items():
                    for batch, expected in pairs:
                        body, headers = body_of(batch)
                        got.append((name, await post_scores(s, name, batch), expected))
        return got

    results = asyncio.run(run())
    assert len(results) == 18
    for name, scores, expected in results:
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6, err_msg=name)
    assert pipe_items(port, "a") == 0 and pipe_items(port, "b") == 0
    for m in MODELS:  # one stats view per node: the workers' reports reach it within milliseconds
        deadline = time.monotonic() + 5
        while successes(port, m) - before[m] < 9 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert successes(port, m) - before[m] == 9


def test_a_connection_mixing_control_and_queries_is_served_right(node, cases):
    """After a control or metrics request a connection stays with the server process (v1 speed, same answers)."""
    _, port = node

    async def run() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
            s.port = port
            for name, pairs in cases.items():
                async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                    assert r.status == 200 and "recserve_requests_total" in await r.text()
                async with s.get(f"http://127.0.0.1:{port}/control/models/{name}") as r:
                    assert r.status == 200 and (await r.json())["name"] == name
                for batch, expected in pairs:
                    np.testing.assert_allclose(await post_scores(s, name, batch), expected, rtol=1e-5, atol=1e-6)

    asyncio.run(run())


def test_sub_batching_hands_queries_to_the_server_and_back(node, cases):
    """sub_batch > 0 needs the node's splitter: workers hand such queries over; scores stay exact."""
    _, port = node
    batch, expected = cases["a"][2]
    body, headers = body_of(batch)

    def post_a() -> np.ndarray:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/a/infer", data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            return scores_of(r.read(), r.headers["Inference-Header-Content-Length"])

    def set_sub_batch(k: int) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/control/models/a/sub_batch",
                                     data=json.dumps({"sub_batch": k}).encode(), method="POST")
        urllib.request.urlopen(req, timeout=30).read()

    items = pipe_items(port, "a")
    set_sub_batch(4)
    try:
        np.testing.assert_allclose(post_a(), expected, rtol=1e-5, atol=1e-6)
        assert pipe_items(port, "a") >= items + -(-batch.size // 4)  # split over the pipes
    finally:
        set_sub_batch(0)
    items = pipe_items(port, "a")
    np.testing.assert_allclose(post_a(), expected, rtol=1e-5, atol=1e-6)
    assert pipe_items(port, "a") == items  # whole queries are the workers' own again


def raw_exchange(port: int, request: bytes, expect_continue: bytes | None = None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        if expect_continue is not None:
            assert s.recv(64).startswith(b"HTTP/1.1 100 Continue")
            s.sendall(expect_continue)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def test_http_edge_cases_on_the_worker_reader(node, cases):
    _, port = node
    batch, expected = cases["b"][1]
    body, headers = body_of(batch)
    head = (f"POST /v2/models/b/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n"
            "Connection: close\r\n").encode()
    # curl-style Expect: 100-continue
    reply = raw_exchange(port, head + b"Expect: 100-continue\r\n\r\n", expect_continue=body)
    status, _, rest = reply.partition(b"\r\n")
    assert status == b"HTTP/1.1 200 OK", reply[:200]
    hdrs, _, payload = rest.partition(b"\r\n\r\n")
    length = next(line.split(b":")[1].strip() for line in hdrs.split(b"\r\n")
                  if line.lower().startswith(b"inference-header-content-length"))
    np.testing.assert_allclose(scores_of(payload, length.decode()), expected, rtol=1e-5, atol=1e-6)
    # chunked bodies are handed to the server's aiohttp, which reads them
    chunked = (f"POST /v2/models/b/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n"
               f"Connection: close\r\n\r\n{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"
    assert raw_exchange(port, chunked).startswith(b"HTTP/1.1 200 OK")
    # garbage and oversized bodies: JSON errors, connection closed
    bad = raw_exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert bad.startswith(b"HTTP/1.1 400") and b'"error"' in bad
    big = raw_exchange(port, b"POST /v2/models/b/infer HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n")
    assert big.startswith(b"HTTP/1.1 413") and b"exceed" in big


def test_parse_head_and_routing_helpers():
    buf = bytearray(b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nContent-Length: 3\r\nX-A:  b \r\n\r\nabc")
    end, method, path, version, headers = parse_head(buf)
    assert (buf[end:], method, path, version) == (b"abc", "POST", "/v2/models/m/infer?x=1", "HTTP/1.1")
    assert headers == {"content-length": "3", "x-a": "b"}
    assert parse_head(bytearray(b"POST / HTTP/1.1\r\nHost")) is None
    with pytest.raises(ParseError):
        parse_head(bytearray(b"POST /\r\n\r\n"))
    assert _infer_target(b"POST /v2/models/m/infer HTTP/1.1\r\n") == "m"
    assert _infer_target(b"POST /v2/models/m/versions/1/infer?q HTTP/1.1\r\n") == "m"
    assert _infer_target(b"GET /v2/models/m/infer HTTP/1.1\r\n") is None
    assert _infer_target(b"POST /control/models/m/workers HTTP/1.1\r\n") is None


def test_front_end_is_validated_and_the_v1_layout_still_serves(cases):
    with pytest.raises(SpecError, match="front_end"):
        config_from_dict({"front_end": "nginx", "models": [{"model": MODELS["b"], "scale": 1e-4}]})
    config = config_from_dict({"front_end": "server", "models": [{"name": "b", "model": MODELS["b"],
                                                                   "scale": 1e-4, "max_batch_size": 128}]})
    batch, expected = cases["b"][0]
    body, headers = body_of(batch)
    with NodeServer(config) as server:
        port = server.ports.http
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/b/infer", data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            scores = scores_of(r.read(), r.headers["Inference-Header-Content-Length"])
        assert pipe_items(port, "b") == 1  # v1: the server process decoded it and shipped it over the pipe
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
