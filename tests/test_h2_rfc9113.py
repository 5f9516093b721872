"""RFC 9113 MUSTs of the workers' HTTP/2 server (serving/transport/h2grpc.py), sans-IO: window updates of 0 and window
overflow, malformed requests as stream errors, and frames for a stream the server reset ignored."""

from __future__ import annotations

import pytest
from hpack import Encoder

from recserve.serving.transport.h2frames import PREFACE
from recserve.serving.transport.h2frames import frame as _frame
from recserve.serving.transport.h2grpc import GrpcConnection, Method
from tests.support.h2_transport import Transport

DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 7, 8
END_STREAM, END_HEADERS = 0x1, 0x4
PROTOCOL_ERROR, FLOW_CONTROL_ERROR = 0x1, 0x3
GOOD = [(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Echo"), (":authority", "x"),
        ("content-type", "application/grpc"), ("te", "trailers")]
MESSAGE = b"\x00\x00\x00\x00\x02hi"


def _open() -> tuple[GrpcConnection, Transport, list[bytes], Encoder]:
    started: list[bytes] = []
    method = Method(unary=lambda call, raw: (started.append(bytes(raw)), call.reply(b"ok")))
    conn, transport = GrpcConnection(lambda path: method, 1 << 20), Transport()
    conn.connection_made(transport)
    conn.data_received(PREFACE + _frame(SETTINGS, 0, 0))
    transport.frames()
    return conn, transport, started, Encoder()


def _call(encoder: Encoder, stream: int, headers: list[tuple[str, str]] = GOOD) -> bytes:
    return _frame(HEADERS, END_HEADERS, stream, encoder.encode(headers)) + _frame(DATA, END_STREAM, stream, MESSAGE)


def _code(payload: bytes, at: int = 0) -> int:
    return int.from_bytes(payload[at:at + 4], "big")


def test_a_connection_window_update_of_zero_is_a_connection_error():
    conn, transport, _, _ = _open()
    conn.data_received(_frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"))
    goaways = [p for kind, _, p in transport.frames() if kind == GOAWAY]
    assert goaways and _code(goaways[0], 4) == PROTOCOL_ERROR and transport.closed


@pytest.mark.parametrize("increment, code", [(0, PROTOCOL_ERROR), (2**31 - 1, FLOW_CONTROL_ERROR)])
def test_a_stream_window_update_of_zero_or_past_the_maximum_resets_only_that_stream(increment, code):
    conn, transport, started, encoder = _open()
    conn.data_received(_frame(HEADERS, END_HEADERS, 1, encoder.encode(GOOD))
                       + _frame(WINDOW_UPDATE, 0, 1, increment.to_bytes(4, "big")))
    frames = transport.frames()
    assert [(kind, stream, _code(p)) for kind, stream, p in frames if kind == RST_STREAM] == [(RST_STREAM, 1, code)]
    assert not transport.closed
    conn.data_received(_frame(DATA, END_STREAM, 1, MESSAGE) + _call(encoder, 3))  # late data ignored; serves on
    assert started == [MESSAGE[5:]] and not any(kind == GOAWAY for kind, _, _ in transport.frames())


MALFORMED = {
    "uppercase name": [*GOOD, ("X-Upper", "1")],
    "connection-specific": [*GOOD, ("connection", "keep-alive")],
    "transfer-encoding": [*GOOD, ("transfer-encoding", "chunked")],
    "te not trailers": [*GOOD[:5], ("te", "gzip")],
    "missing :path": [h for h in GOOD if h[0] != ":path"],
    "missing :method": [h for h in GOOD if h[0] != ":method"],
    "pseudo after regular": [*GOOD[:2], ("content-type", "application/grpc"), *GOOD[2:4], ("te", "trailers")],
    "unknown pseudo": [*GOOD[:4], (":protocol", "x"), *GOOD[4:]],
    "repeated pseudo": [*GOOD[:4], (":path", "/t.S/Other"), *GOOD[4:]],
    # RFC 9113 8.2.1: characters a field name or value must not hold
    "space in name": [*GOOD, ("x y", "1")],
    "control in name": [*GOOD, ("x\x01y", "1")],
    "non-ascii name": [*GOOD, ("x\xe9", "1")],
    "empty name": [*GOOD, ("", "1")],
    "cr lf in value": [*GOOD, ("x-v", "a\r\nx-injected: 1")],
    "nul in value": [*GOOD, ("x-v", "a\x00b")],
    "leading space in value": [*GOOD, ("x-v", " a")],
    "trailing tab in value": [*GOOD, ("x-v", "a\t")],
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_request_is_a_stream_error_and_its_late_frames_are_ignored(name):
    conn, transport, started, encoder = _open()
    conn.data_received(_frame(HEADERS, END_HEADERS, 1, encoder.encode(MALFORMED[name])))
    frames = transport.frames()
    assert [(kind, stream, _code(p)) for kind, stream, p in frames if kind == RST_STREAM] == \
        [(RST_STREAM, 1, PROTOCOL_ERROR)]
    # what the client sent before it saw the reset: its message and trailers, then a good call
    conn.data_received(_frame(DATA, 0, 1, MESSAGE)
                       + _frame(HEADERS, END_HEADERS | END_STREAM, 1, encoder.encode([("x-trailer", "1")]))
                       + _call(encoder, 3))
    assert started == [MESSAGE[5:]] and not transport.closed
    assert not any(kind == GOAWAY for kind, _, _ in transport.frames())


def test_a_well_formed_request_with_metadata_is_not_malformed():
    conn, transport, started, encoder = _open()
    conn.data_received(_call(encoder, 1, [*GOOD, ("authorization", "Bearer x"), ("grpc-timeout", "5S")]))
    assert started == [MESSAGE[5:]] and not any(kind == RST_STREAM for kind, _, _ in transport.frames())


# ---- receive windows (RFC 9113 5.2, 6.9) ----------------------------------------------------------------------
def _windowed(stream_window: int = 1 << 16, connection_window: int = 1 << 18):
    from recserve.serving.transport.h2limits import FloodLimits

    started: list[bytes] = []
    method = Method(unary=lambda call, raw: (started.append(bytes(raw)), call.reply(b"ok")))
    limits = FloodLimits(stream_window=stream_window, connection_window=connection_window)
    conn, transport = GrpcConnection(lambda path: method, 1 << 22, limits=limits), Transport()
    conn.connection_made(transport)
    opening = transport.frames()
    conn.data_received(PREFACE + _frame(SETTINGS, 0, 0))
    transport.frames()
    return conn, transport, started, Encoder(), opening


def _message_frames(stream: int, size: int, frame: int = 1 << 14, end: bool = True) -> bytes:
    body = b"\x00" + size.to_bytes(4, "big") + b"m" * size
    pieces = [body[at:at + frame] for at in range(0, len(body), frame)]
    return b"".join(_frame(DATA, END_STREAM if end and k == len(pieces) - 1 else 0, stream, piece)
                    for k, piece in enumerate(pieces))


def test_the_receive_windows_are_advertised_as_configured():
    _, _, _, _, opening = _windowed(stream_window=100_000, connection_window=1 << 20)
    settings = next(p for kind, _, p in opening if kind == SETTINGS)
    advertised = {int.from_bytes(settings[at:at + 2], "big"): _code(settings, at + 2)
                  for at in range(0, len(settings), 6)}
    assert advertised[0x4] == 100_000  # SETTINGS_INITIAL_WINDOW_SIZE
    assert [(stream, _code(p)) for kind, stream, p in opening if kind == WINDOW_UPDATE] == [(0, (1 << 20) - 65_535)]


def test_a_call_taking_its_request_gets_its_windows_back_as_it_reads_and_a_large_message_arrives():
    conn, transport, started, encoder, _ = _windowed()
    conn.data_received(_frame(HEADERS, END_HEADERS, 1, encoder.encode(GOOD)) + _message_frames(1, 50_000, end=False))
    updates = [(stream, _code(p)) for kind, stream, p in transport.frames() if kind == WINDOW_UPDATE]
    assert updates and all(stream == 1 for stream, _ in updates)  # half the stream's window read: replenished
    assert sum(n for _, n in updates) <= 50_005
    conn.data_received(_frame(DATA, END_STREAM, 1, b""))
    assert len(started) == 1  # 50 kB in a 64 KiB stream window


def test_data_past_a_streams_window_is_a_stream_error_and_the_connection_serves_on():
    conn, transport, started, encoder, _ = _windowed(stream_window=1 << 16)
    # one frame larger than the stream's whole window: a client that ignores flow control
    conn.data_received(_frame(HEADERS, END_HEADERS, 1, encoder.encode(GOOD)) + _frame(DATA, 0, 1, b"\x00" * 70_000))
    assert [(kind, stream, _code(p)) for kind, stream, p in transport.frames() if kind == RST_STREAM] == \
        [(RST_STREAM, 1, FLOW_CONTROL_ERROR)]
    conn.data_received(_frame(DATA, 0, 1, b"\x00" * 100) + _call(encoder, 3))  # late data ignored; serves on
    assert started == [MESSAGE[5:]] and not transport.closed


def test_data_past_the_connections_window_is_a_connection_error():
    conn, transport, _, encoder, _ = _windowed(stream_window=1 << 20, connection_window=1 << 17)
    conn.data_received(_frame(HEADERS, END_HEADERS, 1, encoder.encode(GOOD)) + _frame(DATA, 0, 1, b"\x00" * 140_000))
    goaways = [p for kind, _, p in transport.frames() if kind == GOAWAY]
    assert goaways and _code(goaways[0], 4) == FLOW_CONTROL_ERROR and transport.closed


def test_a_call_already_answered_gets_no_more_stream_window():
    conn, transport, started, encoder, _ = _windowed()
    # an unknown content type is answered at once (415); the client keeps sending the stream's data
    bad = [h if h[0] != "content-type" else ("content-type", "text/plain") for h in GOOD]
    conn.data_received(_frame(HEADERS, END_HEADERS, 1, encoder.encode(bad)) + _message_frames(1, 60_000, end=False))
    updates = [(stream, _code(p)) for kind, stream, p in transport.frames() if kind == WINDOW_UPDATE]
    assert all(stream == 0 for stream, _ in updates)  # only the connection's window comes back


# ---- compressed and cut-short messages (gRPC's PROTOCOL-HTTP2.md and compression.md) ------------------------------
def _answer(headers: list[tuple[str, str]], data: bytes) -> tuple[dict[str, str], list[bytes]]:
    """The trailers-only answer to one call (its fields decoded) and the messages the method was given."""
    from hpack import Decoder

    conn, transport, started, encoder = _open()
    conn.data_received(_frame(HEADERS, END_HEADERS, 1, encoder.encode(headers)) + _frame(DATA, END_STREAM, 1, data))
    blocks = [p for kind, stream, p in transport.frames() if kind == HEADERS and stream == 1]
    decoder = Decoder()
    return {k: v for block in blocks for k, v in decoder.decode(block)}, started


def _compressed(payload: bytes) -> bytes:
    return b"\x01" + len(payload).to_bytes(4, "big") + payload


def test_a_compressed_message_is_inflated_only_when_whole_and_its_coding_named_and_undone():
    import gzip

    packed = gzip.compress(b"hi")
    fields, started = _answer([*GOOD, ("grpc-encoding", "gzip")], _compressed(packed))
    assert fields["grpc-status"] == "0" and started == [b"hi"]
    for headers, payload, status, words in (
        (GOOD, packed, "13", "names no compression"),  # the flag set, no grpc-encoding
        ([*GOOD, ("grpc-encoding", "identity")], packed, "13", "names no compression"),
        ([*GOOD, ("grpc-encoding", "snappy")], packed, "12", "'snappy': not supported"),
        ([*GOOD, ("grpc-encoding", "gzip")], packed[:-8], "13", "ends early"),  # its CRC and size cut off
        ([*GOOD, ("grpc-encoding", "gzip")], packed + b"junk", "13", "followed by other bytes"),
    ):
        fields, started = _answer(headers, _compressed(payload))
        assert (fields["grpc-status"], started) == (status, []) and words in fields["grpc-message"], fields
    assert fields.get("grpc-accept-encoding") is None
    fields, _ = _answer([*GOOD, ("grpc-encoding", "snappy")], _compressed(packed))
    assert fields["grpc-accept-encoding"] == "identity,deflate,gzip"  # what a refused coding's answer names


def test_a_unary_request_cut_inside_its_message_says_so():
    fields, started = _answer(GOOD, b"\x00" + (100).to_bytes(4, "big") + b"only ten b")
    assert fields["grpc-status"] == "13" and "ended inside its message" in fields["grpc-message"] and not started
    fields, _ = _answer(GOOD, MESSAGE + MESSAGE)
    assert "exactly one request message" in fields["grpc-message"]


def test_a_unary_call_whose_client_leaves_mid_request_is_reported_gone_once():
    """Reset mid-upload, or the connection lost mid-upload: ``client_gone`` (counted as HTTP's is); a call whose
    request ended before the reset is not."""
    reasons: list[str] = []
    method = Method(unary=lambda call, raw: None)  # never answers: the call stays open
    conn, transport = GrpcConnection(lambda path: method, 1 << 20, on_abuse=reasons.append), Transport()
    conn.connection_made(transport)
    encoder = Encoder()
    conn.data_received(PREFACE + _frame(SETTINGS, 0, 0)
                       + _frame(HEADERS, END_HEADERS, 1, encoder.encode(GOOD)) + _frame(DATA, 0, 1, MESSAGE[:4])
                       + _frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big")))  # CANCEL mid-message
    assert reasons == ["client_gone"]
    conn.data_received(_call(encoder, 3) + _frame(RST_STREAM, 0, 3, (8).to_bytes(4, "big")))  # sent whole first
    assert reasons == ["client_gone"]
    conn.data_received(_frame(HEADERS, END_HEADERS, 5, encoder.encode(GOOD)) + _frame(DATA, 0, 5, MESSAGE[:4]))
    conn.connection_lost(None)
    assert reasons == ["client_gone", "client_gone"]


PRIORITY = 2


@pytest.mark.parametrize("kind, stream, payload", [
    (RST_STREAM, 5, b"\x00\x00\x00\x08"),  # a client stream not opened yet
    (RST_STREAM, 2, b"\x00\x00\x00\x08"),  # a server stream: we push none
    (RST_STREAM, 0, b"\x00\x00\x00\x08"),
    (WINDOW_UPDATE, 5, b"\x00\x00\x00\x01"),
    (PRIORITY, 0, b"\x00\x00\x00\x00\x10"),
])
def test_a_frame_on_an_idle_stream_or_stream_zero_is_a_connection_error(kind, stream, payload):
    """RFC 9113 5.1: on an idle stream only HEADERS and PRIORITY; 6.4, 6.3: RST_STREAM and PRIORITY never on 0."""
    conn, transport, started, encoder = _open()
    conn.data_received(_call(encoder, 1))
    transport.frames()
    conn.data_received(_frame(kind, 0, stream, payload))
    goaways = [p for k, _, p in transport.frames() if k == GOAWAY]
    assert goaways and _code(goaways[0], 4) == PROTOCOL_ERROR and transport.closed


def test_a_reset_of_a_stream_once_open_and_priority_on_an_idle_one_are_no_errors():
    conn, transport, started, encoder = _open()
    conn.data_received(_call(encoder, 1))  # answered: the frames below cross our answer
    conn.data_received(_frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x08") + _frame(WINDOW_UPDATE, 0, 1, b"\x00\x00\x00\x01")
                       + _frame(PRIORITY, 0, 7, b"\x00\x00\x00\x00\x10") + _call(encoder, 3))
    assert len(started) == 2 and not any(kind == GOAWAY for kind, _, _ in transport.frames())
    assert not transport.closed


def test_a_reset_of_the_wrong_length_is_a_frame_size_error():
    conn, transport, _, encoder = _open()
    conn.data_received(_call(encoder, 1) + _frame(RST_STREAM, 0, 1, b"\x00\x00\x08"))
    goaways = [p for k, _, p in transport.frames() if k == GOAWAY]
    assert goaways and _code(goaways[0], 4) == 0x6 and transport.closed
