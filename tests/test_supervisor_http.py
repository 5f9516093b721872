"""The server process's HTTP front end (aiohttp) against slow, leaving and odd clients: the same limits and
statuses as the workers' (idle and read timeouts, head size, connection cap), content codings it does not undo
refused 415, and new clients answered 503 while the node stops."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import shutil
import socket
import subprocess
import threading
import time
import zlib

import pytest

from recserve.serving.transport.h2grpc import BACKLOG
from recserve.serving.wire.errors import InferError
from tests.support.http1_cases import FRAMING
from tests.support.nodes import node_config, started
from tests.support.scrape import metric_value, scrape
from tests.support.wait import until

INDEX = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"  # a route only the server process answers
READY = b'{"ready": true}'


def exchange(port: int, message: bytes, timeout_s: float = 30) -> tuple[bytes, float]:
    """Send ``message``; everything answered until the server closes, and how long the close took."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(message)
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks), time.monotonic() - began


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def body_of(reply: bytes) -> dict:
    return json.loads(reply.partition(b"\r\n\r\n")[2])


def posted(body: bytes, coding: str) -> bytes:
    return (INDEX + b"Content-Encoding: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % (coding.encode(),
                                                                                                     len(body)) + body)


@pytest.fixture(scope="module", params=["workers", "server"])
def port(request):
    """A node whose idle and read timeouts are 1 s, with the workers accepting (connections handed over to the
    server process) or the server process accepting itself."""
    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.front_end, config.keep_alive_timeout_s, config.read_timeout_s = request.param, 1.0, 1.0
    with started(config) as server:
        yield server.ports.http


@pytest.mark.integration  # starts a node
def test_idle_connections_close_and_stalled_bodies_answer_408(port):
    reply, took = exchange(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(reply) == 200 and took < 25  # then closed, idle past keep_alive_timeout_s
    _, took = exchange(port, b"GET /v2/health/live HTTP/1.1\r\nHo")  # a head that never ends
    assert took < 25
    for stalled in (INDEX + b"Content-Length: 100\r\n\r\n{", INDEX + b"Transfer-Encoding: chunked\r\n\r\n5\r\n{"):
        reply, took = exchange(port, stalled)
        assert status_of(reply) == 408 and b"Connection: close" in reply and took < 25, reply[:300]
        assert "1 s" in body_of(reply)["error"]


@pytest.mark.integration  # starts a node
def test_content_codings_are_undone_or_refused_with_the_ones_accepted(port):
    for coding, body in (("gzip", gzip.compress(READY)), ("x-gzip", gzip.compress(READY)),
                         ("gzip, identity", gzip.compress(READY)), ("deflate", zlib.compress(READY)),
                         ("deflate, gzip", gzip.compress(zlib.compress(READY))), ("identity", READY)):
        reply, _ = exchange(port, posted(body, coding))
        assert status_of(reply) == 200 and isinstance(body_of(reply), list), (coding, reply[:300])
    for coding in ("br", "zstd", "compress"):
        reply, _ = exchange(port, posted(b"abcd", coding))
        assert status_of(reply) == 415 and b"Accept-Encoding: gzip, deflate" in reply, (coding, reply[:300])
        assert body_of(reply)["field"] == "Content-Encoding" and coding in body_of(reply)["error"]
    reply, _ = exchange(port, posted(b"\x1f\x8bnot gzip", "gzip"))
    assert status_of(reply) == 400 and "not valid gzip" in body_of(reply)["error"], reply[:300]


@pytest.mark.integration  # starts a node
def test_a_head_the_workers_accept_is_accepted_and_a_longer_line_answers_431_in_json(port):
    token = b"a" * 10_000  # past aiohttp's own 8 KiB line limit, within the workers' 64 KiB head
    reply, _ = exchange(port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token
                        + b"\r\nConnection: close\r\n\r\n")
    assert status_of(reply) == 200, reply[:300]
    reply, _ = exchange(port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")
    assert status_of(reply) == 431 and b"Server: recserve" in reply and "error" in body_of(reply), reply[:300]


@pytest.mark.integration  # starts a node
@pytest.mark.parametrize("case", sorted(FRAMING))
def test_a_connection_the_server_process_serves_refuses_each_framing_case_once_and_closes(port, case):
    """The workers' framing cases (``test_http1_framing.py``) after a first request, so that aiohttp's parser reads
    them whichever process accepted the connection: refused in JSON, closed, the request hidden in it never
    answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"live": true}'):
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        s.sendall(FRAMING[case][0])
        refusal = b""
        while data := s.recv(65536):  # until the server closes
            refusal += data
    closes = b"Connection: close" in refusal or (refusal.startswith((b"HTTP/1.0", b"HTTP/0.9"))
                                                 and b"keep-alive" not in refusal)  # neither keeps one open unasked
    assert status_of(refusal) >= 400 and closes and b"application/json" in refusal, refusal
    assert b'"ready"' not in refusal  # the hidden GET /v2/health/ready was not answered


@pytest.mark.integration  # starts a node
def test_a_client_leaving_mid_body_is_counted_not_logged_as_a_server_error(port, caplog):
    caplog.set_level(logging.WARNING)
    path = b"POST /v2/models/hercules-rmc1/infer HTTP/1.1\r\nHost: x\r\n"
    # gzip: the server process decodes it; plain: a worker reads it (with the workers accepting)
    for count, coding in enumerate((b"Content-Encoding: gzip\r\n", b""), start=1):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(path + coding + b"Content-Length: 1000\r\n\r\n\x1f\x8b")
            time.sleep(0.3)
        deadline = time.monotonic() + 20
        while (metric_value(scrape(port), "recserve_requests_refused_total", model="hercules-rmc1", version="1",
                            reason="client_gone") or 0) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        assert metric_value(scrape(port), "recserve_requests_refused_total", model="hercules-rmc1", version="1",
                            reason="client_gone") == count
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


@pytest.mark.integration  # starts a node
def test_new_clients_hear_503_while_the_node_stops():
    from recserve.serving.node.server import NodeServer

    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.read_timeout_s = 60.0  # a stalled request holds the HTTP server's stop for its whole grace
    server = NodeServer(config)
    server.start()
    port = server.ports.http
    stalled = socket.create_connection(("127.0.0.1", port), timeout=30)
    stopper = threading.Thread(target=server.stop)
    try:
        stalled.sendall(INDEX + b"Content-Length: 100\r\n\r\n{")
        time.sleep(0.3)
        stopper.start()
        assert not until(lambda: server.core.accepting, lambda accepting: not accepting)  # the stop has begun
        reply, took = exchange(port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(reply) == 503 and took < 4, (took, reply[:300])  # within the 5 s grace, not after it
    finally:
        stalled.close()
        stopper.join(60) if stopper.is_alive() else server.stop()


@pytest.mark.integration  # starts a node
def test_the_server_process_caps_its_connections_with_503_and_retry_after():
    """Past the cap while every connection has a request in progress (a body on its way): 503.  (Connections
    waiting for a request make room instead: ``test_node_limits``.)"""
    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.front_end, config.max_connections = "server", 2
    with started(config) as server:
        port = server.ports.http
        kept = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
        try:
            for sock in kept:
                sock.sendall(b"POST /v2/models/hercules-rmc1/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            time.sleep(0.5)  # both requests being handled, their bodies awaited
            reply, _ = exchange(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status_of(reply) == 503 and b"Retry-After: 1" in reply and "2 connections" in body_of(reply)["error"]
        finally:
            for sock in kept:
                sock.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # room again once the server process saw them close
            reply, _ = exchange(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if status_of(reply) == 200:
                break
            time.sleep(0.1)
        assert status_of(reply) == 200


def test_inflating_is_bounded_and_checks_the_stream():
    from recserve.serving.node.http_bodies import inflate

    packed = gzip.compress(b"x" * 1000)
    assert inflate(packed + gzip.compress(b"y"), "gzip", 2000) == b"x" * 1000 + b"y"  # two members (RFC 1952 2.2)
    assert inflate(zlib.compress(b"z" * 10), "deflate", 10) == b"z" * 10
    raw = zlib.compressobj(wbits=-15)
    assert inflate(raw.compress(b"raw") + raw.flush(), "deflate", 10) == b"raw"  # raw deflate, as some clients send
    for data, limit, code, words in ((packed, 999, "too_large", "more than 999"), (packed[:-12], 2000, "invalid",
                                      "ends early"), (packed + b"junk", 2000, "invalid", "not valid gzip")):
        with pytest.raises(InferError, match=words) as caught:
            inflate(data, "gzip", limit)
        assert caught.value.code == code


def test_a_refused_connection_whose_client_already_left_is_aborted_quietly():
    import asyncio

    from recserve.serving.node.handover import STOPPING, Refused

    class Gone(asyncio.Transport):
        def __init__(self) -> None:
            super().__init__()
            self.aborted = self.closed = False

        def write(self, data: bytes) -> None:
            pass

        def can_write_eof(self) -> bool:
            return True

        def write_eof(self) -> None:
            raise OSError(107, "Transport endpoint is not connected")

        def abort(self) -> None:
            self.aborted = True

        def close(self) -> None:
            self.closed = True

    async def refuse() -> Gone:
        transport = Gone()
        Refused(STOPPING).connection_made(transport)  # raised OSError into the loop's log before
        return transport

    transport = asyncio.run(refuse())
    assert transport.aborted


@pytest.mark.integration  # starts a node
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read a listening socket's backlog")
def test_the_http_port_listens_with_the_nodes_backlog_on_either_front_end(port):
    """asyncio's ``create_server`` listens again on the socket it is given, at 100 unless told; the node's 4096
    must hold whichever process accepts (a burst of connections past 100 would otherwise wait for SYN retries)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    assert [int(line.split()[2]) for line in out.splitlines()] == [BACKLOG]


@pytest.mark.integration  # starts a node
def test_a_body_over_the_limit_that_waits_for_100_continue_gets_413_without_the_100(port):
    """RFC 9110 10.1.1: a request the server will refuse from its head gets the final status, not ``100 Continue``
    asking the client to send a body only to be refused (aiohttp sends the 100 before any handler runs)."""
    over = b"Content-Length: 999999999999\r\nExpect: 100-continue\r\n\r\n"
    for head in (INDEX, b"POST /v2/models/hercules-rmc1/infer HTTP/1.1\r\nHost: x\r\n",
                 b"POST /v2/models/hercules-rmc1/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"):
        reply, took = exchange(port, head + over)
        assert reply.startswith(b"HTTP/1.1 413") and b"100 Continue" not in reply and took < 25, reply[:300]
    reply, _ = exchange(port, INDEX + b"Content-Length: 2\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), reply[:300]  # within the limit: asked for the body


@pytest.mark.integration  # starts a node
@pytest.mark.parametrize(("head", "status", "allow"), [
    (b"POST /v2/nowhere HTTP/1.1\r\n", 404, None),
    (b"PUT /v2/health/ready HTTP/1.1\r\n", 405, b"GET,HEAD"),
    (b"PUT /v2/models/hercules-rmc1/infer HTTP/1.1\r\n", 405, b"POST"),
])
def test_a_route_that_refuses_the_request_answers_without_100_continue(port, head, status, allow):
    """RFC 9110 10.1.1: an unknown route or a wrong method is refused from the head, so a client waiting for
    ``100 Continue`` gets the 404 / 405 instead (aiohttp's own route for these sent the 100 first), and the
    connection closes: the body it announced is not read.  Without the expectation the answer is the same."""
    announced = b"Host: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n"
    reply, took = exchange(port, head + announced)
    assert status_of(reply) == status and b"100 Continue" not in reply and took < 25, reply[:300]
    assert b"\r\nConnection: close\r\n" in reply.partition(b"\r\n\r\n")[0] + b"\r\n"
    assert (b"\r\nAllow: " + allow + b"\r\n" in reply) if allow else b"Allow:" not in reply
    said = body_of(reply)["error"]
    plain, _ = exchange(port, head + b"Host: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789")
    assert status_of(plain) == status and body_of(plain)["error"] == said


def exchange_in_parts(port: int, *parts: bytes, timeout_s: float = 30) -> tuple[bytes, float]:
    """``exchange`` with the message sent in ``parts`` (the head and its first chunk, then the rest)."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        for part in parts:
            try:
                s.sendall(part)
            except OSError:  # refused and closed before all was sent: the answer is still there to read
                break
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while data := s.recv(65536):
                chunks.append(data)
    return b"".join(chunks), time.monotonic() - began


CHUNKED = INDEX + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(READY), READY)
MANY_TRAILERS = b"0\r\n" + b"".join(b"X-T%d: v\r\n" % i for i in range(20_000)) + b"\r\n"


@pytest.mark.integration  # starts a node
@pytest.mark.parametrize(("rest", "status", "said"), [
    (MANY_TRAILERS, 431, "Too many headers"),  # 20,000 fields: past max_headers, head and trailers together
    (b"0\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431, "Got more than"),  # one field past 64 KiB
    (b"zz\r\n", 400, "chunk size"),  # a chunk-size line after the head was taken
], ids=["20000-trailer-fields", "a-trailer-field-over-64KiB", "a-bad-chunk-size"])
def test_a_chunked_body_the_parser_refuses_after_its_head_is_answered_at_once(port, rest, status, said):
    """aiohttp's parser refuses these once the request is already being handled; it queued that error behind the
    request, whose body then never ended: the client waited for the read timeout's 408.  Now the request's own
    answer says why (431 past the head's limits, else 400) and the connection closes."""
    reply, took = exchange_in_parts(port, CHUNKED, rest)
    assert status_of(reply) == status and took < 25, reply[:300]
    assert said in body_of(reply)["error"] and b"\r\nConnection: close\r\n" in reply.partition(b"\r\n\r\n")[0] + b"\r\n"
    assert reply.count(b"HTTP/1.") == 1  # one answer, not the error again behind it


@pytest.mark.integration  # starts a node
def test_a_chunked_body_with_a_few_trailer_fields_is_read(port):
    reply, _ = exchange_in_parts(port, CHUNKED, b"0\r\nX-Checksum: 1\r\nX-Other: 2\r\n\r\n",
                                 b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(reply) == 200 and reply.count(b"HTTP/1.1 200 ") == 2, reply[:600]
