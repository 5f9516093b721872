"""The workers' HTTP/2 gRPC server (serving/transport/h2grpc.py) against grpcio's own client: framing, flow control both
ways, streaming, status and messages, deadlines and cancellation, compression, limits and the graceful stop."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from recserve.serving.transport.h2frames import frame as _frame
from recserve.serving.transport.h2frames import percent_encoded as _percent_encoded
from recserve.serving.transport.h2frames import timeout_s as _timeout_s
from recserve.serving.transport.h2grpc import (
    ENHANCE_YOUR_CALM,
    GOAWAY_PING,
    GOAWAY_PING_AGAIN,
    INVALID_ARGUMENT,
    PREFACE,
    RESPONSE_HEADERS,
    GrpcCall,
    GrpcConnection,
    GrpcServer,
    Method,
)
from recserve.serving.transport.h2limits import FloodLimits
from recserve.serving.wire.codec import aligned_buffer
from tests.support.wait import until

MAX_MESSAGE = 8 << 20


class Service:
    """Methods by name: echo, slow echo, never answer, an error with a non-ASCII message, a streaming echo."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.cancelled = threading.Event()
        self.deadlines: list[float | None] = []
        self.slow_calls = 0

    def __call__(self, path: str) -> Method | None:
        return {
            "/t.S/Echo": Method(unary=lambda call, raw: call.reply(bytes(raw))),
            "/t.S/Slow": Method(unary=self._slow),
            "/t.S/Never": Method(unary=self._never),
            "/t.S/Fail": Method(unary=lambda call, raw: call.finish(INVALID_ARGUMENT, "bad input: größe 100%")),
            "/t.S/Big": Method(unary=lambda call, raw: call.reply(b"z" * int(bytes(raw)))),
            "/t.S/Chat": Method(stream=lambda call: call.run(self._chat(call))),
        }.get(path)

    def _slow(self, call: GrpcCall, raw: memoryview) -> None:
        message = bytes(raw)
        self.slow_calls += 1
        self.loop.call_later(0.3, call.reply, message)

    def _never(self, call: GrpcCall, raw: memoryview) -> None:
        self.deadlines.append(call.time_remaining())
        call.on_cancel = self.cancelled.set

    async def _chat(self, call: GrpcCall) -> None:
        while (message := await call.requests.get()) is not None:
            call.send(bytes(message) + b"!")
        call.finish()


@pytest.fixture()
def served():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    service = Service(loop)
    server = GrpcServer(service, MAX_MESSAGE)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    asyncio.run_coroutine_threadsafe(server.start(sock), loop).result(60)
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20),
                                                      ("grpc.max_receive_message_length", 64 << 20)])
    try:
        yield channel, server, loop, service, address
    finally:
        channel.close()
        asyncio.run_coroutine_threadsafe(server.stop(grace=1.0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        sock.close()


def test_unary_calls_round_trip_many_times_on_one_connection(served):
    channel = served[0]
    echo = channel.unary_unary("/t.S/Echo")
    for i in range(300):
        payload = os.urandom(i % 97)
        assert echo(payload, timeout=5) == payload


def test_large_messages_cross_both_ways_within_the_peers_windows_and_frame_sizes(served):
    channel = served[0]
    payload = os.urandom(5 << 20)  # above the client's initial 64 KiB window and 16 KiB frames: flow control
    assert channel.unary_unary("/t.S/Echo")(payload, timeout=30) == payload
    assert channel.unary_unary("/t.S/Big")(str(6 << 20).encode(), timeout=30) == b"z" * (6 << 20)


@pytest.mark.integration  # seconds of work
def test_concurrent_calls_from_many_threads_all_get_their_own_answers(served):
    channel = served[0]
    echo, slow = channel.unary_unary("/t.S/Echo"), channel.unary_unary("/t.S/Slow")

    def one(i: int) -> bool:
        payload = str(i).encode() * (1 + i % 300)
        return (slow if i % 10 == 0 else echo)(payload, timeout=10) == payload

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, range(400)))


def test_a_streaming_call_answers_each_message_in_order(served):
    channel = served[0]
    chat = channel.stream_stream("/t.S/Chat")
    messages = [os.urandom(n) for n in (0, 1, 70_000, 5, 300_000)]
    assert list(chat(iter(messages), timeout=10)) == [m + b"!" for m in messages]


def test_an_error_carries_its_code_and_its_non_ascii_message(served):
    with pytest.raises(grpc.RpcError) as caught:
        served[0].unary_unary("/t.S/Fail")(b"x", timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "bad input: größe 100%"


def test_an_unknown_method_is_unimplemented(served):
    with pytest.raises(grpc.RpcError) as caught:
        served[0].unary_unary("/t.S/Nope")(b"x", timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_message_over_the_limit_is_resource_exhausted_and_the_connection_lives_on(served):
    channel = served[0]
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary("/t.S/Echo")(b"x" * (MAX_MESSAGE + 1), timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert channel.unary_unary("/t.S/Echo")(b"after", timeout=5) == b"after"


def test_the_deadline_reaches_the_handler_and_a_client_timeout_cancels_the_call(served):
    channel, _, _, service, _ = served
    # connected first: the call must reach the handler before its deadline, on a busy host too
    assert channel.unary_unary("/t.S/Echo")(b"connect", timeout=60) == b"connect"
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary("/t.S/Never")(b"x", timeout=2.0)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert service.cancelled.wait(60), "the client's RST_STREAM did not cancel the call"
    # grpc-core writes the timeout rounded up to a few significant digits (seen: 0.501 s for 0.5 s)
    assert service.deadlines and 0 < service.deadlines[0] <= 2.01


def test_a_gzip_compressed_request_is_inflated(served):
    payload = b"compress me " * 10_000
    answer = served[0].unary_unary("/t.S/Echo")(payload, timeout=5, compression=grpc.Compression.Gzip)
    assert answer == payload


def test_a_client_that_does_not_speak_http2_is_closed_with_goaway(served):
    host, port = served[4].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    assert received, "nothing answered"
    frames, goaway = received, False
    while len(frames) >= 9:  # our SETTINGS, WINDOW_UPDATE, then GOAWAY
        length = int.from_bytes(frames[:3], "big")
        goaway |= frames[3] == 7
        frames = frames[9 + length:]
    assert goaway


def test_a_graceful_stop_answers_the_calls_in_flight_and_takes_no_new_connection(served):
    channel, server, loop, service, address = served
    slow = channel.unary_unary("/t.S/Slow")
    with ThreadPoolExecutor(4) as pool:
        in_flight = [pool.submit(slow, b"%d" % i, timeout=10) for i in range(4)]
        assert until(lambda: service.slow_calls, lambda calls: calls == 4) == 4  # all four reached the server
        asyncio.run_coroutine_threadsafe(server.stop(grace=5.0), loop).result(10)
        assert [f.result() for f in in_flight] == [b"%d" % i for i in range(4)]
    with pytest.raises(OSError):
        socket.create_connection(address.split(":")[0:1] + [int(address.split(":")[1])], timeout=2)


def test_timeouts_and_messages_follow_the_grpc_wire_rules():
    assert _timeout_s(b"100m") == pytest.approx(0.1)
    assert _timeout_s(b"2S") == 2.0 and _timeout_s(b"1H") == 3600.0 and _timeout_s(b"5u") == pytest.approx(5e-6)
    assert _timeout_s(b"") is None and _timeout_s(b"10") is None and _timeout_s(b"x1m") is None
    assert _percent_encoded("a b%c\n") == b"a b%25c%0A"
    assert _percent_encoded("é") == b"%C3%A9"
    assert _percent_encoded("") == b"" and _percent_encoded("~ !$&") == b"~ !$&"


def test_grpc_message_percent_encoding_matches_the_rule_byte_by_byte():
    """gRPC's rule spelled per byte (printable ASCII but '%' as is, any other byte %XX) as the oracle, over strings
    of every byte value, control characters and multi-byte UTF-8."""
    import random

    def rule(text: str) -> bytes:
        return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode())

    rng = random.Random(7)
    alphabet = [chr(c) for c in range(0x00, 0x80)] + ["é", "€", "\u2028", "\U0001F600", "%", "\x7f", "\x1f"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80))) for _ in range(500)]
    for text in texts + ["".join(chr(c) for c in range(0x80))]:
        assert _percent_encoded(text) == rule(text), text


def _raw_connection(address: str) -> socket.socket:
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(PREFACE + _frame(4, 0, 0))  # preface + empty SETTINGS
    return sock


def _frames_until_closed(sock: socket.socket) -> list[tuple[int, bytes]]:
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    frames = []
    while len(received) >= 9:
        length = int.from_bytes(received[:3], "big")
        frames.append((received[3], received[9:9 + length]))
        received = received[9 + length:]
    return frames


def test_a_continuation_flood_ends_the_connection_and_the_server_serves_on(served):
    channel, address = served[0], served[4]
    with _raw_connection(address) as sock:
        sock.sendall(_frame(1, 0, 1, b"\x82"))  # HEADERS without END_HEADERS, then endless CONTINUATION
        try:
            for _ in range(100):
                sock.sendall(_frame(9, 0, 1, b"\x00" * 16_000))
        except (BrokenPipeError, ConnectionResetError):
            pass
        goaways = [payload for kind, payload in _frames_until_closed(sock) if kind == 7]
    assert goaways and int.from_bytes(goaways[-1][4:8], "big") == ENHANCE_YOUR_CALM
    assert channel.unary_unary("/t.S/Echo")(b"still here", timeout=5) == b"still here"


@pytest.mark.parametrize("garbage", [
    _frame(0, 0, 0, b"x"),  # DATA on stream 0
    _frame(1, 4, 2, b"\x82"),  # a server-side (even) stream id
    _frame(6, 0, 0, b"short"),  # PING of the wrong length
    _frame(4, 0, 0, b"\x00\x04\xff\xff\xff\xff"),  # initial window over 2^31 - 1
    _frame(1, 4, 1, b"\xff\xff\xff\xff"),  # an undecodable header block
    _frame(5, 4, 1, b"\x00\x00\x00\x02"),  # PUSH_PROMISE from a client
])
def test_protocol_errors_end_only_their_connection_with_goaway(served, garbage):
    channel, address = served[0], served[4]
    with _raw_connection(address) as sock:
        sock.sendall(garbage)
        assert any(kind == 7 for kind, _ in _frames_until_closed(sock))
    assert channel.unary_unary("/t.S/Echo")(b"ok", timeout=5) == b"ok"


def test_connections_turn_nagles_algorithm_off(served):
    """Without TCP_NODELAY an answer written while a PING acknowledgement was unacknowledged waited for the
    client's delayed ACK: 1-2% of calls took ~45 ms more (asyncio sets it only on sockets made with IPPROTO_TCP,
    and this fixture's listening socket, like most, is made with protocol 0)."""
    channel, server = served[0], served[1]
    assert channel.unary_unary("/t.S/Echo")(b"x", timeout=5) == b"x"
    sockets = [conn.transport.get_extra_info("socket") for conn in list(server.connections)]
    assert sockets and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


def test_random_frames_after_the_preface_never_break_the_server(served, caplog):
    """Seeded garbage (random frame kinds, flags, stream ids, payloads, cut anywhere): each connection may be
    closed, nothing escapes the protocol as an error, and the server serves on."""
    import random

    from hpack import Encoder

    channel, address = served[0], served[4]
    rng = random.Random(7)

    def header_block() -> bytes:
        path = rng.choice(["/t.S/Echo", "/t.S/Chat", "/nope"])
        return Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                                 ("content-type", "application/grpc")])

    def frame() -> bytes:
        kind = rng.choice([*range(11), 0, 1, 0, 1])
        payload = (header_block() if kind == 1 and rng.random() < 0.7 else
                   bytes([rng.choice([0, 1])]) + (n := rng.choice([0, 3, 2000])).to_bytes(4, "big")
                   + os.urandom(rng.choice([0, n, n // 2])) if kind == 0 and rng.random() < 0.6 else
                   os.urandom(rng.choice([0, 1, 4, 5, 6, 8, 9, 30])))
        return _frame(kind, rng.choice([0, 1, 4, 5, 8, 0x20, 0x25, 0xFF]), rng.choice([0, 1, 2, 3, 5, 2**31 - 1]),
                      payload)

    host, port = address.split(":")
    for _ in range(200):
        data = PREFACE + _frame(4, 0, 0) + b"".join(frame() for _ in range(rng.randint(1, 8)))
        data = data[:rng.randint(0, len(data))] if rng.random() < 0.2 else data
        with socket.create_connection((host, int(port)), timeout=2) as sock:
            sock.sendall(data)
            sock.settimeout(0.02)
            try:
                while sock.recv(65536):
                    pass
            except (TimeoutError, ConnectionResetError):
                pass
    assert channel.unary_unary("/t.S/Echo")(b"still serving", timeout=5) == b"still serving"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


class _Transport:
    """What a GrpcConnection writes, write by write (no socket: frames fed straight to ``data_received``)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.eof = False  # our side ended (``write_eof``)

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str) -> None:
        return None

    def write_eof(self) -> None:
        self.eof = True

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """(type, flags, stream, payload) of everything written since the last call."""
        data, self.writes = b"".join(self.writes), []
        out = []
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
            data = data[9 + length:]
        return out


def _connection(initial_window: int | None = None) -> tuple[GrpcConnection, _Transport]:
    echo = Method(unary=lambda call, raw: call.reply(bytes(raw)))
    conn, transport = GrpcConnection(lambda path: echo if path == "/t.S/Echo" else None, MAX_MESSAGE), _Transport()
    conn.connection_made(transport)
    settings = b"" if initial_window is None else (4).to_bytes(2, "big") + initial_window.to_bytes(4, "big")
    conn.data_received(PREFACE + _frame(4, 0, 0, settings))
    transport.frames()
    return conn, transport


def _call(stream: int, message: bytes, encoder) -> bytes:
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Echo"), (":authority", "x"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    return (_frame(1, 4, stream, block)
            + _frame(0, 1, stream, b"\x00" + len(message).to_bytes(4, "big") + message))


def test_a_unary_call_starts_at_the_end_of_its_read_and_its_answer_leaves_in_one_write():
    """Calls start once the read's frames are handled (so a reset in the same read cancels its call first); an
    answer made at once goes out with what that read queued, in one write (one syscall)."""
    from hpack import Encoder

    conn, transport = _connection()
    encoder = Encoder()
    for stream in (1, 3, 5):  # the first block is literal, then the same fields indexed (decoded once)
        conn.data_received(_call(stream, b"hi", encoder) + _frame(6, 0, 0, b"12345678"))
        assert len(transport.writes) == 1
        frames = transport.frames()
        assert [(kind, flags, sid) for kind, flags, sid, _ in frames] == [(6, 1, 0), (1, 4, stream),
                                                                         (0, 0, stream), (1, 5, stream)]
        assert frames[2][3] == b"\x00\x00\x00\x00\x02hi" and b"grpc-status" in frames[3][3]
    assert len(conn.h2.opener.heads.pure) == 1


def test_a_call_reset_in_the_read_that_completed_it_is_never_started():
    """Rapid Reset (CVE-2023-44487): HEADERS, the message and RST_STREAM back to back; the handler never sees
    the reset calls, and sees the one that was not reset."""
    from hpack import Encoder

    started: list[bytes] = []
    method = Method(unary=lambda call, raw: (started.append(bytes(raw)), call.reply(b"ok")))
    conn, transport = GrpcConnection(lambda path: method, MAX_MESSAGE), _Transport()
    conn.connection_made(transport)
    encoder = Encoder()
    reset = b"".join(_call(s, b"reset", encoder) + _frame(3, 0, s, b"\x00\x00\x00\x08") for s in (1, 3, 5))
    conn.data_received(PREFACE + _frame(4, 0, 0) + reset + _call(7, b"kept", encoder))
    assert started == [b"kept"]


def _goaway_last_ids(frames: list[tuple[int, int, int, bytes]]) -> list[int]:
    return [int.from_bytes(payload[:4], "big") for kind, _, _, payload in frames if kind == 7]


def test_a_stream_the_client_sends_after_its_ping_acknowledgements_is_still_served(monkeypatch):
    """grpc-core writes a PING's acknowledgement before the HEADERS of a stream it numbered just before it read
    the first GOAWAY, and behind a large message such HEADERS can trail both acknowledgements: the final GOAWAY
    waits for a second PING round trip and then for ``GOAWAY_QUIET_S`` with no new stream, so those streams are
    answered instead of crossing it (grpc-core retries a crossed call only while its message fits the retry
    buffer).  A stream after the final GOAWAY is refused."""
    from hpack import Encoder

    import recserve.serving.transport.h2closing as h2closing

    monkeypatch.setattr(h2closing, "GOAWAY_QUIET_S", 0.05)

    async def run() -> None:
        conn, transport = _connection()
        encoder = Encoder()
        conn.close_gracefully()
        frames = transport.frames()
        assert _goaway_last_ids(frames) == [2**31 - 1] and (6, 0, 0, GOAWAY_PING) in frames
        conn.data_received(_frame(6, 1, 0, GOAWAY_PING) + _call(1, b"late", encoder))
        frames = transport.frames()
        assert (0, 0, 1, b"\x00\x00\x00\x00\x04late") in frames  # answered, not refused
        assert _goaway_last_ids(frames) == [] and (6, 0, 0, GOAWAY_PING_AGAIN) in frames
        conn.data_received(_frame(6, 1, 0, GOAWAY_PING_AGAIN))
        await asyncio.sleep(0.02)
        conn.data_received(_call(3, b"later", encoder))  # after both acknowledgements, within the quiet time
        await asyncio.sleep(0.02)
        conn.data_received(_call(5, b"latest", encoder))  # arrivals restart the quiet time
        frames = transport.frames()
        assert (0, 0, 3, b"\x00\x00\x00\x00\x05later") in frames
        assert (0, 0, 5, b"\x00\x00\x00\x00\x06latest") in frames
        assert _goaway_last_ids(frames) == []
        await asyncio.sleep(0.3)
        frames = transport.frames()
        assert _goaway_last_ids(frames) == [5] and transport.eof  # quiet: the final GOAWAY names the last stream
        conn.data_received(_call(7, b"crossed", encoder))  # refused (our side has ended: nothing more is written)
        assert conn.h2.refused_streams == 1 and not [f for f in transport.frames() if f[2] == 7]

    asyncio.run(run())


def test_a_client_that_never_acknowledges_gets_the_final_goaway_after_a_while(monkeypatch):
    import recserve.serving.transport.h2closing as h2closing

    monkeypatch.setattr(h2closing, "GOAWAY_ACK_S", 0.01)

    from hpack import Encoder

    async def run() -> None:
        conn, transport = _connection()
        conn.data_received(_call(1, b"hi", Encoder()))
        transport.frames()
        conn.close_gracefully()
        assert _goaway_last_ids(transport.frames()) == [2**31 - 1] and not transport.eof
        await asyncio.sleep(0.05)
        assert _goaway_last_ids(transport.frames()) == [1] and transport.eof  # no call in flight: our side ends

    asyncio.run(run())


def test_an_answer_the_client_window_does_not_admit_waits_for_its_window_update():
    from hpack import Encoder

    conn, transport = _connection(initial_window=4)
    conn.data_received(_call(1, b"0123456789", Encoder()))
    frames = transport.frames()  # 15 bytes to send (5 of prefix, 10 of message), 4 admitted
    assert [(kind, payload) for kind, _, _, payload in frames][1:] == [(0, b"\x00\x00\x00\x00")]
    conn.data_received(_frame(8, 0, 1, (6).to_bytes(4, "big")))  # 6 more bytes on the stream: still 5 short
    assert [(kind, payload) for kind, _, _, payload in transport.frames()] == [(0, b"\x0a01234")]
    conn.data_received(_frame(8, 0, 0, (100).to_bytes(4, "big")))  # the connection's window was never short
    assert transport.frames() == []
    conn.data_received(_frame(8, 0, 1, (100).to_bytes(4, "big")))
    assert [(kind, flags, payload[:5]) for kind, flags, _, payload in transport.frames()] == [
        (0, 0, b"56789"), (1, 5, b"\x00\x0bgrp")]  # the rest, then the trailers
    assert not conn.h2.streams.open and not conn.h2.replies.blocked


def test_remembered_header_blocks_are_bounded():
    conn, transport = _connection()
    fields = [b"\x83", b"\x86", b"\x84", b"\x87", b"\x82"]  # static-table fields: each block a distinct request
    blocks = [b"".join(p) for p in itertools.permutations(fields)]
    for k, block in enumerate(blocks):
        conn.data_received(_frame(1, 5, 1 + 2 * k, block))
    assert 0 < len(conn.h2.opener.heads.pure) <= 64
    assert all(kind in (1, 3) for kind, *_ in transport.frames())  # answered (405 or UNIMPLEMENTED), never closed


def test_request_head_keeps_the_clients_metadata_for_forwarded_calls():
    """Custom metadata (``authorization``, a ``-bin`` entry) survives into ``GrpcCall.metadata`` as grpc.aio takes it;
    HTTP/2's and gRPC's own headers do not, and a remembered block of indexed fields gives the same metadata."""
    from hpack import Encoder

    conn = GrpcConnection(lambda path: None, 1 << 20)
    encoder = Encoder()
    headers = [(":method", "POST"), (":path", "/inference.GRPCInferenceService/RepositoryModelLoad"),
               ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "5S"),
               ("authorization", "Bearer s3cret"), ("trace-bin", "AAEC")]
    first = conn.h2.opener.heads.decode(encoder.encode(headers))
    assert first[4] == (("authorization", "Bearer s3cret"), ("trace-bin", b"\x00\x01\x02"))
    again = encoder.encode(headers)  # now every field is indexed in the dynamic table
    assert conn.h2.opener.heads.decode(again)[4] == first[4] and conn.h2.opener.heads.decode(again)[4] == first[4]


def _landing_connection(lead: int, limits: FloodLimits | None = None
                        ) -> tuple[GrpcConnection, _Transport, list[tuple[bytes, int]]]:
    """A connection whose Echo method receives large messages in ``codec.aligned_buffer``s aligning offset ``lead``
    and records each message as it came (its bytes, and the address of its byte ``lead`` modulo 64)."""
    import numpy as np

    seen: list[tuple[bytes, int]] = []

    def echo(call: GrpcCall, raw: memoryview) -> None:
        seen.append((bytes(raw), (np.frombuffer(raw, np.uint8).ctypes.data + lead) % 64))
        call.reply(b"ok")

    method = Method(unary=echo, land=lambda head, size: aligned_buffer(size, lead))
    wide = FloodLimits(stream_window=2**31 - 1, connection_window=2**31 - 1)  # these tests send past 1 MiB windows
    conn, transport = GrpcConnection(lambda path: method if path == "/t.S/Echo" else None, MAX_MESSAGE,
                                     limits=limits or wide), _Transport()
    conn.connection_made(transport)
    conn.data_received(PREFACE + _frame(4, 0, 0, b""))
    transport.frames()
    return conn, transport, seen


@pytest.mark.parametrize("lead", [0, 13, 63])
@pytest.mark.parametrize("pieces", [1, 2, 7])
def test_a_large_unary_message_is_assembled_with_its_named_part_aligned(lead, pieces):
    """However its DATA is cut (frames and reads), a large message arrives whole, with byte ``lead`` 64-byte
    aligned; a small one arrives as before."""
    from hpack import Encoder

    conn, transport, seen = _landing_connection(lead)
    encoder = Encoder()
    message = os.urandom(300_000)
    wire = _call(1, message, encoder)
    head_end = 9 + int.from_bytes(wire[:3], "big")
    data = wire[head_end + 9:]  # the DATA frame's payload: the gRPC prefix and the message
    cuts = sorted({0, len(data), *(len(data) * k // pieces + 3 * k for k in range(1, pieces))})
    frames = [_frame(0, 1 if b == len(data) else 0, 1, data[a:b]) for a, b in itertools.pairwise(cuts)]
    stream_bytes = wire[:head_end] + b"".join(frames)
    for k in range(0, len(stream_bytes), 70_001):  # reads cut across frames too
        conn.data_received(stream_bytes[k:k + 70_001])
    conn.data_received(_call(3, b"small", encoder))
    assert [m for m, _ in seen] == [message, b"small"]
    assert seen[0][1] == 0
    assert [(kind, flags) for kind, flags, _, _ in transport.frames()].count((1, 5)) == 2  # both answered


def _read_as_a_socket_would(conn: GrpcConnection, data: bytes, sizes: list[int]) -> tuple[int, list[int]]:
    """``data`` handed to ``conn`` as asyncio hands a BufferedProtocol its reads: each read fills at most what
    ``get_buffer`` offers and at most the next of ``sizes`` (cycled); returns how many reads went into a message,
    and where each read ended.  No buffer offered is larger than the connection's own read buffer, or a message's
    larger than a quarter of the stream window (DATA then meets the windows in pieces that a client sending on
    before our WINDOW_UPDATEs stays within)."""
    pos, direct, k, ends = 0, 0, 0, []
    while pos < len(data):
        buffer = conn.get_buffer(-1)
        assert len(buffer) <= (conn.h2.requests.stream_window // 4 if conn._direct else len(conn._reads))
        n = min(len(buffer), sizes[k % len(sizes)], len(data) - pos)
        k += 1
        buffer[:n] = data[pos:pos + n]
        direct += conn._direct
        conn.buffer_updated(n)
        pos += n
        ends.append(pos)
    return direct, ends


@pytest.mark.parametrize("windows", [None, 1 << 20], ids=["wide windows", "1 MiB windows"])
@pytest.mark.parametrize("seed", range(6))
def test_reads_straight_into_a_message_give_the_messages_and_frames_of_reads_as_bytes(seed, windows):
    """A differential test of the read paths: the same bytes (large and small calls on interleaved streams, DATA
    cut into frames of 16 KiB to 1 MiB, PINGs between them) handed over as bytes and as a socket fills a
    BufferedProtocol's buffers, some of them a message's own, give the same messages and the same frames out
    (answers, PING acknowledgements, and with 1 MiB windows every WINDOW_UPDATE)."""
    import random

    from hpack import Encoder

    rng = random.Random(seed)
    encoder = Encoder()
    parts, landed_in_large_frames = [], False
    for stream in range(1, 16, 2):
        message = rng.randbytes(rng.choice([10, 40_000, 300_000, 1_500_000]))
        wire = _call(stream, message, encoder)
        head_end = 9 + int.from_bytes(wire[:3], "big")
        data = wire[head_end + 9:]
        step = rng.choice([16_384, 100_000, 1 << 20])
        landed_in_large_frames |= len(message) >= 300_000 and step >= 100_000
        cuts = list(range(0, len(data), step)) + [len(data)]
        frames = [_frame(0, 1 if b == len(data) else 0, stream, data[a:b]) for a, b in itertools.pairwise(cuts)]
        parts.append(wire[:head_end] + b"".join(frames) + _frame(6, 0, 0, rng.randbytes(8)))
    stream_bytes = b"".join(parts)
    sizes = [rng.choice([1, 9, 4096, 65_536, 262_144]) for _ in range(7)]
    limits = None if windows is None else FloodLimits(stream_window=windows, connection_window=16 * windows)
    as_bytes, as_reads = _landing_connection(0, limits), _landing_connection(0, limits)
    direct, ends = _read_as_a_socket_would(as_reads[0], stream_bytes, sizes)
    for a, b in itertools.pairwise([0, *ends]):  # the same reads, as bytes
        as_bytes[0].data_received(stream_bytes[a:b])
    assert [m for m, _ in as_reads[2]] == [m for m, _ in as_bytes[2]] and len(as_bytes[2]) == 8
    assert as_reads[1].frames() == as_bytes[1].frames()
    assert (direct > 0) is landed_in_large_frames  # reads inside a large message's large frames went straight in


@pytest.mark.parametrize("window", [1 << 20, FloodLimits().stream_window])
def test_reads_into_a_message_count_its_data_in_the_pieces_other_reads_do(window):
    """A read into a message takes at most a quarter of the stream window, so DATA meets the windows in pieces
    small enough: a client that sends a 1.8 MB message in 1 MiB frames without waiting for our WINDOW_UPDATEs (as
    the benchmarks' bare client does) is served whether its bytes are read as bytes or into the message, not
    reset for a read that took the whole rest of a frame at once (with a 1 MiB stream window, and the default)."""
    from hpack import Encoder

    limits = FloodLimits(stream_window=window, connection_window=16 << 20)
    conn, transport, seen = _landing_connection(0, limits)
    message = os.urandom(1_800_000)
    wire = _call(1, message, Encoder())
    head_end = 9 + int.from_bytes(wire[:3], "big")
    data = wire[head_end + 9:]
    cuts = [*range(0, len(data), 1 << 20), len(data)]
    frames = b"".join(_frame(0, 1 if b == len(data) else 0, 1, data[a:b]) for a, b in itertools.pairwise(cuts))
    direct, _ = _read_as_a_socket_would(conn, wire[:head_end] + frames, [1 << 22])  # the socket fills any buffer
    assert direct > 0 and [m for m, _ in seen] == [message]
    assert 3 not in [kind for kind, _, _, _ in transport.frames()]  # no RST_STREAM


def test_a_large_unary_message_followed_by_another_is_refused_as_before():
    from hpack import Encoder

    conn, transport, seen = _landing_connection(0)
    wire = _call(1, os.urandom(100_000), Encoder())
    extra = b"\x00" + (2).to_bytes(4, "big") + b"hi"
    head_end = 9 + int.from_bytes(wire[:3], "big")
    payload = wire[head_end + 9:] + extra
    conn.data_received(wire[:head_end] + _frame(0, 1, 1, payload))
    assert not seen
    trailers = [payload for kind, flags, _, payload in transport.frames() if kind == 1]
    assert trailers and b"grpc-status" in trailers[-1]


def test_large_messages_assembled_at_once_on_a_connection_are_bounded():
    """A buffer is taken at a message's declared size: past two max messages at once on one connection, a further
    message is joined at its end as before (and still arrives whole)."""
    from hpack import Encoder

    conn, transport, seen = _landing_connection(0)
    encoder = Encoder()
    messages = {stream: os.urandom(MAX_MESSAGE - 1000) for stream in (1, 3, 5)}
    rests = {}
    for stream, message in messages.items():  # each call's headers and the first 100 kB of its message
        wire = _call(stream, message, encoder)
        head_end = 9 + int.from_bytes(wire[:3], "big")
        data = wire[head_end + 9:]
        conn.data_received(wire[:head_end] + _frame(0, 0, stream, data[:100_000]))
        rests[stream] = data[100_000:]
    assert [conn.h2.streams.open[s].landing is not None for s in (1, 3, 5)] == [True, True, False]
    for stream, rest in rests.items():
        for k in range(0, len(rest), 1 << 20):
            piece = rest[k:k + (1 << 20)]
            conn.data_received(_frame(0, 1 if k + len(piece) == len(rest) else 0, stream, piece))
    assert sorted(m for m, _ in seen) == sorted(messages.values())


def test_a_sink_streams_answers_keep_their_order_when_a_window_holds_one_back():
    """A streaming method served by a sink (no task) answers from the read; an answer after the first that the
    windows admit is written at once, but never ahead of an earlier answer still waiting for the client's window."""
    from hpack import Encoder

    class Echo:
        def __init__(self, call) -> None:
            self.call = call

        def put_nowait(self, message) -> None:
            if message is None:
                self.call.finish()
            else:
                self.call.send(bytes(message))

    chat = Method(sink=Echo)
    conn, transport = GrpcConnection(lambda path: chat, MAX_MESSAGE), _Transport()
    conn.connection_made(transport)
    conn.data_received(PREFACE + _frame(4, 0, 0, (4).to_bytes(2, "big") + (14).to_bytes(4, "big")))  # 14-byte window
    transport.frames()
    block = Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Chat"), (":authority", "x"),
                              ("content-type", "application/grpc"), ("te", "trailers")])

    def message(body: bytes) -> bytes:
        return b"\x00" + len(body).to_bytes(4, "big") + body

    conn.data_received(_frame(1, 4, 1, block) + _frame(0, 0, 1, message(b"ab")))
    assert [(kind, payload) for kind, _, _, payload in transport.frames()] == [(1, RESPONSE_HEADERS),
                                                                             (0, message(b"ab"))]
    conn.data_received(_frame(0, 0, 1, message(b"c")))  # 7 bytes of window left, 6 asked: one write, at once
    assert transport.writes == [_frame(0, 0, 1, message(b"c"))]
    transport.frames()
    conn.data_received(_frame(0, 0, 1, message(b"0123456789")))  # 1 byte of window left: held back
    conn.data_received(_frame(0, 1, 1, message(b"z")))  # small, but behind the held one; then the half-close
    assert [(kind, payload) for kind, _, _, payload in transport.frames()] == [(0, b"\x00")]
    conn.data_received(_frame(8, 0, 1, (100).to_bytes(4, "big")))
    frames = transport.frames()
    sent = b"".join(payload for kind, _, _, payload in frames if kind == 0)
    assert sent == message(b"0123456789")[1:] + message(b"z")
    assert frames[-1][:2] == (1, 5) and not conn.h2.streams.open  # then the trailers


@pytest.mark.integration  # seconds of work
def test_a_client_that_does_not_read_its_answers_stops_being_read(served):
    """Answers a client leaves unread (its windows wide open, its socket not read) fill the connection's write
    buffer; past ``WRITE_HIGH`` the server reads no more of its requests, so TCP holds the client back instead of
    the worker holding its answers without bound."""
    from hpack import Encoder

    from recserve.serving.transport.h2grpc import WRITE_HIGH

    _, server, loop, _, address = served
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # before connecting: a small window of ours
    sock.connect((host, int(port)))
    wide = (2**31 - 1).to_bytes(4, "big")
    sock.sendall(PREFACE + _frame(4, 0, 0, (4).to_bytes(2, "big") + wide)
                 + _frame(8, 0, 0, (2**31 - 1 - 65_535).to_bytes(4, "big")))
    sock.settimeout(2.0)
    encoder, payload, sent = Encoder(), os.urandom(64 << 10), 0
    try:
        for k in range(4096):  # 256 MiB of requests, and as much of answers, if nothing held the client back
            sock.sendall(_call(1 + 2 * k, payload, encoder))
            sent += len(payload)
    except TimeoutError:
        pass

    async def held() -> list[int]:
        return [conn.transport.get_write_buffer_size() for conn in server.connections if conn.transport]

    try:
        assert sent < 128 << 20, f"the client sent {sent >> 20} MiB without reading an answer"
        buffered = asyncio.run_coroutine_threadsafe(held(), loop).result(60)
        assert buffered and max(buffered) <= WRITE_HIGH + 4 * len(payload)
    finally:
        sock.close()


def test_answers_held_for_a_client_that_never_opens_its_windows_are_bounded(monkeypatch):
    """A stream whose client keeps asking while its flow-control windows stay closed would make the worker hold
    its answers without bound: past the hold limit the stream is reset (ENHANCE_YOUR_CALM), its call cancelled,
    and the connection serves on."""
    from hpack import Encoder

    import recserve.serving.transport.h2replies as h2replies

    monkeypatch.setattr(h2replies, "HOLD_BYTES", 1000)
    cancelled = []

    class Echo:
        def __init__(self, call) -> None:
            self.call = call
            call.on_cancel = lambda: cancelled.append(call.method)

        def put_nowait(self, message) -> None:
            if message is not None:
                self.call.send(bytes(message))

    methods = {"/t.S/Chat": Method(sink=Echo), "/t.S/Echo": Method(unary=lambda call, raw: call.reply(bytes(raw)))}
    conn, transport = GrpcConnection(methods.get, max_message=100), _Transport()
    conn.connection_made(transport)
    conn.data_received(PREFACE + _frame(4, 0, 0, (4).to_bytes(2, "big") + (4).to_bytes(4, "big")))  # 4-byte windows
    transport.frames()
    encoder = Encoder()

    def head(stream: int, path: str) -> bytes:
        return _frame(1, 4, stream, encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                                    (":authority", "x"), ("content-type", "application/grpc"),
                                                    ("te", "trailers")]))

    message = b"\x00" + (95).to_bytes(4, "big") + b"m" * 95
    conn.data_received(head(1, "/t.S/Chat"))
    for _ in range(20):  # 100 bytes of answer each, 4 of them ever admitted: reset past 1,000 held
        conn.data_received(_frame(0, 0, 1, message))
        if cancelled:
            break
    frames = transport.frames()
    assert (3, 0, 1, (11).to_bytes(4, "big")) in frames and cancelled == ["/t.S/Chat"]  # RST_STREAM 11
    assert 1 not in conn.h2.streams.open and conn.h2.replies.held() == 0
    conn.data_received(_frame(0, 0, 1, message))  # more of the reset stream: dropped
    conn.data_received(head(3, "/t.S/Echo") + _frame(0, 1, 3, b"\x00\x00\x00\x00\x02hi"))
    assert [(kind, sid) for kind, _, sid, _ in transport.frames()][:2] == [(1, 3), (0, 3)]  # served on


def test_a_client_whose_calls_are_all_refused_keeps_its_connection(served):
    """grpc-core announces its window on every stream it opens (a WINDOW_UPDATE), whether or not the answer carries
    data: calls answered with an error status alone earn those updates, so 1,500 of them in a row (past the glitch
    budget's burst of 1,000) keep their connection."""
    channel, server = served[0], served[1]
    abused: list[str] = []
    server.on_abuse = abused.append  # before the channel's first call makes its connection
    fail = channel.unary_unary("/t.S/Fail")
    for _ in range(1500):
        with pytest.raises(grpc.RpcError) as refused:
            fail(b"x", timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert abused == [] and len(server.connections) == 1


def test_a_client_that_cancels_every_call_keeps_its_connection(served):
    """Calls the client cancels (RST_STREAM: a deadline passed, a user gave up) earn the window announcement of
    their stream too: 1,500 cancelled in a row, within a reset budget raised for the test, keep the connection."""
    from recserve.serving.transport.h2limits import Rate

    channel, server, service = served[0], served[1], served[3]
    abused: list[str] = []
    server.on_abuse = abused.append  # both before the channel's first call makes its connection
    server.limits = FloodLimits(resets=Rate(5000, 1000))
    never = channel.unary_unary("/t.S/Never")
    assert channel.unary_unary("/t.S/Echo")(b"x", timeout=5) == b"x"  # connected
    for i in range(1500):
        call = never.future(b"x", timeout=5)
        waited = time.monotonic() + 5
        while not service.deadlines and time.monotonic() < waited:  # the server has the call: the cancel is a
            time.sleep(0.0005)                                       # RST_STREAM
        assert service.deadlines, f"call {i} never reached the server ({abused})"
        service.deadlines.clear()
        call.cancel()
    assert channel.unary_unary("/t.S/Echo")(b"y", timeout=5) == b"y"
    assert abused == [] and len(server.connections) == 1


def test_calls_and_their_streams_are_freed_as_they_end_without_the_cyclic_gc():
    """A stream and its call refer to each other; the call lets go of its stream as it ends (answered, or reset
    by the client before it started), so neither waits for the cyclic garbage collector (held request buffers
    included)."""
    import gc

    from hpack import Encoder

    from recserve.serving.transport.h2grpc import GrpcCall
    from recserve.serving.transport.h2streams import Stream

    method = Method(unary=lambda call, raw: call.reply(b"ok"))
    conn, transport = GrpcConnection(lambda path: method, MAX_MESSAGE), _Transport()
    conn.connection_made(transport)
    encoder = Encoder()

    def alive() -> int:
        return sum(type(o) in (GrpcCall, Stream) for o in gc.get_objects())  # type(): no proxy's __class__

    gc.collect()
    gc.disable()
    try:
        before = alive()
        conn.data_received(PREFACE + _frame(4, 0, 0) + b"".join(_call(s, b"hi", encoder) for s in range(1, 101, 2)))
        conn.data_received(b"".join(_call(s, b"reset", encoder) + _frame(3, 0, s, b"\x00\x00\x00\x08")
                                    for s in range(101, 201, 2)))
        answered = [f for f in transport.frames() if f[0] == 1 and f[1] & 1]
        assert len(answered) == 50 and alive() == before
    finally:
        gc.enable()


@pytest.mark.parametrize("read_size", [7, 4096, 65536, 256 * 1024])
def test_messages_read_through_the_reused_read_buffer_arrive_whole(read_size):
    """Reads land in one buffer the next read overwrites (``get_buffer`` / ``buffer_updated``): every message,
    small or landed in place, in one DATA frame or many, padded or not, split anywhere across reads, reaches its
    method with exactly the bytes sent."""
    from hpack import Encoder

    from recserve.serving.transport.h2frames import PADDED

    got: list[bytes] = []
    method = Method(unary=lambda call, raw: (got.append(bytes(raw)), call.reply(b"ok")),
                    land=lambda head, size: memoryview(bytearray(size)))
    conn, transport = GrpcConnection(lambda path: method if path == "/t.S/M" else None, MAX_MESSAGE), _Transport()
    conn.connection_made(transport)
    encoder, sent, wire = Encoder(), [], bytearray(PREFACE + _frame(4, 0, 0, b""))
    cases = [(3, 16384, False), (40_000, 16384, True), (300_000, 16384, False), (300_000, 1 << 20, False),
             (70_000, 999, True), (50_000, 16384, False), (1, 16, False)]  # (message bytes, frame bytes, padded)
    for k, (size, frame_size, padded) in enumerate(cases):
        message = bytes((k * 31 + i) % 251 for i in range(size))
        sent.append(message)
        stream = 1 + 2 * k
        body = b"\x00" + size.to_bytes(4, "big") + message
        wire += _frame(1, 4, stream, encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", "/t.S/M"),
                                                     (":authority", "x"), ("content-type", "application/grpc")]))
        for at in range(0, len(body), frame_size):
            piece, last = body[at:at + frame_size], at + frame_size >= len(body)
            flags = int(last) | (PADDED if padded else 0)
            wire += _frame(0, flags, stream, (b"\x02" + piece + b"\x00\x00") if padded else piece)
    for at in range(0, len(wire), read_size):
        chunk = wire[at:at + read_size]
        while chunk:
            buffer = conn.get_buffer(len(chunk))
            n = min(len(buffer), len(chunk))
            buffer[:n] = chunk[:n]
            conn.buffer_updated(n)
            chunk = chunk[n:]
    assert got == sent
