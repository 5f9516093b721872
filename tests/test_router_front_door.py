"""The router's front door (``recserve route``, a fleet's router) against hostile clients: nothing a client names
reaches its backend but as one request under ``/v2/models``; no query takes a healthy backend out of service; the
node's limits and JSON errors hold at the router too."""

from __future__ import annotations

import gzip
import json
import re
import socket
import socketserver
import threading
import time

import pytest

from recserve.policies import front_door
from recserve.policies.router import Backend, PoolConfig, Router, RouterThread

QUERY = json.dumps({"inputs": [{"name": "dense", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}).encode()


STATS = {"name": "m", "version": "1", "last_inference": 5, "inference_count": 3,
         "inference_stats": {"success": {"count": 2, "ns": 100}}, "batch_stats": []}


class Recorder(socketserver.BaseRequestHandler):
    """A backend answering every request 200 with the request line it read as the JSON body (keep-alive)."""

    def handle(self) -> None:
        data = b""
        while True:
            while b"\r\n\r\n" not in data:
                more = self.request.recv(65536)
                if not more:
                    return
                data += more
            head, _, data = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next((int(v) for k, _, v in (h.partition(":") for h in lines[1:])
                           if k.lower() == "content-length"), 0)
            while len(data) < length:
                data += self.request.recv(65536)
            data = data[length:]
            self.server.lines.append(lines[0])  # type: ignore[attr-defined]
            stats = lines[0].split()[1].endswith("/stats")
            body = json.dumps({"model_stats": [STATS]} if stats else {"line": lines[0]}).encode()
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)


def recorder(port: int = 0) -> socketserver.ThreadingTCPServer:
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    backend = socketserver.ThreadingTCPServer(("127.0.0.1", port), Recorder)
    backend.daemon_threads = True
    backend.lines = []  # type: ignore[attr-defined]
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    return backend


@pytest.fixture
def routed():
    backend = recorder()
    url = f"http://127.0.0.1:{backend.server_address[1]}"
    pool = PoolConfig([Backend(url, "node", slots=2, base=True)], qos_ms=1000.0)
    thread = RouterThread(Router(pool, pool.make_policy()))
    port = thread.start()
    try:
        yield port, backend.lines, thread
    finally:
        thread.stop()
        backend.shutdown()
        backend.server_close()


def exchange(port: int, raw: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``raw`` on a new connection; everything the router answers until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(raw)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
                if b"\r\n\r\n" in got and _complete(got):
                    break
        except TimeoutError:
            pass
        return got


def _complete(got: bytes) -> bool:
    head, _, body = got.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def infer(port: int, path: str, extra: bytes = b"", body: bytes = QUERY) -> tuple[int, dict, bytes]:
    raw = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode() + extra + b"\r\n" + body)
    got = exchange(port, raw)
    head, _, payload = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload) if payload else {}, head


def test_a_model_name_with_crlf_or_dots_reaches_the_backend_as_one_encoded_request(routed):
    port, lines, _ = routed
    smuggled = ("x%20HTTP%2F1.1%0D%0AHost:%20y%0D%0AContent-Length:%200%0D%0A%0D%0A"
                "GET%20%2Fcontrol%2Fnode%20HTTP%2F1.1%0D%0A")
    status, _, _ = infer(port, f"/v2/models/{smuggled}/infer")
    assert status == 200 and len(lines) == 1 and "\r" not in lines[0]
    assert lines[0].startswith("POST /v2/models/x%20HTTP%2F1.1%0D%0AHost") and lines[0].endswith("/infer HTTP/1.1")
    status, answer, _ = infer(port, "/v2/models/m/infer")  # the next client gets its own answer
    assert status == 200 and answer == {"line": "POST /v2/models/m/infer HTTP/1.1"}
    got = exchange(port, b"GET /v2/models/..%2F..%2Fcontrol%2Fnode HTTP/1.1\r\nHost: x\r\n\r\n")
    assert lines[-1] == "GET /v2/models/..%2F..%2Fcontrol%2Fnode HTTP/1.1", got


def test_a_name_or_header_the_router_cannot_encode_takes_no_backend_out_of_service(routed):
    port, lines, _ = routed
    assert infer(port, "/v2/models/%E2%9C%93/infer")[0] == 200
    assert lines[-1] == "POST /v2/models/%E2%9C%93/infer HTTP/1.1"
    status, _, _ = infer(port, "/v2/models/m/infer", "Content-Type: application/json; x=✓\r\n".encode())
    assert status == 200
    assert infer(port, "/v2/models/m/infer")[0] == 200  # still in service


def test_a_version_in_the_path_is_forwarded(routed):
    port, lines, _ = routed
    assert infer(port, "/v2/models/m/versions/7/infer")[1] == {"line": "POST /v2/models/m/versions/7/infer HTTP/1.1"}
    exchange(port, b"GET /v2/models/m/versions/7/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert lines[-1] == "GET /v2/models/m/versions/7/ready HTTP/1.1"


def test_the_nodes_limits_and_json_errors_hold_at_the_router(routed, monkeypatch):
    port, _, _ = routed
    monkeypatch.setattr(front_door.LIMITS, "read_timeout_s", 1.0)
    monkeypatch.setattr(front_door.LIMITS, "max_body_bytes", 1 << 20)
    start = time.monotonic()
    stalled = exchange(port, b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    assert stalled.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 8
    bomb = gzip.compress(b" " * (8 << 20))
    status, answer, head = infer(port, "/v2/models/m/infer", b"Content-Encoding: gzip\r\n", bomb)
    assert status == 413 and "error" in answer and b"Server: recserve" in head
    status, answer, head = infer(port, "/v2/models/m/infer", b"Content-Encoding: zstd\r\n")
    assert status == 415 and b"Accept-Encoding: gzip, deflate" in head
    smuggle = exchange(port, b"POST /v2/models/m/infer HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"0\r\n\r\n")
    assert smuggle.startswith(b"HTTP/1.") and b" 400 " in smuggle.split(b"\r\n")[0]
    long_header = exchange(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Token: " + b"t" * 20000 + b"\r\n\r\n")
    assert long_header.startswith(b"HTTP/1.1 200")  # a head the node accepts is accepted
    unknown = exchange(port, b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b" 404 " in unknown.split(b"\r\n")[0] and b'{"error"' in unknown


def test_a_stalled_client_does_not_hold_the_routers_stop(routed):
    port, _, thread = routed
    with socket.create_connection(("127.0.0.1", port)) as stalled:
        stalled.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        time.sleep(0.2)
        start = time.monotonic()
        thread.stop()
        assert time.monotonic() - start < front_door.STOP_GRACE_S + 5


def test_a_backend_the_readiness_probe_finds_ready_is_back_in_service_at_once():
    backend = recorder()
    backend_port = backend.server_address[1]
    pool = PoolConfig([Backend(f"http://127.0.0.1:{backend_port}", "node", slots=1, base=True)], qos_ms=1000.0)
    thread = RouterThread(Router(pool, pool.make_policy()))
    port = thread.start()
    try:
        backend.shutdown()
        backend.server_close()
        assert infer(port, "/v2/models/m/infer")[0] == 502  # out of service now, for a while
        backend = recorder(backend_port)
        assert exchange(port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200")
        assert infer(port, "/v2/models/m/infer")[0] == 200  # the router's ready and its queries agree
    finally:
        thread.stop()
        backend.shutdown()
        backend.server_close()


def test_statistics_are_summed_over_the_nodes_and_only_offered_extensions_are_advertised():
    backends = [recorder(), recorder()]
    urls = [f"http://127.0.0.1:{b.server_address[1]}" for b in backends]
    pool = PoolConfig([Backend(url, f"n{i}", slots=1, base=i == 0) for i, url in enumerate(urls)], qos_ms=1000.0)
    thread = RouterThread(Router(pool, pool.make_policy()))
    port = thread.start()

    def get(path: str) -> dict:
        reply = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 200"), reply
        return json.loads(reply.partition(b"\r\n\r\n")[2])

    try:
        want = {**STATS, "inference_count": 6, "inference_stats": {"success": {"count": 4, "ns": 200}}}
        assert get("/v2/models/stats") == {"model_stats": [want]}
        assert get("/v2/models/m/versions/1/stats") == {"model_stats": [want]}
        assert all(b.lines[-1] == "GET /v2/models/m/versions/1/stats HTTP/1.1" for b in backends)
        assert "model_repository" not in get("/v2")["extensions"]
    finally:
        thread.stop()
        for backend in backends:
            backend.shutdown()
            backend.server_close()


def test_queries_past_the_queue_limit_hear_503_and_those_waiting_past_the_deadline_504():
    """The router's own queue is bounded: a full queue refuses at once with Retry-After, and a query no slot took
    within the pool's deadline leaves the queue with 504; one a slot took is answered by its backend."""
    import asyncio

    release = asyncio.Event()

    async def held(inst, model, body, headers):  # a backend that answers only when released
        await release.wait()
        return 200, b"{}", {}

    pool = PoolConfig([Backend("http://127.0.0.1:9", "node", slots=1)], qos_ms=1000.0, queue_limit=2,
                      deadline_ms=300.0)

    async def go() -> list:
        router = Router(pool, pool.make_policy(), transport=held)
        first = asyncio.ensure_future(router.submit("m", b"{}", {}, 1))  # takes the one slot
        await asyncio.sleep(0)
        queued = [asyncio.ensure_future(router.submit("m", b"{}", {}, 1)) for _ in range(2)]
        await asyncio.sleep(0)
        full = await router.submit("m", b"{}", {}, 1)
        expired = await asyncio.gather(*queued)
        release.set()
        return [full, *expired, await first, router.stats()]

    full, *expired, first, stats = asyncio.run(asyncio.wait_for(go(), 30))
    assert full[0] == 503 and full[2]["Retry-After"] == "1" and b"queue_limit" in full[1]
    for status, body, _ in expired:
        assert status == 504 and b"past the router's deadline of 300 ms" in body
    assert first[0] == 200
    assert (stats["shed_queue_full"], stats["expired_waiting"], stats["queued"]) == (1, 2, 0)


def test_a_pool_file_is_validated_naming_the_field(tmp_path):
    from recserve.errors import SpecError
    from recserve.policies.router import load_pool

    bad = tmp_path / "pool.yaml"
    for text, said in (("qos_ms: 50\nbackends: [{url: 'http://x:1', slot: 2}]\n",
                        "backends[0].slot: unknown field (did you mean 'slots'?)"),
                       ("qos_ms: 50\nqueue_limit: 0\nbackends: [{url: 'http://x:1'}]\n",
                        "queue_limit: must be >= 1, got 0"),
                       ("qos_ms: 50\npolicy: fifo\nbackends: [{url: 'http://x:1'}]\n", "policy: must be"),
                       ("qos_ms: 50\nbackends: [{url: 'ftp://x:1'}]\n", "backends[0].url:")):
        bad.write_text(text)
        with pytest.raises(SpecError, match=r"pool\.yaml: " + re.escape(said)):
            load_pool(bad)
    bad.write_text("qos_ms: 50\nbackends: [{url: 'http://x:1'}]\n")
    assert load_pool(bad).deadline() == 100.0  # twice the target, as a node's default deadline


def test_the_routers_latency_record_is_bounded_however_many_queries_it_answers(monkeypatch):
    """A router runs for months: its percentiles read the latest answers, its count covers all of them."""
    import asyncio

    from recserve.policies import router as router_module

    monkeypatch.setattr(router_module, "LATENCY_WINDOW", 8)

    async def answer(inst, model, body, headers):
        return 200, b"{}", {}

    pool = PoolConfig([Backend("http://127.0.0.1:9", "node", slots=1)], qos_ms=1000.0)

    async def go() -> dict:
        router = Router(pool, pool.make_policy(), transport=answer)
        for _ in range(20):
            assert (await router.submit("m", b"{}", {}, 1))[0] == 200
        return router.stats()

    stats = asyncio.run(asyncio.wait_for(go(), 30))
    assert (stats["completed"], stats["latency_window"]) == (20, 8)
