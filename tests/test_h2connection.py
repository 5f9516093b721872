"""The HTTP/2 protocol machine (serving/transport/h2connection.py) driven with bytes alone: no event loop, no socket,
no transport; a recording wire, a recording host and a fake clock."""

from __future__ import annotations

from queue import SimpleQueue

from hpack import Encoder

from recserve.serving.transport.h2connection import GOAWAY_ACK_S, GOAWAY_QUIET_MAX_S, GOAWAY_QUIET_S, H2Connection
from recserve.serving.transport.h2frames import (
    ACK,
    COMPRESSION_ERROR,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAMES_PER_TURN,
    GOAWAY,
    GOAWAY_PING,
    GOAWAY_PING_AGAIN,
    HEADERS,
    MAX_HEADER_LIST,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    timeout_s,
)
from recserve.serving.transport.h2grpc import GrpcCall
from recserve.serving.transport.h2limits import FloodLimits, Rate
from recserve.serving.transport.h2streams import Method

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Echo"), (":authority", "x"),
           ("content-type", "application/grpc"), ("te", "trailers")]


class Wire:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.eof = self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closed = True

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """(type, flags, stream, payload) of everything written since the last call."""
        data, self.writes, out = b"".join(self.writes), [], []
        while data:
            length = int.from_bytes(data[:3], "big")
            out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
            data = data[9 + length:]
        return out


class Host:
    def __init__(self) -> None:
        self.timers: list[tuple[float, object]] = []
        self.later = 0

    def call_later(self, delay: float, callback) -> None:  # type: ignore[no-untyped-def]
        self.timers.append((delay, callback))

    def read_later(self) -> None:
        self.later += 1


def _open(limits: FloodLimits | None = None, now: list[float] | None = None):  # type: ignore[no-untyped-def]
    now = now if now is not None else [100.0]
    seen: list[bytes] = []
    abused: list[str] = []
    echo = Method(unary=lambda call, raw: (seen.append(bytes(raw)), call.reply(bytes(raw))))
    host, wire = Host(), Wire()
    conn = H2Connection(lambda path: echo if path == "/t.S/Echo" else None, 1 << 20, host, GrpcCall, SimpleQueue,
                        limits=limits, on_abuse=abused.append, clock=lambda: now[0])
    conn.connection_made(wire)
    conn.receive(PREFACE + frame(SETTINGS, 0, 0))
    wire.frames()
    return conn, wire, host, seen, abused


def _call(encoder: Encoder, stream: int, message: bytes) -> bytes:
    return (frame(HEADERS, END_HEADERS, stream, encoder.encode(REQUEST))
            + frame(DATA, END_STREAM, stream, b"\x00" + len(message).to_bytes(4, "big") + message))


def test_a_unary_call_is_answered_with_exactly_these_bytes_in_one_write():
    conn, wire, _, seen, _ = _open()
    conn.receive(_call(Encoder(), 1, b"hi"))
    assert seen == [b"hi"] and len(wire.writes) == 1
    headers = b"\x88\x00\x0ccontent-type\x10application/grpc"  # :status 200 (static 8), content-type literal
    trailers = b"\x00\x0bgrpc-status\x010"
    assert wire.writes[0] == (len(headers).to_bytes(3, "big") + b"\x01\x04\x00\x00\x00\x01" + headers
                              + b"\x00\x00\x07\x00\x00\x00\x00\x00\x01" + b"\x00\x00\x00\x00\x02hi"
                              + len(trailers).to_bytes(3, "big") + b"\x01\x05\x00\x00\x00\x01" + trailers)
    assert conn.open_streams == 0


def test_a_ping_flood_is_answered_goaway_enhance_your_calm():
    conn, wire, _, _, abused = _open(FloodLimits(pings=Rate(3, 0)))
    conn.receive(frame(PING, 0, 0, b"12345678") * 5)
    frames = wire.frames()
    assert [kind for kind, *_ in frames] == [PING, PING, PING, GOAWAY]  # three acknowledged, then the GOAWAY
    goaway = frames[-1][3]
    assert int.from_bytes(goaway[4:8], "big") == ENHANCE_YOUR_CALM and goaway[8:] == b"too_many_pings"
    assert wire.closed and abused == ["too_many_pings"]


def test_the_ping_budget_refills_with_the_injected_clock():
    now = [100.0]
    conn, wire, _, _, abused = _open(FloodLimits(pings=Rate(1, 1)), now)
    conn.receive(frame(PING, 0, 0, b"12345678"))
    now[0] += 1.0
    conn.receive(frame(PING, 0, 0, b"12345678"))
    assert [kind for kind, *_ in wire.frames()] == [PING, PING] and not abused and conn.last_read == 101.0


def test_data_past_a_streams_window_resets_it_and_past_the_connections_closes_it():
    conn, wire, _, seen, _ = _open(FloodLimits(stream_window=1000, connection_window=3000))
    encoder = Encoder()
    conn.receive(frame(HEADERS, END_HEADERS, 1, encoder.encode(REQUEST)) + frame(DATA, 0, 1, b"\x00" * 1001))
    assert (RST_STREAM, 0, 1, FLOW_CONTROL_ERROR.to_bytes(4, "big")) in wire.frames() and conn.open_streams == 0
    conn.receive(_call(encoder, 3, b"ok"))  # the connection serves on
    assert seen == [b"ok"]
    wire.frames()
    conn.receive(frame(HEADERS, END_HEADERS, 5, encoder.encode(REQUEST)) + frame(DATA, 0, 5, b"\x00" * 2000))
    goaway = [payload for kind, _, _, payload in wire.frames() if kind == GOAWAY]
    assert [int.from_bytes(p[4:8], "big") for p in goaway] == [FLOW_CONTROL_ERROR] and wire.closed


def test_frames_past_a_turns_budget_are_left_for_the_host_to_hand_back():
    conn, wire, host, seen, _ = _open()
    updates = frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")) * FRAMES_PER_TURN
    conn.receive(updates + _call(Encoder(), 1, b"late"))
    assert host.later == 1 and conn.backlog and not seen
    conn.receive_backlog()
    assert seen == [b"late"] and not conn.backlog and host.later == 1


def test_a_graceful_close_asked_for_before_the_connection_is_made_is_done_once_it_is():
    """Accepted, transport not made yet, when its worker retires: once made it gets our SETTINGS, then GOAWAY and
    PING, so calls its client already sent are answered, not left to fail at the server's grace."""
    host, wire = Host(), Wire()
    conn = H2Connection(lambda path: None, 1 << 20, host, GrpcCall, SimpleQueue)
    conn.close_gracefully()
    assert wire.writes == [] and host.timers == []
    conn.connection_made(wire)
    assert [kind for kind, *_ in wire.frames()][-2:] == [GOAWAY, PING] and len(host.timers) == 1


def test_a_graceful_close_asks_the_host_for_its_timer_and_ends_our_side_when_it_fires():
    conn, wire, host, _, _ = _open()
    conn.receive(_call(Encoder(), 1, b"hi"))
    wire.frames()
    conn.close_gracefully()
    assert [kind for kind, *_ in wire.frames()] == [GOAWAY, PING] and not wire.eof
    [(delay, fire)] = host.timers
    assert delay == GOAWAY_ACK_S
    fire()  # type: ignore[operator]
    [(kind, _, _, payload)] = wire.frames()
    assert kind == GOAWAY and int.from_bytes(payload[:4], "big") == 1 and wire.eof


def test_streams_that_keep_arriving_after_the_acknowledgements_delay_the_final_goaway_up_to_a_bound():
    """Each quiet check that saw a new stream waits again; ``GOAWAY_QUIET_MAX_S`` after the second acknowledgement
    the final GOAWAY goes anyway, naming the last stream that arrived."""
    now = [100.0]
    conn, wire, host, seen, _ = _open(now=now)
    encoder = Encoder()
    conn.close_gracefully()
    wire.frames()
    conn.receive(frame(PING, ACK, 0, GOAWAY_PING))
    conn.receive(frame(PING, ACK, 0, GOAWAY_PING_AGAIN))
    stream = 1
    while not wire.eof:
        _, check = host.timers.pop()
        conn.receive(_call(encoder, stream, b"x"))  # a stream within every quiet time
        stream += 2
        now[0] += GOAWAY_QUIET_S
        check()  # type: ignore[operator]
        assert stream < 200
    last = [int.from_bytes(p[:4], "big") for kind, _, _, p in wire.frames() if kind == GOAWAY]
    assert last == [stream - 2] and len(seen) == (stream - 1) // 2
    assert now[0] - 100.0 >= GOAWAY_QUIET_MAX_S


def test_streams_refused_over_the_held_bytes_budget_are_each_counted_but_logged_once_per_interval(
        monkeypatch, caplog):
    """A client that opens stream after stream and never completes one is refused on each (RESOURCE_EXHAUSTED, one
    abuse count each), but writes one log line per interval, not one per stream (log flooding)."""
    from recserve.serving.transport import h2requests
    from recserve.serving.transport.h2limits import ByteBudget, LogBudget

    now = [100.0]
    monkeypatch.setattr(h2requests, "REFUSED_LOG", LogBudget(10.0, clock=lambda: now[0]))
    abused: list[str] = []
    echo = Method(unary=lambda call, raw: call.reply(bytes(raw)))
    wire = Wire()
    conn = H2Connection(lambda path: echo, 1 << 20, Host(), GrpcCall, SimpleQueue, on_abuse=abused.append,
                        held=ByteBudget(100), clock=lambda: now[0])
    conn.connection_made(wire)
    conn.receive(PREFACE + frame(SETTINGS, 0, 0))
    encoder = Encoder()

    def incomplete(stream: int) -> bytes:  # a 1,000-byte message of which 200 bytes came
        return (frame(HEADERS, END_HEADERS, stream, encoder.encode(REQUEST))
                + frame(DATA, 0, stream, b"\x00" + (1000).to_bytes(4, "big") + b"x" * 200))

    with caplog.at_level("WARNING", logger=h2requests.__name__):
        for stream in (1, 3, 5, 7, 9):
            conn.receive(incomplete(stream))
        now[0] += 11.0
        conn.receive(incomplete(11))
    assert abused == ["too_many_request_bytes"] * 6
    lines = [r.getMessage() for r in caplog.records if "refused: incomplete requests" in r.getMessage()]
    assert len(lines) == 2 and "stream 1 refused" in lines[0] and lines[1].endswith("(4 more such refusals since "
                                                                                   "the last line)")


def test_a_log_budget_lets_one_line_through_an_interval_and_counts_the_rest():
    from recserve.serving.transport.h2limits import LogBudget

    now = [0.0]
    budget = LogBudget(10.0, clock=lambda: now[0])
    assert budget.allow() == 0
    assert [budget.allow() for _ in range(3)] == [None] * 3
    now[0] = 9.9
    assert budget.allow() is None
    now[0] = 10.0
    assert budget.allow() == 4 and budget.allow() is None


def test_a_header_list_past_grpc_cores_metadata_limit_ends_the_connection_one_within_it_is_served():
    """HPACK stops at MAX_HEADER_LIST decoded bytes (empty literal fields cost 32 each but take 3 bytes of block):
    COMPRESSION_ERROR, the connection closed; 8 KiB of metadata, grpc-core's default limit, is a call like any."""
    conn, wire, _, seen, _ = _open()
    encoder = Encoder()
    conn.receive(frame(HEADERS, END_HEADERS, 1, encoder.encode(REQUEST + [("x-big", "v" * (8 << 10))]))
                 + frame(DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x02hi"))
    assert seen == [b"hi"] and not wire.closed
    wire.frames()
    empty_literals = b"\x00\x00\x00" * (MAX_HEADER_LIST // 32 + 1)
    conn.receive(frame(HEADERS, END_HEADERS, 3, empty_literals))
    goaway = [payload for kind, _, _, payload in wire.frames() if kind == GOAWAY]
    assert len(goaway) == 1 and int.from_bytes(goaway[0][4:8], "big") == COMPRESSION_ERROR and wire.closed


def test_remembered_header_blocks_decode_as_hpack_does_whatever_the_table_went_through():
    """The head of a remembered block (one that left the dynamic table alone) against hpack's own decoder (the
    oracle) run over the same blocks, in streams of calls whose fields are indexed, literal without indexing, never
    indexed and inserted, with table size updates and entries evicted by a small table."""
    import random

    from hpack import Decoder, Encoder, NeverIndexedHeaderTuple

    from recserve.serving.transport.h2heads import HeadDecoder, _head

    rng = random.Random(7)
    for table_size in (4096, 200):
        encoder, oracle, heads = Encoder(), Decoder(), HeadDecoder()
        encoder.header_table_size = table_size
        hits = 0
        for i in range(400):
            if table_size == 4096 and i % 97 == 96:  # a size update: the next block starts with it (it may evict)
                encoder.header_table_size = rng.choice([256, 1024, 4096])
            fields = [(":method", "GET" if rng.random() < 0.1 else "POST"), (":scheme", "http"),
                      (":path", f"/s.S/M{rng.randrange(2)}"), ("content-type", "application/grpc"),
                      ("te", "trailers"), ("x-user", f"u{rng.randrange(2)}")]
            if rng.random() < 0.3:
                fields.append(("grpc-timeout", f"{rng.randrange(1, 3)}S"))
            if rng.random() < 0.1:
                fields.append(NeverIndexedHeaderTuple("authorization", f"t{rng.randrange(2)}"))
            block = encoder.encode(fields, huffman=rng.random() < 0.5)
            hits += block in heads.pure
            assert heads.decode(block) == _head(oracle.decode(block, raw=True))
        if table_size == 4096:  # in 200 bytes every block inserts and evicts: none leaves the table alone
            assert hits > 100, hits  # repeated blocks were answered from memory, not all decoded


def test_a_grpc_timeout_of_more_than_eight_digits_is_ignored_not_a_failure_of_the_connection():
    """gRPC's TimeoutValue has at most 8 digits; a longer one (``int`` refuses thousands of digits, ``float``
    overflows on hundreds) is ignored as grpc-core ignores one it cannot parse, and the call is served."""
    assert timeout_s(b"99999999H") == 99999999 * 3600.0 and timeout_s(b"5S") == 5.0
    assert timeout_s(b"1" * 9 + b"S") is None
    conn, wire, _, seen, _ = _open()
    encoder = Encoder()
    for stream, digits in ((1, 400), (3, 5000)):
        conn.receive(frame(HEADERS, END_HEADERS, stream,
                           encoder.encode(REQUEST + [("grpc-timeout", "9" * digits + "S")]))
                     + frame(DATA, END_STREAM, stream, b"\x00\x00\x00\x00\x02hi"))
    assert seen == [b"hi", b"hi"] and not wire.closed


def test_an_unexpected_error_on_what_a_client_sent_ends_its_connection_with_goaway_and_one_log_line(caplog):
    """A bug a client's bytes reach (here the method lookup failing) ends that connection with GOAWAY
    INTERNAL_ERROR, not an exception out of ``receive`` (the event loop's "fatal error" and a traceback each)."""
    import logging

    from recserve.serving.transport import h2connection

    def methods(path: str) -> Method:
        raise RuntimeError("a bug")

    h2connection.BUG_LOG._last = None
    for _ in range(2):
        wire = Wire()
        conn = H2Connection(methods, 1 << 20, Host(), GrpcCall, SimpleQueue)
        conn.connection_made(wire)
        with caplog.at_level(logging.ERROR, logger="recserve.serving.transport.h2connection"):
            conn.receive(PREFACE + frame(SETTINGS, 0, 0) + _call(Encoder(), 1, b"hi"))
        goaway = [payload for kind, _, _, payload in wire.frames() if kind == GOAWAY]
        assert len(goaway) == 1 and int.from_bytes(goaway[0][4:8], "big") == 0x2 and wire.closed
    assert len([r for r in caplog.records if "gRPC connection failed" in r.getMessage()]) == 1
