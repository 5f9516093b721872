"""Data plane v2: workers accept and answer their own model's queries; everything else is handed off intact."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import aiohttp
import numpy as np
import pytest
import torch

from recserve.errors import SpecError
from recserve.serving import build_worker_model, config_from_dict
from recserve.serving.node.core import _infer_target
from recserve.serving.transport.http1 import HEADS, HeadError, _heads, read_head
from recserve.zoo import sample_batch
from tests.support import grpc_client, http
from tests.support.nodes import generous, started
from tests.support.oip_inputs import DTYPE_NAMES, grpc_inputs
from tests.support.proc_net import holder, tcp_inodes
from tests.support.scrape import metric_value, scrape
from tests.support.wait import run_until, until

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


def answered(sock: socket.socket) -> bool:
    """Whether bytes (an answer) wait to be read on ``sock``."""
    return bool(select.select([sock], [], [], 0)[0])

MODELS = {"a": "hera-dlrm-a", "b": "hera-ncf"}


@pytest.fixture(scope="module")
def node():
    config = config_from_dict({"models": [
        {"name": "a", "model": MODELS["a"], "scale": 1e-4, "workers": 2, "max_batch_size": 128},
        {"name": "b", "model": MODELS["b"], "scale": 1e-4, "workers": 1, "max_batch_size": 128,
         "deadline_ms": 30_000},  # tests of deadlines set their own; the others must not depend on the host's speed
    ]})
    with started(config) as server:
        ports = server.ports
        yield server, ports.http


@pytest.fixture(scope="module")
def grpc_node():
    config = config_from_dict({"models": [
        {"name": "a", "model": MODELS["a"], "scale": 1e-4, "workers": 2, "max_batch_size": 128},
        {"name": "b", "model": MODELS["b"], "scale": 1e-4, "workers": 1, "max_batch_size": 128,
         "deadline_ms": 30_000}]})
    with started(config) as server:
        yield server.ports


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
    head = json.dumps({"inputs": [{"name": n, "datatype": DTYPE_NAMES[a.dtype], "shape": list(a.shape),
                                   "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(a.tobytes() for a in arrays.values()), {"Inference-Header-Content-Length": str(len(head))}


def infer_head(model: str, body: bytes, headers: dict[str, str], extra: str = "\r\n") -> bytes:
    """The HTTP head of a binary infer request for ``body`` (``extra``: more header lines, then the blank line)."""
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n{extra}").encode()


def scores_of(raw: bytes, header_length: str) -> np.ndarray:
    n = int(header_length)
    out = json.loads(raw[:n])["outputs"][0]
    return np.frombuffer(raw[n:], dtype=np.float32).reshape(out["shape"])


def pipe_items(port: int, model: str) -> int:
    detail = http.get_json(port, f"/control/models/{model}")["stages"]["model"]["worker_detail"]
    return sum(w["items_done"] for w in detail)


def successes(port: int, model: str) -> int:
    return http.get_json(port, f"/v2/models/{model}/stats")["model_stats"][0]["inference_stats"]["success"]["count"]


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
        deadline = time.monotonic() + 60
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
        reply = http.post(port, "/v2/models/a/infer", body, headers)
        assert reply.status == 200, reply.body[:300]
        return reply.scores()

    def set_sub_batch(k: int) -> None:
        reply = http.post_json(port, "/control/models/a/sub_batch", {"sub_batch": k})
        assert reply.status == 200, reply.body[:300]

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
    head = infer_head("b", body, headers, "Connection: close\r\n")
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
    big = raw_exchange(port, b"POST /v2/models/b/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n")
    assert big.startswith(b"HTTP/1.1 413") and b"exceed" in big


def test_parse_head_and_routing_helpers():
    buf = bytearray(b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nX-A:  b \r\n\r\nabc")
    end, head = read_head(buf)
    assert (buf[end:], head.method, head.path, head.version) == (b"abc", "POST", "/v2/models/m/infer?x=1", "HTTP/1.1")
    assert head.headers == {"host": "h", "content-length": "3", "x-a": "b"} and head.length == 3
    assert read_head(bytearray(b"POST / HTTP/1.1\r\nHost")) is None
    with pytest.raises(HeadError):
        read_head(bytearray(b"POST /\r\n\r\n"))
    with pytest.raises(HeadError):  # a refused head is never remembered as parsed
        read_head(bytearray(b"POST /\r\n\r\n"))
    again = read_head(bytearray(bytes(buf[:end]) + b"xyz12"))  # a head seen before: the same answer
    assert again == (end, head)
    other = read_head(bytearray(bytes(buf[:end]).replace(b"Content-Length: 3", b"Content-Length: 4")))
    assert other[1].headers == {"host": "h", "content-length": "4", "x-a": "b"}  # parsed, not confused with the first
    for n in range(HEADS + 3):  # many distinct heads: the store stays bounded and every answer right
        assert read_head(bytearray(f"GET /{n} HTTP/1.1\r\nHost: h\r\n\r\n".encode()))[1].path == f"/{n}"
    assert len(_heads) <= HEADS
    assert _infer_target(b"POST /v2/models/m/infer HTTP/1.1\r\n") == "m"
    assert _infer_target(b"POST /v2/models/m/versions/1/infer?q HTTP/1.1\r\n") == "m"
    assert _infer_target(b"GET /v2/models/m/infer HTTP/1.1\r\n") is None
    assert _infer_target(b"POST /control/models/m/workers HTTP/1.1\r\n") is None


def test_front_end_is_validated_and_the_v1_layout_still_serves(cases):
    with pytest.raises(SpecError, match="front_end"):
        config_from_dict({"front_end": "nginx", "models": [{"model": MODELS["b"], "scale": 1e-4}]})
    config = config_from_dict({"front_end": "server", "models": [generous({"name": "b", "model": MODELS["b"],
                                                                   "scale": 1e-4, "max_batch_size": 128})]})
    batch, expected = cases["b"][0]
    body, headers = body_of(batch)
    with started(config) as server:
        port = server.ports.http
        reply = http.post(port, "/v2/models/b/infer", body, headers)
        assert reply.status == 200, reply.body[:300]
        scores = reply.scores()
        assert pipe_items(port, "b") == 1  # v1: the server process decoded it and shipped it over the pipe
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- admission, deadlines, fusion, faults


def with_parameters(batch, **parameters) -> tuple[bytes, dict[str, str]]:
    """A binary-extension request with extra request-level ``parameters``."""
    arrays = batch.as_arrays()
    head = json.dumps({"inputs": [{"name": n, "datatype": DTYPE_NAMES[a.dtype], "shape": list(a.shape),
                                   "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()],
                       "parameters": {"binary_data_output": True, **parameters}}).encode()
    return head + b"".join(a.tobytes() for a in arrays.values()), {"Inference-Header-Content-Length": str(len(head))}


def worker_pids(port: int, model: str) -> list[int]:
    return [w["pid"] for w in http.get_json(port, f"/control/models/{model}")["stages"]["model"]["worker_detail"]]


def test_client_timeout_is_a_deadline_and_is_validated(node, cases):
    """``parameters.timeout`` (microseconds, Triton's convention): a query whose timeout passed before a worker
    admitted it is answered 504 without being computed (one queued behind others past it too:
    ``test_admission.py``); a malformed one is a 400 naming the field."""
    _, port = node
    batch, expected = cases["b"][0]
    for bad in (0, -5, 1.5, "10", True):
        reply = http.post(port, "/v2/models/b/infer", *with_parameters(batch, timeout=bad))
        assert reply.status == 400 and reply.json()["field"] == "parameters.timeout", (bad, reply.body)
    reply = http.post(port, "/v2/models/b/infer", *with_parameters(batch, timeout=10_000_000))
    assert reply.status == 200
    np.testing.assert_allclose(reply.scores(), expected, rtol=1e-5, atol=1e-6)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: http.post(port, "/v2/models/b/infer", *with_parameters(batch, timeout=1)),
                                range(8)))
    # 1 us has passed by the time a worker admits any of them: each is a 504, none computed
    assert [answer.status for answer in answers] == [504] * 8, [answer.body[:200] for answer in answers]
    assert all("timeout passed" in answer.json()["error"] for answer in answers)
    deadline = time.monotonic() + 60
    labels = {"model": "b", "version": "1", "code": "deadline"}
    while (metric_value(scrape(port), "recserve_request_errors_total", **labels) or 0) < 8:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_queued_queries_are_fused_into_one_pass_with_the_same_scores(node, cases):
    """Queries that are queued together run as one forward pass (Triton-style dynamic batching) and each gets
    exactly its own scores."""
    _, port = node
    stats = http.get_json(port, "/v2/models/b/stats")["model_stats"][0]
    pids = worker_pids(port, "b")
    pairs = cases["b"] * 3

    body_bytes = sum(len(body_of(batch)[0]) for batch, _ in pairs)

    async def burst() -> list[np.ndarray]:
        written, all_written = [0], asyncio.Event()

        async def on_chunk_sent(session, context, params) -> None:
            written[0] += len(params.chunk)
            if written[0] >= body_bytes:
                all_written.set()

        async def resume_once_all_are_sent() -> None:  # the stopped workers find every query waiting
            try:
                await asyncio.wait_for(all_written.wait(), 60)
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)

        trace = aiohttp.TraceConfig()
        trace.on_request_chunk_sent.append(on_chunk_sent)
        async with aiohttp.ClientSession(trace_configs=[trace]) as s:
            s.port = port
            resume = asyncio.ensure_future(resume_once_all_are_sent())
            got = await asyncio.gather(*(post_scores(s, "b", batch) for batch, _ in pairs))
            await resume
            return got

    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        got = asyncio.run(burst())
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    for scores, (_, expected) in zip(got, pairs, strict=True):
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    # the workers report their counts within STATS_FLUSH_S, later on a busy host
    after = until(lambda: http.get_json(port, "/v2/models/b/stats")["model_stats"][0],
                  lambda now: now["inference_stats"]["success"]["count"]
                  - stats["inference_stats"]["success"]["count"] >= len(pairs))
    queries = after["inference_stats"]["success"]["count"] - stats["inference_stats"]["success"]["count"]
    passes = after["execution_count"] - stats["execution_count"]
    assert queries == len(pairs) and passes < queries, (queries, passes)


def test_concat_arrays_is_the_batch_of_the_concatenated_samples(cases):
    from recserve.zoo.batch import QueryBatch, concat_arrays

    parts = [b for b, _ in cases["a"]]
    fused = concat_arrays([(b.dense.numpy(), b.values.numpy(), b.lengths.numpy()) for b in parts])
    fused_batch = QueryBatch(*(torch.from_numpy(a) for a in fused))
    start = 0
    for b in parts:
        piece = fused_batch.slice(start, start + b.size)
        start += b.size
        for x, y in zip((piece.dense, piece.values, piece.lengths), (b.dense, b.values, b.lengths), strict=True):
            assert torch.equal(x, y.to(x.dtype))


def test_service_time_fit_predicts_fixed_and_per_item_cost():
    from recserve.serving.worker.admission import ServiceTime

    fit = ServiceTime()
    assert fit.predict(100) == 0.0  # nothing learned: admit
    for items in (1, 10, 100, 1000) * 5:
        fit.observe(items, 0.001 + 2e-6 * items)
    fixed, per_item = fit.coefficients()
    assert fixed == pytest.approx(0.001, rel=1e-3) and per_item == pytest.approx(2e-6, rel=1e-3)
    assert fit.predict(500, passes=2) == pytest.approx(0.002 + 0.001, rel=1e-3)


@pytest.fixture
def fragile_node():
    config = config_from_dict({"read_timeout_s": 1.0, "models": [
        {"name": "h", "model": MODELS["b"], "scale": 1e-4, "workers": 1, "max_batch_size": 128,
         "hang_timeout_s": 1.0, "deadline_ms": 2000}]})
    with started(config) as server:
        yield server.ports.http


def test_a_hung_worker_answers_504_turns_unready_and_is_replaced(fragile_node, cases):
    port = fragile_node
    batch, expected = cases["b"][1]
    body, headers = body_of(batch)
    (pid,) = worker_pids(port, "h")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = infer_head("h", body, headers)
        s.sendall(head + body)
        assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")  # this connection now lives in the worker
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        s.sendall(head + body)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
        waited = time.monotonic() - start
    assert reply.startswith(b"HTTP/1.1 504") and b"stopped responding" in reply, reply[:300]
    assert waited < 10, waited  # bounded by hang_timeout_s plus the watchdog's tick, not by the client
    seen_unready = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = http.get(port, "/v2/models/h/ready").status
        if status == 200:
            if seen_unready:
                break
        else:
            assert status == 503
            seen_unready = True
        time.sleep(0.02)
    assert seen_unready
    state = http.get_json(port, "/control/models/h")
    assert state["worker_restarts"] == 1 and worker_pids(port, "h") != [pid]
    reply = http.post(port, "/v2/models/h/infer", body, headers)
    assert reply.status == 200
    np.testing.assert_allclose(reply.scores(), expected, rtol=1e-5, atol=1e-6)


def _read_reply(s: socket.socket) -> bytes:
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply) < reply.index(b"\r\n\r\n") + 4 + int(
            dict(h.split(b": ", 1) for h in reply.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]
                 if b": " in h).get(b"Content-Length", b"0")):
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    return reply


def test_a_dying_worker_costs_only_its_own_queries(cases):
    """SIGKILL a worker holding a query (a request half read), an idle connection and a request it never read:
    the held query is answered 500 naming the worker, the unread request and the idle connection are served."""
    config = config_from_dict({"models": [{"name": "h", "model": MODELS["b"], "scale": 1e-4, "workers": 1,
                                           "max_batch_size": 128, "hang_timeout_s": 60.0, "deadline_ms": 30_000}]})
    batch, expected = cases["b"][1]
    body, headers = body_of(batch)
    head = infer_head("h", body, headers)
    with started(config) as server:
        port = server.ports.http
        (pid,) = worker_pids(port, "h")
        idle, unread, held = (socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(3))
        try:
            for s in (idle, unread):
                s.sendall(head + body)
                assert _read_reply(s).startswith(b"HTTP/1.1 200 OK")  # both now live in the worker
            held.sendall(head + body[: len(body) // 2])
            time.sleep(0.5)  # the worker reads the first half: a request in progress
            os.kill(pid, signal.SIGSTOP)
            unread.sendall(head + body)  # the stopped worker never reads it
            time.sleep(0.2)
            os.kill(pid, signal.SIGKILL)
            reply = _read_reply(held)
            assert reply.startswith(b"HTTP/1.1 500") and f"worker pid {pid} died".encode() in reply, reply[:300]
            reply = _read_reply(unread)
            assert reply.startswith(b"HTTP/1.1 200 OK"), reply[:300]
            got = scores_of(reply.split(b"\r\n\r\n", 1)[1], headers_of(reply)["inference-header-content-length"])
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
            idle.sendall(head + body)  # the idle keep-alive connection was kept open and moved on
            assert _read_reply(idle).startswith(b"HTTP/1.1 200 OK")
        finally:
            for s in (idle, unread, held):
                s.close()
        stats = http.get_json(port, "/v2/models/h/stats")["model_stats"][0]["inference_stats"]
        assert stats["fail"]["count"] >= 1


def connection_owner(client: socket.socket, pids: list[int]) -> int | None:
    """Which of ``pids`` serves the server side of ``client``'s TCP connection (from /proc/net/tcp inodes)."""
    local_port, peer_port = client.getsockname()[1], client.getpeername()[1]
    return holder(tcp_inodes(lambda local, remote, _state: local == peer_port and remote == local_port), pids)


@contextmanager
def connections_in_one_of_two_workers(request: bytes, count: int) -> Iterator[tuple[int, int, list[socket.socket]]]:
    """A node of two workers of model ``h`` and ``count`` keep-alive connections that all live in the first (the
    second is stopped while they connect and carry one ``request`` each): (first, second, the clients)."""
    config = config_from_dict({"models": [{"name": "h", "model": MODELS["a"], "scale": 1e-4, "workers": 2,
                                           "max_batch_size": 128, "deadline_ms": 30_000, "fuse_items": 0}]})
    with started(config) as server:
        port = server.ports.http
        first, second = worker_pids(port, "h")
        os.kill(second, signal.SIGSTOP)
        try:
            clients = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(count)]
            for s in clients:
                s.sendall(request)
                assert _read_reply(s).startswith(b"HTTP/1.1 200 OK")
        finally:
            os.kill(second, signal.SIGCONT)
        try:
            assert {connection_owner(s, [first, second]) for s in clients} == {first}
            yield first, second, clients
        finally:
            for s in clients:
                s.close()


def test_an_idle_worker_takes_connections_from_a_worker_with_a_backlog(cases):
    """All four keep-alive connections land on one worker; with queries queued there, it moves a connection that
    goes idle to its idle sibling, which then serves it."""
    batch, _ = cases["a"][2]
    body, headers = body_of(batch)
    request = infer_head("h", body, headers) + body
    with connections_in_one_of_two_workers(request, 4) as (busy, idle, clients):
        owners: list[int | None] = []
        for _ in range(30):
            for s in clients:  # four at once: some wait behind others at the busy worker
                s.sendall(request)
            for s in clients:
                assert _read_reply(s).startswith(b"HTTP/1.1 200 OK")
            owners = [connection_owner(s, [busy, idle]) for s in clients]
            if idle in owners:
                break
        assert idle in owners and busy in owners, owners


def test_connections_spread_over_the_workers_by_how_many_each_serves(cases):
    """Eight keep-alive connections land on one worker; each then carries one query at a time, so no queue forms
    and the backlog rule never moves one.  The worker serving two or more connections than its sibling moves them
    as they go idle until each serves half."""
    batch, _ = cases["a"][0]
    body, headers = body_of(batch)
    request = infer_head("h", body, headers) + body
    with connections_in_one_of_two_workers(request, 8) as (first, second, clients):
        owners = [first] * 8
        deadline = time.monotonic() + 60  # a few sweeps (1 s each) on a quiet host
        while abs(owners.count(first) - owners.count(second)) > 1 and time.monotonic() < deadline:
            for s in clients:  # one at a time: never a query queued behind another
                s.sendall(request)
                assert _read_reply(s).startswith(b"HTTP/1.1 200 OK")
            owners = [connection_owner(s, [first, second]) for s in clients]
        assert owners.count(first) == owners.count(second) == 4, owners


def headers_of(reply: bytes) -> dict[str, str]:
    lines = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


def test_slow_clients_are_cut_off_and_health_keeps_answering(fragile_node):
    port = fragile_node
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(20)]
    try:
        for s in socks:  # a body promised and never sent
            s.sendall(b"POST /v2/models/h/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\"")
        assert http.get_json(port, "/v2/health/live") == {"live": True}
        replies = [s.recv(65536) for s in socks]  # within read_timeout_s plus one sweep
    finally:
        for s in socks:
            s.close()
    assert all(r.startswith(b"HTTP/1.1 408") for r in replies), replies[:2]
    labels = {"model": "h", "version": "1", "reason": "slow_client"}
    deadline = time.monotonic() + 60  # within milliseconds, unless the host is busy
    while metric_value(scrape(port), "recserve_requests_refused_total", **labels) != 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric_value(scrape(port), "recserve_requests_refused_total", **labels) == 20


def test_grpc_queries_are_answered_by_the_workers_and_other_calls_are_forwarded(grpc_node, cases):
    """Workers listen on the public gRPC port too: their model's ModelInfer never crosses a pipe; metadata,
    readiness, statistics, other models and streams are forwarded to the server process."""

    ports = grpc_node
    client = grpc_client.triton(ports.grpc)
    assert client.is_server_ready() and client.is_model_ready("a") and not client.is_model_ready("nope")
    assert client.get_model_metadata("b").name == "b"
    for _ in range(3):  # new connections land on any worker: each forwards what is not its own
        client = grpc_client.triton(ports.grpc)
        for name, pairs in cases.items():
            for batch, expected in pairs:
                scores = client.infer(name, grpc_inputs(batch), client_timeout=30).as_numpy("scores")
                np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    served_here = pipe_items(ports.http, "a") + pipe_items(ports.http, "b")
    assert served_here < 18  # queries that met a worker of their own model did not cross a pipe
    stats = until(lambda: client.get_inference_statistics("a").model_stats[0],
                  lambda s: s.inference_stats.success.count >= 9)
    assert stats.inference_stats.success.count >= 9
    computed = stats.inference_stats  # perf_analyzer aborts over gRPC unless the three compute counts agree
    assert computed.compute_input.count == computed.compute_infer.count == computed.compute_output.count > 0


def test_huge_json_is_refused_and_health_answers_during_a_long_decode():
    """Above ``max_json_bytes`` the JSON part is refused before it is decoded (413 pointing at the binary
    extension); below it, while the only worker decodes for a long time, health is still answered (the server
    accepts while no worker does)."""
    config = config_from_dict({"max_json_bytes": 24 * 1024 * 1024, "models": [
        generous({"name": "h", "model": MODELS["b"], "scale": 1e-4, "workers": 1, "max_batch_size": 128})]})
    with started(config) as server:
        check_huge_json(server.ports.http)


def check_huge_json(port: int) -> None:
    floats = 3_000_000  # ~15 MB of JSON: seconds of decoding on a small host
    big = b'{"inputs": [{"name": "dense", "datatype": "FP32", "shape": [1, %d], "data": [' % floats
    big += b"0.5, " * (floats - 1) + b"0.5]}]}"
    reply = http.post(port, "/v2/models/h/infer", big + b" " * (25 * 1024 * 1024 - len(big)))
    assert reply.status == 413 and "binary" in reply.json()["error"]
    answer: dict = {}
    sender = threading.Thread(target=lambda: answer.update(result=http.post(port, "/v2/models/h/infer", big)))
    sender.start()
    slowest = 0.0
    while sender.is_alive():
        start = time.monotonic()
        assert http.get_json(port, "/v2/health/live") == {"live": True}
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.05)
    sender.join()
    assert answer["result"].status == 400  # decoded, then refused: the shape does not fit the model
    assert slowest < 5.0, slowest  # bounded by the watchdog's tick and RESPONSIVE_S, not by the decode


def test_admission_by_count_and_by_time_on_one_worker_queue():
    """The worker's admission rule, with a model whose pass takes a known time: alone a query is always tried;
    behind others it is shed (503 naming its deadline) when the fitted pass time says it would be late, and the
    queue length bounds admission whatever the deadline."""
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    class SlowPath:
        def compute(self, queries):
            time.sleep(0.02 * len(queries))
            return [np.zeros((q[0].shape[0], 1), np.float32) for q in queries]

    loop = asyncio.new_event_loop()
    try:
        plane = WorkerPlane(loop, "m", SlowPath(), lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=3, deadline_s=10.0, fuse_items=0, compute_thread_ms=-1),
                            sub_batch=0)
        for _ in range(20):
            plane.admission.service.observe(4, 0.02)  # learned: 20 ms a pass
        answers = []

        def reply(scores, error):
            answers.append(str(error) if error is not None else "ok")

        query = (np.zeros((4, 1), np.float32), np.zeros(0, np.int64), np.zeros((0, 4), np.int32))
        for timeout in (10.0, 0.001, 0.001, 10.0, 10.0, 10.0, 10.0):
            plane.enqueue(query, 4, time.perf_counter(), timeout, reply)
        # the 1st found the worker idle and was computed at once; the rest arrived while its next turn was pending.
        # Shed at once: the 3rd (it would finish after its 1 ms deadline behind the 2nd), the 6th and 7th (3 queued)
        assert answers[0] == "ok" and len(answers) == 4 and "after its deadline" in answers[1]
        assert "deadline_ms in the node config (10000 ms here)" in answers[1]  # says how to move it
        assert all("queued at this worker (limit 3)" in a for a in answers[2:])
        run_until(loop, lambda: len(answers) == 7)  # the queued ones are answered
        assert answers.count("ok") == 4 and len(answers) == 7
    finally:
        loop.close()


def test_a_worker_with_a_load_slot_queues_past_its_share_until_the_model_holds_its_limit():
    """A worker given the model's shared loads counts every worker's queries against ``model_queue_limit``: with its
    share at 1 it still queues while its siblings hold little, publishes what it holds, and refuses (503 naming the
    model's count) once its own and its siblings' queries reach the model's limit."""
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    class NoPath:
        def compute(self, queries):
            return [np.zeros((q[0].shape[0], 1), np.float32) for q in queries]

    loads = np.full(4, -1, np.int32)
    loads[1] = 2  # a sibling holding two queries
    loop = asyncio.new_event_loop()
    try:
        plane = WorkerPlane(loop, "m", NoPath(), lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=1, model_queue_limit=6, deadline_s=10.0, fuse_items=0,
                                        compute_thread_ms=-1), sub_batch=0, loads=loads, slot=0)
        answers = []
        query = (np.zeros((4, 1), np.float32), np.zeros(0, np.int64), np.zeros((0, 4), np.int32))
        for _ in range(6):
            plane.enqueue(query, 4, time.perf_counter(), 10.0, lambda scores, error: answers.append(error))
        # the 1st is computed at once (the worker was idle); the 2nd to 5th queue (its 4 and the sibling's 2 are the
        # model's 6, against a share of 1), the 6th is refused
        assert loads[0] == 4 and len(answers) == 2
        assert "its workers hold 6 queries (queue_limit 6)" in str(answers[1])
        run_until(loop, lambda: len(answers) == 6 and loads[0] == 0)  # the queued ones are answered
        assert answers.count(None) == 5 and len(answers) == 6 and loads[0] == 0
    finally:
        loop.close()


def test_a_long_pass_runs_off_the_loop_so_queries_are_shed_while_it_computes():
    """A pass the fit predicts at ``compute_thread_ms`` or more runs on the compute thread: a query arriving
    meanwhile is admitted or shed at once (not after the pass), admission counts what is left of the pass in
    flight although the queue is empty, and the queries admitted behind it are computed in the next pass."""
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    computing, release, pass_ended = threading.Event(), threading.Event(), []

    class SlowPath:
        def compute(self, queries):
            computing.set()
            release.wait(30)  # the pass lasts until the test has sent what arrives during it
            pass_ended.append(time.perf_counter())
            return [np.zeros((q[0].shape[0], 1), np.float32) for q in queries]

    loop = asyncio.new_event_loop()
    try:
        plane = WorkerPlane(loop, "m", SlowPath(), lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=8, deadline_s=10.0, compute_thread_ms=2.0), sub_batch=0)
        for _ in range(20):
            plane.admission.service.observe(4, 1.0)  # learned: 1 s a pass, so passes go to the compute thread
        answers: list[tuple[str, float]] = []

        def reply(scores, error):
            answers.append(("ok" if error is None else str(error), time.perf_counter()))

        query = (np.zeros((4, 1), np.float32), np.zeros(0, np.int64), np.zeros((0, 4), np.int32))
        started = time.perf_counter()
        plane.enqueue(query, 4, started, 10.0, reply)  # alone: computed, on the compute thread
        assert computing.wait(30) and not answers and plane.admission.busy_s() > 0
        plane.enqueue(query, 4, time.perf_counter(), 0.05, reply)  # 50 ms left < the ~1 s pass ahead: shed now
        assert len(answers) == 1 and "after its deadline" in answers[0][0]
        plane.enqueue(query, 4, time.perf_counter(), 10.0, reply)  # time enough: queued behind the pass
        release.set()
        run_until(loop, lambda: len(answers) == 3 and plane.admission.busy_s() == 0)
        assert answers[0][1] < pass_ended[0]  # answered while the first pass was still computing
        assert [a for a, _ in answers] == [answers[0][0], "ok", "ok"] and plane.admission.busy_s() == 0
    finally:
        loop.close()


def _busy_plane(loop: asyncio.AbstractEventLoop, arrivals: int, decoded: list[int] | None = None):
    """A plane under load: each inline pass (20 ms) sees another query arrive, ``arrivals`` times, behind a queue
    of one; its path records the length of each body it decodes in ``decoded``."""
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    query = (np.zeros((1, 1), np.float32),)

    class FakePath:
        left = arrivals

        def decode(self, body, header_length):
            if decoded is not None:
                decoded.append(len(body))
            return {}, query, 1

        def compute(self, queries):
            time.sleep(0.02)
            if self.left:
                self.left -= 1
                plane.enqueue(query, 1, time.perf_counter(), None, lambda scores, error: None)
            return [np.zeros((1, 1), np.float32) for _ in queries]

        def encode(self, request, scores):
            return b"ok", {"Content-Type": "text/plain"}

    plane = WorkerPlane(loop, "m", FakePath(), lambda msg: None, lambda *handoff: None,
                        PlaneLimits(queue_limit=1, deadline_s=10.0, fuse_items=0, compute_thread_ms=-1),
                        sub_batch=0)  # inline passes: ``compute`` enqueues the next arrival on the loop's thread
    return plane, query


def test_a_large_query_is_shed_from_its_json_header_and_its_body_dropped():
    """Under overload a large query is refused (503 + Retry-After) as soon as its JSON header is in, before its
    body: the body is then dropped as it arrives and the connection serves its next request normally."""
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    try:
        plane, query = _busy_plane(loop, arrivals=10)
        loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))
        plane.enqueue(query, 1, time.perf_counter(), None, lambda scores, error: None)  # computed at once
        assert len(plane.admission.queue) == 1  # the queue (limit 1) is full
        header = json.dumps({"inputs": [{"name": "dense", "datatype": "FP32", "shape": [2048, 13],
                                         "parameters": {"binary_data_size": 2048 * 13 * 4}}]}).encode()
        body = header + bytes(2048 * 13 * 4)  # over 64 KiB: a body received in place
        head = (f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                f"Inference-Header-Content-Length: {len(header)}\r\n\r\n").encode()
        theirs.sendall(head + body[:4096])  # the JSON header and a little of the body
        run_until(loop, lambda: answered(theirs))
        theirs.settimeout(5)
        reply = theirs.recv(65536)
        assert reply.startswith(b"HTTP/1.1 503") and b"Retry-After:" in reply and b"overloaded" in reply, reply
        theirs.sendall(body[4096:])  # the rest is dropped, not decoded
        run_until(loop, lambda: not plane.admission.busy())  # meanwhile the queued queries are computed
        small = b"{}"
        theirs.sendall(f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(small)}\r\n"
                       "\r\n".encode() + small)
        run_until(loop, lambda: answered(theirs))
        assert theirs.recv(65536).startswith(b"HTTP/1.1 200 OK")
    finally:
        theirs.close()
        loop.close()


def _json_post(body: bytes) -> bytes:
    """A plain-JSON infer request for model ``m`` carrying ``body``."""
    return (f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\n\r\n").encode() + body


def test_a_large_plain_json_query_is_shed_from_its_skeleton_without_being_decoded():
    """Under overload a large plain-JSON query is refused (503 + Retry-After) from its skeleton (the request without
    its ``data`` arrays), before its ~4 ms decode; one the skeleton cannot read is decoded as always, and with the
    worker idle a large JSON query is decoded and answered."""
    rows = 512
    good = json.dumps({"inputs": [{"name": "dense", "shape": [rows, 13], "datatype": "FP32",
                                   "data": [0.5] * (rows * 13)}]}).encode()
    unreadable = good.replace(b'"data"', b'"d\\u0061ta"', 1)  # an escape: the skeleton cannot be sure
    assert len(good) >= 32 * 1024 and b"\\" in unreadable
    decoded: list[int] = []
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    try:
        plane, query = _busy_plane(loop, arrivals=12, decoded=decoded)
        loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))
        theirs.settimeout(5)
        plane.enqueue(query, 1, time.perf_counter(), None, lambda scores, error: None)  # computed at once
        assert len(plane.admission.queue) == 1  # the queue (limit 1) is full
        theirs.sendall(_json_post(good))
        run_until(loop, lambda: answered(theirs))
        reply = theirs.recv(65536)
        assert reply.startswith(b"HTTP/1.1 503") and b"Retry-After:" in reply and b"overloaded" in reply, reply
        assert decoded == []  # refused from its skeleton: never decoded
        theirs.sendall(_json_post(unreadable))  # still under load: decoded, then refused by the usual check
        run_until(loop, lambda: answered(theirs))
        assert theirs.recv(65536).startswith(b"HTTP/1.1 503") and decoded == [len(unreadable)]
        run_until(loop, lambda: not plane.admission.busy())  # the queued queries are computed: the worker goes idle
        assert not plane.admission.busy()
        theirs.sendall(_json_post(good))
        run_until(loop, lambda: answered(theirs))
        assert theirs.recv(65536).startswith(b"HTTP/1.1 200 OK") and decoded[-1] == len(good)
    finally:
        theirs.close()
        loop.close()


def test_a_large_body_is_received_whole_with_its_binary_tensors_aligned():
    """A body of 64 KiB or more is received in place into an uninitialised buffer: every byte must be the client's,
    and the binary part after the JSON header must start 64-byte aligned (numpy reads unaligned ids at half
    speed), whatever the header's length and however the body is split into reads."""
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    seen = []

    class FakePath:
        def decode(self, body, header_length):
            n = int(header_length)
            seen.append((bytes(body), np.frombuffer(body, np.uint8)[n:].ctypes.data % 64))
            return {}, (np.zeros((1, 1), np.float32),), 1

        def compute(self, queries):
            return [np.zeros((1, 1), np.float32) for _ in queries]

        def encode(self, request, scores):
            return b"ok", {"Content-Type": "text/plain"}

    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    rng = np.random.default_rng(3)
    sent = []
    try:
        plane = WorkerPlane(loop, "m", FakePath(), lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=4, deadline_s=10.0, compute_thread_ms=-1), sub_batch=0)
        loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))
        theirs.settimeout(5)
        for pad in (0, 1, 7, 37):
            header = json.dumps({"inputs": [], "pad": "x" * pad}).encode()
            body = header + rng.integers(0, 256, 100_000 + pad, dtype=np.uint8).tobytes()
            head = (f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                    f"Inference-Header-Content-Length: {len(header)}\r\n\r\n").encode()
            wire = head + body
            for start in range(0, len(wire), 30_001):  # several reads, the first ending inside the body
                theirs.sendall(wire[start : start + 30_001])
                loop.run_until_complete(asyncio.sleep(0.01))
            run_until(loop, lambda: answered(theirs))
            assert theirs.recv(65536).startswith(b"HTTP/1.1 200 OK")
            sent.append(body)
        assert [body for body, _ in seen] == sent
        assert [misalign for _, misalign in seen] == [0] * len(sent)
    finally:
        theirs.close()
        loop.close()


def test_early_refusal_leaves_queries_for_the_accelerator_to_its_own_signal():
    """A query the accelerator workers take is not this worker's queue to refuse from its header: it is refused
    only when the accelerator is behind (``AcceleratorClient.behind``), even with this worker's queue empty."""
    from recserve.serving.wire.errors import InferError
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    class Offload:
        lagging = False

        def takes(self, items):
            return items >= 256

        def behind(self, deadline):
            return InferError("unavailable", "the accelerator worker is behind") if self.lagging else None

    loop = asyncio.new_event_loop()
    try:
        plane = WorkerPlane(loop, "m", None, lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=1), sub_batch=0)
        header = {"inputs": [{"name": "dense", "datatype": "FP32", "shape": [512, 13]}]}
        plane.offload = Offload()
        plane.offload.lagging = True
        assert "behind" in str(plane.early.from_header(json.dumps(header).encode()))  # refused with an empty queue
        plane.offload = None
        plane.admission.running = True  # a pass in progress: what arrives now queues
        plane.enqueue((np.zeros((1, 1), np.float32),), 1, time.perf_counter(), None, lambda *answer: None)
        assert plane.early.from_header(json.dumps(header).encode()) is not None  # queue full: refused
        plane.offload = Offload()
        assert plane.early.from_header(json.dumps(header).encode()) is None  # the accelerator's, and it keeps up
        header["inputs"][0]["shape"] = [8, 13]
        assert plane.early.from_header(json.dumps(header).encode()) is not None  # small: this queue's, still full
    finally:
        loop.close()


def test_admission_keeps_headroom_for_the_lateness_it_has_seen():
    """``Lateness`` is the p99 of how late recent queries were against their predicted answer time; admission
    refuses a query whose predicted finish plus that headroom passes its deadline, and says so."""
    from recserve.serving.worker.admission import Lateness, Query
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    late = Lateness(keep=100, quantile=99.0, every=10)
    for i in range(100):
        late.observe(0.001 * (i % 10))  # 0..9 ms late
    assert 0.0085 <= late.headroom() <= 0.0091
    early = Lateness(every=1)
    early.observe(-0.005)
    assert early.headroom() == 0.0  # early answers never lower a deadline below itself

    plane = WorkerPlane(asyncio.new_event_loop(), "m", object(), lambda msg: None, lambda *handoff: None,
                        PlaneLimits(queue_limit=8, fuse_items=0), sub_batch=0)
    for _ in range(20):
        plane.admission.service.observe(4, 0.002)  # 2 ms a pass
    query = (np.zeros((4, 1), np.float32),)
    now = time.perf_counter()
    plane.admission.queue.append(Query(lambda *a: None, now, now + 10, query, 4, False))
    plane.admission.queued_items = 4
    deadline = time.perf_counter() + 0.010  # two passes (4 ms) fit in 10 ms...
    assert plane.admission.check(4, deadline) > 0
    for _ in range(16):
        plane.admission.lateness.observe(0.008)  # ...but not with 8 ms of recent lateness on top
    with pytest.raises(Exception, match="headroom for recent lateness"):
        plane.admission.check(4, deadline)
    plane.loop.close()


def test_backlog_counts_the_passes_the_queue_will_really_take():
    """Queued queries are grouped greedily up to ``fuse_items``, as ``next_group`` takes them: four queries of
    130 items make four passes under a 256-item limit (ceil(520 / 256) = 3 counted one fixed cost too few)."""
    from recserve.serving.worker.admission import Query
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    plane = WorkerPlane(asyncio.new_event_loop(), "m", object(), lambda msg: None, lambda *handoff: None,
                        PlaneLimits(fuse_items=256), sub_batch=0)

    def queue(*sizes):
        plane.admission.queue.clear()
        for n in sizes:
            plane.admission.queue.append(Query(lambda *a: None, 0.0, 1e9, (), n, False))

    queue(130, 130, 130)
    assert plane.admission.passes_with(130) == 4
    queue(60, 60, 60)
    assert plane.admission.passes_with(60) == 1
    groups = []
    while plane.admission.queue:
        groups.append([q.items for q in plane.admission.next_group()])
    assert groups == [[60, 60, 60]]
    plane.loop.close()


def test_a_beat_during_a_pass_on_the_compute_thread_ages_the_worker_by_that_pass():
    """The loop beats on while the compute thread computes, so each beat carries how long the pass in flight has
    run; the supervisor dates the beat back by it, and a pass that never ends looks like a silent (hung) worker."""
    from types import SimpleNamespace

    from recserve.serving.node.inbox import PipeInbox

    handle = SimpleNamespace(last_beat=0.0)
    before = time.monotonic()
    PipeInbox.on_message(None, None, handle, ("beat", 12.0))  # type: ignore[arg-type]
    assert before - 12.0 - 0.5 < handle.last_beat < before - 11.5
    PipeInbox.on_message(None, None, handle, ("beat",))  # type: ignore[arg-type]  # an accelerator worker's
    assert handle.last_beat >= before


def test_a_retiring_worker_waits_a_moment_for_connections_accepted_just_before_it_stopped_listening():
    """A connection the loop accepted just before the listener closed becomes a ``Connection`` a loop turn or two
    later; a retiring worker with nothing left looks again after ``EXIT_SETTLE_S`` instead of exiting at once (which
    reset such a connection under its client: a "lost" query in the resize test), and hands it on."""
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    handed: list[int] = []
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    try:
        plane = WorkerPlane(loop, "m", object(), lambda msg: None,
                            lambda fd, prefix, to=None, shared=False: handed.append(fd), PlaneLimits(), sub_batch=0)
        plane.retire()
        assert not plane.exit_event.is_set()  # nothing left, but it looks again first
        loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))  # arrives late
        run_until(loop, plane.exit_event.is_set)  # after EXIT_SETTLE_S (a turn or two more on a busy host)
        assert len(handed) == 1 and plane.exit_event.is_set()  # handed on, then exited
        fresh = WorkerPlane(loop, "m", object(), lambda msg: None, lambda *a: None, PlaneLimits(), sub_batch=0)
        fresh.retire()
        run_until(loop, fresh.exit_event.is_set)
        assert fresh.exit_event.is_set()  # and with nothing arriving it exits on its own
    finally:
        theirs.close()
        loop.close()


def test_a_worker_gives_the_supervisor_a_connections_descriptor_at_accept_before_its_transport_exists():
    """A worker killed between ``accept`` and ``connection_made`` took the only descriptor of a connection whose
    client may already have sent a request (a reset, a "lost" query).  Now the descriptor is shared in the accept
    callback itself, the state byte reads idle, it is shared once, and a retiring worker waits for accepted
    connections whose transport is not made yet."""
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    events: list[tuple] = []
    loop = asyncio.new_event_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    states = np.full((4096, 2), -1, np.int64)  # stale: earlier connections on the same descriptors held requests
    client = socket.create_connection(listener.getsockname())
    try:
        plane = WorkerPlane(loop, "m", object(), lambda msg: events.append(msg),
                            lambda fd, prefix, to=None, shared=False: events.append(("handoff", fd, shared)),
                            PlaneLimits(), sub_batch=0,
                            share=lambda fd: events.append(("share", fd, len(plane.connections.open))), states=states)
        loop.run_until_complete(plane.listen(listener))
        plane.connections._accept()  # what the loop runs when the listener is readable
        shares = [e for e in events if e[0] == "share"]
        assert len(shares) == 1 and shares[0][2] == 0  # shared before any Connection existed
        fd = shares[0][1]
        assert states[fd, 0] == 0 and plane.connections.connecting == 1
        plane.retire()
        assert not plane.exit_event.is_set()
        run_until(loop, plane.exit_event.is_set)
        assert [e for e in events if e[0] == "share"] == shares  # connection_made did not share it again
        # handed on, the supervisor's copy dropped with the hand-off itself (no "gone" before it), then exit
        assert [e for e in events if e[0] in ("handoff", "gone")] == [("handoff", fd, True)]
        assert plane.connections.connecting == 0 and plane.exit_event.is_set()
    finally:
        client.close()
        loop.close()


def test_a_connection_publishes_what_it_read_when_idle_and_wrote_when_it_holds_a_request():
    """The shared slot the supervisor reads if the worker dies (``node/watchdog.py``): from the first byte of a
    request until its answer, held with the bytes written by then; else the bytes read by then.  Both are counted
    from before this worker took the connection (an adopted one: what the kernel says), less what leaves with a
    hand-off."""
    from recserve.serving.worker.http_connection import held_state
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    loop = asyncio.new_event_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    ours, _ = listener.accept()
    states = np.full((4096, 2), held_state(0), np.int64)  # stale: an earlier connection on the descriptor
    handed: list[tuple[int, bytes]] = []
    try:
        client.sendall(b"0123456789")
        deadline = time.monotonic() + 5
        while len(ours.recv(64, socket.MSG_PEEK)) < 10 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert ours.recv(10) == b"0123456789"  # read before this worker: by the supervisor or another worker
        ours.sendall(b"abc")  # and written
        plane = WorkerPlane(loop, "m", object(), lambda msg: None,
                            lambda fd, prefix, to=None, shared=False: handed.append((fd, prefix)), PlaneLimits(),
                            sub_batch=0, share=lambda fd: None, states=states)
        fd = os.dup(ours.fileno())
        loop.run_until_complete(plane.connections.adopt(fd, b""))
        loop.run_until_complete(asyncio.sleep(0.05))
        assert list(states[fd]) == [10, 0]  # idle: ten bytes read, by whoever; no answer being written
        head = b"POST /v2/models/m/infer HTTP/1.1\r\n"  # a head still arriving
        client.sendall(head)
        deadline = time.monotonic() + 5
        while states[fd, 0] != held_state(3) and time.monotonic() < deadline:
            loop.run_until_complete(asyncio.sleep(0.005))
        assert states[fd, 0] == held_state(3)  # holding a request, three bytes written so far
        (conn,) = plane.connections.open
        assert conn.read_here == len(head)
        conn.buf.clear()  # as if the request were read whole and answered: its answer's end is published first
        conn.write(b"HTTP/1.1 200 OK\r\n")
        assert states[fd, 1] == 3 + 17
        conn.buf += head
        plane.connections.hand_off(conn)  # the partial head leaves with the connection
        assert handed and handed[0][1] == head and states[fd, 0] == 10
    finally:
        client.close()
        ours.close()
        loop.close()


def test_the_planes_percentile_equals_numpys():
    from recserve.serving.worker.admission import percentile

    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 256):
        values = rng.exponential(size=n)
        for q in (0.0, 50.0, 95.0, 99.0, 100.0):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-12)


def test_a_worker_out_of_descriptors_pauses_accepting_and_resumes(monkeypatch):
    """EMFILE at accept leaves the client queued in the listener; the worker stops reading the listener for
    ``ACCEPT_PAUSE_S`` (as asyncio's server does) instead of spinning on it, then accepts again."""
    import errno

    from recserve.serving.worker import connections
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    monkeypatch.setattr(connections, "ACCEPT_PAUSE_S", 0.05)
    loop = asyncio.new_event_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    client = socket.create_connection(listener.getsockname())
    try:
        plane = WorkerPlane(loop, "m", object(), lambda msg: None, lambda *a: None, PlaneLimits(), sub_batch=0)
        loop.run_until_complete(plane.listen(listener))

        class Exhausted:
            def __init__(self, sock: socket.socket) -> None:
                self.sock = sock

            def accept(self):
                raise OSError(errno.EMFILE, "Too many open files")

            def fileno(self) -> int:
                return self.sock.fileno()

        plane.connections._listener = Exhausted(listener)
        plane.connections._accept()
        assert not loop.remove_reader(listener.fileno())  # paused: the listener is not being read
        plane.connections._listener = listener
        run_until(loop, lambda: len(plane.connections.open) == 1)  # resumed: the queued client is accepted now
        assert plane.connections.connecting == 0 and len(plane.connections.open) == 1
    finally:
        client.close()
        loop.close()


def test_a_large_grpc_query_is_decoded_from_the_received_bytes_and_scores_like_the_model(grpc_node, node):
    """From ``SPLIT_BYTES`` on, a worker splits the tensors off before protobuf parses the request."""

    from recserve.serving.worker.grpc_methods import SPLIT_BYTES

    server, _ = node
    model = build_worker_model(server.config.models[0]).eval()  # "a", the same model as grpc_node's
    batch = sample_batch(model, 128, rng=11)
    assert sum(a.nbytes for a in batch.as_arrays().values()) > SPLIT_BYTES
    with torch.no_grad():
        expected = model(batch).numpy()
    client = grpc_client.triton(grpc_node.grpc)
    scores = client.infer("a", grpc_inputs(batch), client_timeout=60).as_numpy("scores")
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


def test_a_stream_mixing_models_is_answered_in_request_order_by_the_worker_that_took_it(grpc_node, cases):
    """A worker answers its own model's streamed requests itself and sends the others to the server process as
    unary calls; answers leave in request order and an error is that request's alone."""
    import queue


    ports = grpc_node
    sent = [("a", 0, "1"), ("b", 1, "1"), ("a", 2, "9"), ("b", 0, "1"), ("a", 1, "1")]  # (model, case, version)
    for _ in range(3):  # a new connection each time: it lands on a worker of either model
        before = pipe_items(ports.http, "a") + pipe_items(ports.http, "b")
        client = grpc_client.triton(ports.grpc)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error, q=answers: q.put((result, error)))
        try:
            for k, (name, case, version) in enumerate(sent):
                client.async_stream_infer(name, grpc_inputs(cases[name][case][0]), model_version=version,
                                          request_id=str(k))
            got = [answers.get(timeout=60) for _ in sent]
        finally:
            client.stop_stream()
            client.close()
        for k, ((name, case, version), (result, error)) in enumerate(zip(sent, got, strict=True)):
            if version != "1":
                assert error is not None and "version" in error.message()
                continue
            assert error is None and result.get_response().id == str(k)  # in request order
            np.testing.assert_allclose(result.as_numpy("scores"), cases[name][case][1], rtol=1e-5, atol=1e-6)
        crossed = pipe_items(ports.http, "a") + pipe_items(ports.http, "b") - before
        assert crossed < sum(cases[n][c][0].dense.shape[0] for n, c, v in sent if v == "1")  # some were local


def test_the_node_listening_socket_gives_asyncio_transports_without_nagle():
    """A node's listening socket is made with IPPROTO_TCP so that asyncio sets TCP_NODELAY on what it accepts."""
    from recserve.serving.node.server import listening_socket

    async def accept_one() -> int:
        sock = listening_socket("127.0.0.1", 0)
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                accepted.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP,
                                                                                   socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accept_one()) == 1


def test_a_stalled_server_process_does_not_take_its_workers_for_silent(node, caplog):
    """A thread of the program embedding the node that holds the GIL (here a busy loop under a long switch interval;
    in a benchmark, ``json.dumps`` of a 38 MB input) stalls the node's supervisor while its workers go on beating.
    The watchdog's first tick after the stall must not judge heartbeats still unread in the pipes: no worker is
    taken for hung or silent, and the server process does not start covering the accept socket."""
    import logging
    import sys

    server, port = node
    before = sys.getswitchinterval()
    with caplog.at_level(logging.WARNING, logger="recserve"):
        for _ in range(3):
            sys.setswitchinterval(5.0)
            try:
                end = time.monotonic() + 1.5  # past RESPONSIVE_S (1 s): every beat would look stale
                while time.monotonic() < end:
                    pass
            finally:
                sys.setswitchinterval(before)
            time.sleep(0.5)
    assert "no worker is accepting" not in caplog.text and "hung" not in caplog.text
    assert not server.core.own.listening
    assert http.get(port, "/v2/health/ready", timeout_s=10).status == 200


def test_a_connection_whose_answers_go_unread_stops_reading_until_they_drain():
    """Past ``WRITE_HIGH`` of unsent answers (the transport calls ``pause_writing``) a worker reads no more of that
    client's requests; it reads again once they drain, unless the connection is being handed off meanwhile."""
    from recserve.serving.worker.http_connection import WRITE_HIGH, Connection

    class Manager:
        plane = None
        open: set = set()
        states = bytearray(0)

        def opened(self, conn) -> None:
            pass

    class Transport:
        def __init__(self) -> None:
            self.reading, self.limits = True, None

        def set_write_buffer_limits(self, high=None, low=None) -> None:
            self.limits = high

        def pause_reading(self) -> None:
            self.reading = False

        def resume_reading(self) -> None:
            self.reading = True

    for leaving in (False, True):
        a, b = socket.socketpair()
        try:
            conn, transport = Connection(Manager(), a), Transport()
            conn.connection_made(transport)
            assert transport.limits == WRITE_HIGH
            conn.pause_writing()
            assert not transport.reading
            conn.leaving = leaving
            conn.resume_writing()
            assert transport.reading is not leaving
        finally:
            a.close()
            b.close()


def test_a_burst_of_large_bodies_asks_for_free_memory_back_when_idle(monkeypatch):
    """Large request bodies past TRIM_AFTER_BYTES mark the worker to return its heap's free memory; a heartbeat
    does once none has come for TRIM_QUIET_S (a JSON burst had left a worker 170 MB larger until it restarted)."""
    from recserve.serving.worker import reporter as reporter_module
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane
    from recserve.serving.worker.reporter import TRIM_AFTER_BYTES

    trimmed = []
    monkeypatch.setattr("recserve.zoo.allocator.release_free_memory", lambda: trimmed.append(1))
    loop = asyncio.new_event_loop()
    try:
        plane = WorkerPlane(loop, "m", None, lambda msg: None, lambda *handoff: None, PlaneLimits(), sub_batch=0)
        plane.reporter.took_large_input(TRIM_AFTER_BYTES // 2)
        assert not plane.reporter.trim_wanted
        plane.reporter.took_large_input(TRIM_AFTER_BYTES // 2)
        assert plane.reporter.trim_wanted
        plane.reporter._trimmed_at = -reporter_module.TRIM_EVERY_S  # long ago
        plane.reporter.beat()
        assert trimmed == [] and plane.reporter.trim_wanted  # large bodies are still coming: not now
        plane.reporter._last_large_input -= reporter_module.TRIM_QUIET_S + 0.1  # the burst is over
        plane.reporter.beat()
        assert trimmed == [1] and not plane.reporter.trim_wanted
    finally:
        loop.close()


def test_a_large_plain_json_query_is_decoded_off_the_loop_while_it_answers_others():
    """While a worker is busy, a plain-JSON request of ``JSON_DECODE_THREAD_BYTES`` or more is decoded on a thread of
    its own: while its decode runs, the loop reads, computes and answers a small query on another connection; past
    ``JSON_DECODES_AT_ONCE`` given to the thread, the loop decodes a large one itself, and so does an idle worker;
    the waiting ones are then queued and answered, and one whose decode fails on the thread is answered with its
    error, the worker serving on."""
    from recserve.serving.wire.errors import InferError
    from recserve.serving.worker.json_decoder import JSON_DECODE_THREAD_BYTES, JSON_DECODES_AT_ONCE
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    release = threading.Event()  # lets the decodes on the thread finish
    held, started = [], threading.Event()  # gates, each holding one pass on the compute thread
    decoded_on: list[str] = []
    query = (np.zeros((1, 1), np.float32),)

    class GatedPath:
        def decode(self, body, header_length):
            if len(body) >= JSON_DECODE_THREAD_BYTES:
                decoded_on.append(threading.current_thread().name)
                if decoded_on[-1] != "MainThread":  # off the loop: held until released
                    assert release.wait(10.0)
                if bytes(body[:1]) == b"!":
                    raise InferError("invalid", "request: not JSON")
            return {}, query, 1

        def compute(self, queries):
            if held:
                gate = held.pop(0)
                started.set()
                assert gate.wait(10.0)
            return [np.zeros((1, 1), np.float32) for _ in queries]

        def encode(self, request, scores):
            return b"ok", {"Content-Type": "text/plain"}

    def hold_a_pass() -> threading.Event:
        """The worker busy: a pass held on its compute thread until the gate returned is set."""
        gate = threading.Event()
        held.append(gate)
        started.clear()
        plane.enqueue(query, 1, time.perf_counter(), 10.0, lambda scores, error: None)
        assert started.wait(5.0) and plane.admission.busy()
        return gate

    def send(sock: socket.socket, data: bytes) -> None:  # from a thread: the loop must run to read it
        sender = threading.Thread(target=sock.sendall, args=(data,))
        sender.start()
        for _ in range(100):
            loop.run_until_complete(asyncio.sleep(0.02))
            if not sender.is_alive():
                return
        raise AssertionError("the worker did not read the request")

    def answer(sock: socket.socket) -> bytes:
        for _ in range(100):
            loop.run_until_complete(asyncio.sleep(0.02))
            try:
                return sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
        return b""

    assert JSON_DECODES_AT_ONCE == 2  # the connections below: two decoding off the loop, one past them
    large = b"{" + b" " * JSON_DECODE_THREAD_BYTES + b"}"
    loop = asyncio.new_event_loop()
    pairs = [socket.socketpair() for _ in range(4)]
    try:
        plane = WorkerPlane(loop, "m", GatedPath(), lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=8, deadline_s=10.0, compute_thread_ms=0.0), sub_batch=0)
        plane.admission.service.observe(1, 0.01)  # a fit, so that passes go to the compute thread
        for ours, _ in pairs:
            loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))
        big, big2, big3, small = (theirs for _, theirs in pairs)
        gate = hold_a_pass()
        send(big, _json_post(large))
        send(big2, _json_post(large))
        assert decoded_on == ["recserve-json-decode"]  # its decode waits on the gate, the second behind it
        gate.set()  # the pass ends: the worker has only the decodes on the thread left
        send(small, _json_post(b"{}"))
        assert answer(small).startswith(b"HTTP/1.1 200 OK")  # answered while the large ones are still decoding
        send(big3, _json_post(large))  # two are with the thread already: the loop decodes this one
        assert answer(big3).startswith(b"HTTP/1.1 200 OK") and decoded_on[-1] == "MainThread"
        release.set()
        assert answer(big).startswith(b"HTTP/1.1 200 OK") and answer(big2).startswith(b"HTTP/1.1 200 OK")
        assert not plane.admission.busy() and plane.json_decoder.in_flight == 0
        send(big, _json_post(large))  # an idle worker: decoded on the loop, no thread hop added to its latency
        assert answer(big).startswith(b"HTTP/1.1 200 OK") and decoded_on[-1] == "MainThread"
        gate = hold_a_pass()
        send(big, _json_post(b"!" + large[1:]))  # a decode that fails on the thread: answered, the worker serves on
        reply = answer(big)
        assert reply.startswith(b"HTTP/1.1 400") and b"not JSON" in reply, reply
        assert decoded_on[-1] == "recserve-json-decode"
        gate.set()
        send(small, _json_post(b"{}"))
        assert answer(small).startswith(b"HTTP/1.1 200 OK")
    finally:
        release.set()
        for gate in held:
            gate.set()
        for _, theirs in pairs:
            theirs.close()
        loop.close()


def test_a_request_refused_while_decoded_lets_its_body_go_at_once():
    """A request refused by its decode (400) frees its body as soon as it is answered: the caught error keeps no
    frame that holds the body alive until the cyclic GC runs, which under a flood of refused large requests (few
    Python objects made, so the GC seldom runs) let a worker keep hundreds of MB."""
    import gc
    import weakref

    from recserve.serving.wire.errors import InferError
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    bodies = []

    class RefusingPath:
        def decode(self, body, header_length):
            bodies.append(weakref.ref(body.obj))  # the buffer the body was received into
            raise InferError("invalid", "body: refused")

    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    gc.disable()
    try:
        plane = WorkerPlane(loop, "m", RefusingPath(), lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=4, deadline_s=10.0, compute_thread_ms=-1), sub_batch=0)
        loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))
        theirs.settimeout(5)
        header = json.dumps({"inputs": []}).encode()
        body = header + bytes(200_000)  # over 64 KiB: received in place, into a buffer of its own
        theirs.sendall((f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                        f"Inference-Header-Content-Length: {len(header)}\r\n\r\n").encode() + body[:100])
        loop.run_until_complete(asyncio.sleep(0.05))  # the head read: the rest of the body goes into its buffer
        theirs.sendall(body[100:])
        run_until(loop, lambda: answered(theirs))
        assert theirs.recv(65536).startswith(b"HTTP/1.1 400")
        assert len(bodies) == 1 and bodies[0]() is None
    finally:
        gc.enable()
        theirs.close()
        loop.close()


def test_a_large_plain_json_query_shed_from_its_skeleton_lets_its_body_go_at_once():
    """The refusal a busy worker answers from a JSON skeleton keeps no frame that holds the body (the body of a
    json_burst of 2 MB queries, else kept until the cyclic GC runs)."""
    import gc
    import weakref

    body = json.dumps({"inputs": [{"name": "dense", "shape": [2048, 13], "datatype": "FP32",
                                   "data": [0.5] * (2048 * 13)}]}).encode()  # over 64 KiB: received in place
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    gc.disable()
    try:
        plane, query = _busy_plane(loop, arrivals=12)
        judged = []
        from_json = plane.early.from_json

        def recorded(request_body, arrived=None):
            judged.append(weakref.ref(request_body.obj))  # the buffer the body was received into
            return from_json(request_body, arrived)

        plane.early.from_json = recorded
        loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))
        theirs.settimeout(5)
        plane.enqueue(query, 1, time.perf_counter(), None, lambda scores, error: None)  # the queue is full
        wire = _json_post(body)
        theirs.sendall(wire[:300])
        loop.run_until_complete(asyncio.sleep(0.05))
        theirs.sendall(wire[300:])
        run_until(loop, lambda: answered(theirs))
        assert theirs.recv(65536).startswith(b"HTTP/1.1 503")
        assert len(judged) == 1 and judged[0]() is None
    finally:
        gc.enable()
        theirs.close()
        loop.close()


def test_every_answer_during_a_drain_closes_its_connection():
    """A keep-alive client whose query is answered (503 here) while the node drains is told ``Connection: close``
    and the connection closes after the answer: it does not send its next query on a connection about to go."""
    from recserve.serving.worker.http_connection import Request
    from recserve.serving.worker.limits import PlaneLimits
    from recserve.serving.worker.plane import WorkerPlane

    query = (np.zeros((4, 1), np.float32), np.zeros(0, np.int64), np.zeros((0, 4), np.int32))

    class Path:
        def decode(self, body, header_length):
            return {}, query, 4

    class Conn:
        arrived, writes, kept = 0.0, [], []

        def write(self, data, close=False):
            self.writes.append(bytes(data))

        def answered(self, keep_alive):
            self.kept.append(keep_alive)

    loop = asyncio.new_event_loop()
    try:
        plane = WorkerPlane(loop, "m", Path(), lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=3, deadline_s=10.0, fuse_items=0, compute_thread_ms=-1),
                            sub_batch=0)
        plane.admission.draining = True
        conn = Conn()
        plane.admit(conn, Request("POST", "/v2/models/m/infer", "HTTP/1.1", {}, bytearray(b"{}"), time.perf_counter()))
        assert conn.writes[0].startswith(b"HTTP/1.1 503") and b"\r\nConnection: close\r\n" in conn.writes[0]
        assert conn.kept == [False]
        assert not plane.keeps(True)
    finally:
        loop.close()


def test_a_request_on_its_way_as_a_draining_worker_lets_an_idle_connection_go_is_answered_not_reset():
    """HTTP/1.1's keep-alive race at shutdown: the worker lets its idle connections go while a client's next request
    is on its way.  Closed at once with that request unread, the connection was reset under the client; now the
    request is answered (503, ``Connection: close``) and the connection closes by a half-close, read to its end."""
    loop = asyncio.new_event_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=60)
    ours, _ = listener.accept()
    listener.close()
    request = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    try:
        plane, _ = _busy_plane(loop, arrivals=0)
        loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))
        client.sendall(request)
        run_until(loop, lambda: answered(client))
        assert client.recv(65536).startswith(b"HTTP/1.1 200 OK")  # and the connection stays open
        plane.drain()  # what the supervisor sends at SIGTERM: drain, then stop
        plane.retire()
        client.sendall(request)  # the client's next request, on its way as the worker lets idle connections go
        run_until(loop, lambda: answered(client))
        reply = b""
        while answered(client) or not reply.endswith(b"}"):
            chunk = client.recv(65536)  # a reset raises here
            if not chunk:
                break
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 503") and b"\r\nConnection: close\r\n" in reply, reply
        run_until(loop, lambda: answered(client))
        assert client.recv(65536) == b""  # then the end of the stream, not a reset
        client.close()
        run_until(loop, plane.exit_event.is_set)
        assert plane.exit_event.is_set()
    finally:
        client.close()
        loop.close()


def test_a_large_body_refused_for_want_of_memory_gets_no_100_continue_first():
    """A body the worker will not receive (the bodies being received hold its budget) is refused from its head,
    503, without the ``100 Continue`` that would have the client send it for nothing (RFC 9110 10.1.1)."""
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    try:
        plane, _ = _busy_plane(loop, arrivals=0)
        bodies = plane.connections.bodies
        bodies.add(bodies.limit)  # every byte of the budget taken
        loop.run_until_complete(plane.connections.adopt(ours.detach(), b""))
        theirs.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
                       b"Expect: 100-continue\r\n\r\n")
        run_until(loop, lambda: answered(theirs))
        theirs.settimeout(30)
        reply = theirs.recv(65536)
        assert reply.startswith(b"HTTP/1.1 503") and b"100 Continue" not in reply, reply
        bodies.add(-bodies.limit)
    finally:
        theirs.close()
        loop.close()
